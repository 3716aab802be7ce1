// The codec's arithmetic: the steps of docs/numerics.md that host/model/kernels.py does, bit
// for bit, written so that the compiler vectorises them: no branches on data in the hot loops,
// the transform on vector types, and quantize / the decoder's division and float conversion
// through the FPU where that is provably exact, quantize in float32 where that is (the integer
// loops of the model remain for the cases where it is not: flush-to-zero modes, exponents
// beyond +-512).
#include "codec.hpp"
#include "clones.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#define OR_INLINE inline __attribute__((always_inline))

namespace optireduce {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

void check_block(int b, size_t n) {
    if (b < 1 || b > MAX_BLOCK || !is_pow2(b))
        bad("block size b must be a power of two in 1..65536, got " + std::to_string(b));
    if (n % static_cast<size_t>(b))
        bad("length " + std::to_string(n) + " is not a multiple of the block size b = " +
            std::to_string(b));
}

// Per-thread scratch of one block: the transform of one block stays in L1/L2. t64 and v hold
// b int64 each, t32 b int32, signs b bytes (one sign bit per element).
struct Scratch {
    int64_t* t64;
    int64_t* v;
    int32_t* t32;
    uint8_t* signs;
};
Scratch scratch(size_t b) {
    thread_local std::vector<int64_t> buf;
    const size_t words = 2 * b + (b + 1) / 2 + (b + 7) / 8;
    if (buf.size() < words) buf.resize(words);
    int64_t* base = buf.data();
    return {base, base + b, reinterpret_cast<int32_t*>(base + 2 * b),
            reinterpret_cast<uint8_t*>(base + 2 * b + (b + 1) / 2)};
}

// ------------------------------------------------------------------ float32 -> fixed

// quantize_bits' element step, branch-free: one shift expression covers both directions
// (left by ls when the exponent difference is >= 0, else round half up and right by rs).
OR_INLINE int64_t quantize_one(uint32_t bits, int64_t exponent, int64_t q_max, int64_t& sat,
                               int64_t& nonfinite) {
    const int64_t ef = (bits >> 23) & 0xFF;
    const int64_t frac = bits & 0x7FFFFF;
    const int64_t mant = ef ? (frac | (int64_t{1} << 23)) : frac;
    const int64_t e2 = ef ? ef - 150 : -149;
    const int64_t shift = e2 - exponent;
    const int64_t ls = std::clamp<int64_t>(shift, 0, 38);
    const int64_t rs = std::clamp<int64_t>(-shift, 0, 40);
    int64_t mag = ((mant << ls) + ((int64_t{1} << rs) >> 1)) >> rs;
    const bool special = ef == 0xFF;
    nonfinite += special;
    mag = special ? (frac == 0 ? q_max + 1 : 0) : mag;  // inf saturates, NaN -> 0
    sat += mag > q_max;
    mag = mag > q_max ? q_max : mag;
    return (bits >> 31) ? -mag : mag;
}

// The model's loop on the bit fields. s: per-element extra negation (the random signs), or null.
template <class Q>
OR_INLINE QuantizeCounts quantize_loop(const float* __restrict x, size_t n, int64_t exponent,
                                       int64_t q_max, const uint8_t* __restrict s,
                                       Q* __restrict q) {
    int64_t sat = 0, nonfinite = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, 4);
        const int64_t v = quantize_one(bits, exponent, q_max, sat, nonfinite);
        q[i] = static_cast<Q>(s && s[i] ? -v : v);
    }
    return {sat, nonfinite};
}

// The same values through the FPU, which vectorises: |x| 2^-E is exact in double (|E| <= 512),
// and floor(a + 1/2) is the model's round half up (a + 1/2 is exact below 2^52, and anything
// above saturates). NaN -> 0, inf saturates. Valid with the default MXCSR only (DAZ would read
// subnormal inputs as zero): checked by the caller.
template <class Q>
OR_INLINE QuantizeCounts quantize_fpu(const float* __restrict x, size_t n, double scale,
                                      int64_t q_max, const uint8_t* __restrict s,
                                      Q* __restrict q) {
    const double qm = static_cast<double>(q_max);
    int64_t sat = 0, nonfinite = 0;
    for (size_t i = 0; i < n; ++i) {
        const double a = std::fabs(static_cast<double>(x[i])) * scale;
        const bool nan = a != a;
        nonfinite += nan | (a == HUGE_VAL);
        double m = std::floor(a + 0.5);
        const bool over = m > qm;
        sat += over;
        m = over ? qm : m;
        m = nan ? 0.0 : m;
        const bool neg = std::signbit(x[i]) != (s && s[i]);
        q[i] = static_cast<Q>(neg ? -m : m);  // -0.0 converts to 0
    }
    return {sat, nonfinite};
}

// The same values through float32 (16 lanes, no conversion to double). Exact for a scale 2^-E
// that is a normal float and q_max < 2^30. With x = mant 2^e2 (mant < 2^24):
// - the product P = mant 2^(e2 - E) is exact when 2^-126 <= P < 2^128 (a normal float holds 24
//   bits). Below 2^-126 the rounded product stays below 1/2 and quantizes to 0, as P does; at
//   2^128 and above it is inf, which saturates, as P does.
// - a is clamped to 2^30 (> q_max: anything there saturates either way), so t = trunc(a) =
//   floor(a) fits an int32, float(t) is exact (t < 2^24, or a >= 2^23 is an integer) and a - t
//   is exact (Sterbenz: t >= a / 2 when a >= 1). t + (a - t >= 1/2) is then floor(a + 1/2),
//   the model's round half up. (floor(a + 0.5f) is not: a = 1/2 - 2^-25 rounds a + 0.5f up to 1.)
// NaN -> 0 and inf counted from the input's bits (a finite x may overflow the product).
// Rounding mode and FTZ do not matter; DAZ would read subnormal inputs as 0: the caller checks.
template <class Q>
OR_INLINE QuantizeCounts quantize_f32(const float* __restrict x, size_t n, float scale,
                                      int32_t q_max, const uint8_t* __restrict s,
                                      Q* __restrict q) {
    int32_t sat = 0, nonfinite = 0;  // n <= F32_CHUNK: no overflow, and 16 lanes of counts
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, 4);
        const uint32_t mag = bits & 0x7FFFFFFFu;
        nonfinite += mag >= 0x7F800000u;
        float a = std::fabs(x[i]) * scale;
        a = mag > 0x7F800000u ? 0.0f : a;  // NaN
        a = a < 0x1p30f ? a : 0x1p30f;
        const int32_t t = static_cast<int32_t>(a);
        int32_t m = t + (a - static_cast<float>(t) >= 0.5f);
        sat += m > q_max;
        m = m > q_max ? q_max : m;
        const bool neg = (bits >> 31) != (s && s[i]);
        q[i] = static_cast<Q>(neg ? -m : m);
    }
    return {sat, nonfinite};
}

constexpr size_t F32_CHUNK = size_t{1} << 30;  // elements per quantize_f32 call (int32 counts)

// quantize_f32 over any n.
template <class Q>
OR_INLINE QuantizeCounts quantize_f32_n(const float* x, size_t n, int64_t exponent,
                                        int64_t q_max, const uint8_t* s, Q* q) {
    const float scale = std::ldexp(1.0f, static_cast<int>(-exponent));
    QuantizeCounts c;
    for (size_t o = 0; o < n; o += F32_CHUNK) {
        const size_t m = std::min(n - o, F32_CHUNK);
        const QuantizeCounts k = quantize_f32(x + o, m, scale, static_cast<int32_t>(q_max),
                                              s ? s + o : nullptr, q + o);
        c.saturated += k.saturated;
        c.nonfinite += k.nonfinite;
    }
    return c;
}

bool fpu_default_mode() {
#if defined(__x86_64__)
    // rounding control bits 13-14 = 0 (nearest), FTZ (bit 15) and DAZ (bit 6) clear;
    // torch.set_flush_denormal(True) sets FTZ/DAZ, and then the exact integer paths run.
    return (_mm_getcsr() & 0xE040u) == 0;
#else
    return std::fegetround() == FE_TONEAREST;
#endif
}

constexpr int FPU_EXPONENT_RANGE = 512;  // |E| for which 2^E scaling stays exact in double

bool fpu_ok(int64_t exponent) {
    return exponent >= -FPU_EXPONENT_RANGE && exponent <= FPU_EXPONENT_RANGE && fpu_default_mode();
}

// quantize_f32's conditions: 2^-E a normal float, q_max below its clamp, the default MXCSR.
bool f32_ok(int64_t exponent, int64_t q_max) {
    return exponent >= -127 && exponent <= 126 && q_max < (int64_t{1} << 30) && fpu_default_mode();
}

OR_CLONES QuantizeCounts quantize_i32(const float* __restrict x, size_t n, int64_t exponent,
                                      int64_t q_max, const uint8_t* __restrict s,
                                      int32_t* __restrict q) {
    if (f32_ok(exponent, q_max)) return quantize_f32_n(x, n, exponent, q_max, s, q);
    if (fpu_ok(exponent))
        return quantize_fpu(x, n, std::ldexp(1.0, static_cast<int>(-exponent)), q_max, s, q);
    return quantize_loop(x, n, exponent, q_max, s, q);
}

OR_CLONES QuantizeCounts quantize_i64(const float* __restrict x, size_t n, int64_t exponent,
                                      int64_t q_max, int64_t* __restrict q) {
    if (f32_ok(exponent, q_max))
        return quantize_f32_n(x, n, exponent, q_max, static_cast<const uint8_t*>(nullptr), q);
    if (fpu_ok(exponent))
        return quantize_fpu(x, n, std::ldexp(1.0, static_cast<int>(-exponent)), q_max,
                            static_cast<const uint8_t*>(nullptr), q);
    return quantize_loop(x, n, exponent, q_max, static_cast<const uint8_t*>(nullptr), q);
}

OR_CLONES uint32_t max_finite_magnitude(const float* __restrict x, size_t n) {
    // branch-free (a mask, not a select): the compiler vectorises the max reduction, so the
    // scan runs at memory speed
    uint32_t top = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, 4);
        const uint32_t mag = bits & 0x7FFFFFFFu;
        const uint32_t m = mag & (0u - static_cast<uint32_t>(mag < 0x7F800000u));  // inf, NaN: 0
        top = std::max(top, m);
    }
    return top;
}

// ------------------------------------------------------------------ fixed -> float32

// dequantize_bits' element step, exactly as the model writes it (priority encoder, keep 24
// bits with ties to even, assemble the fields). The fallback of dequantize_range.
int64_t dequantize_exact(const int64_t* v, size_t n, int64_t exponent, float* out) {
    int64_t saturated = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t x = v[i];
        const int64_t m = x < 0 ? -x : x;
        if (m == 0) {
            out[i] = 0.0f;
            continue;
        }
        const int64_t length = 64 - __builtin_clzll(static_cast<uint64_t>(m));
        int64_t u = std::max<int64_t>(length - 24 + exponent, -149);
        const int64_t k = u - exponent;
        int64_t kept;
        if (k > 0) {
            const int64_t kr = std::min<int64_t>(k, 62);
            int64_t q = m >> kr;
            const int64_t rem = m - (q << kr);
            const int64_t half = int64_t{1} << (kr - 1);
            if (rem > half || (rem == half && (q & 1))) ++q;
            kept = q;
        } else {
            kept = m << std::min<int64_t>(-k, 62);
        }
        if (kept >= int64_t{1} << 24) {
            kept >>= 1;
            ++u;
        }
        int64_t bits = ((u + 149) << 23) + kept;
        if (bits > FLT_MAX_BITS) {
            ++saturated;
            bits = FLT_MAX_BITS;
        }
        const uint32_t b32 = static_cast<uint32_t>(bits) | (x < 0 ? 0x80000000u : 0u);
        std::memcpy(out + i, &b32, 4);
    }
    return saturated;
}

// The same result through the FPU: |v| < 2^53 and |E| <= 512 make double(v) * 2^E exact, and
// one IEEE conversion to float32 rounds it to nearest, ties to even, subnormals included; a
// float32 overflow (inf) is exactly the model's "rounded above FLT_MAX". Valid only with the
// default MXCSR (round to nearest, no flush-to-zero / denormals-are-zero): checked by the caller.
OR_CLONES int64_t dequantize_fpu(const int64_t* __restrict v, size_t n, double scale,
                                 float* __restrict out) {
    int64_t saturated = 0;
    for (size_t i = 0; i < n; ++i) {
        float f = static_cast<float>(static_cast<double>(v[i]) * scale);
        const bool over = std::fabs(f) > 3.40282346638528859812e+38f;
        saturated += over;
        f = over ? std::copysign(3.40282346638528859812e+38f, f) : f;
        out[i] = f;
    }
    return saturated;
}

int64_t dequantize_range(const int64_t* v, size_t n, int exponent, float* out) {
    if (fpu_ok(exponent))
        return dequantize_fpu(v, n, std::ldexp(1.0, exponent), out);
    return dequantize_exact(v, n, exponent, out);
}

// ------------------------------------------------------------------ Speck32/64 signs

OR_INLINE uint32_t speck_word(const uint16_t* rk, uint32_t ctr) {
    uint16_t x = static_cast<uint16_t>(ctr >> 16), y = static_cast<uint16_t>(ctr);
    for (int j = 0; j < SPECK_ROUNDS; ++j) {
        x = static_cast<uint16_t>((static_cast<uint16_t>((x >> 7) | (x << 9)) + y) ^ rk[j]);
        y = static_cast<uint16_t>(static_cast<uint16_t>((y << 2) | (y >> 14)) ^ x);
    }
    return (uint32_t{x} << 16) | y;
}

// words[c] = sign word of counter ctr0 + c: independent cipher calls, vectorised across c.
OR_CLONES void sign_words(const uint16_t* __restrict rk, uint32_t ctr0, size_t count,
                          uint32_t* __restrict words) {
    uint16_t k[SPECK_ROUNDS];
    std::memcpy(k, rk, sizeof k);
    for (size_t c = 0; c < count; ++c) words[c] = speck_word(k, ctr0 + static_cast<uint32_t>(c));
}

// out[i] = -v[i] where bit (start + i) of the sign stream is 1; start a multiple of 32.
template <class T>
OR_INLINE void negate_by_words(const uint32_t* __restrict words, const T* v, size_t n, T* out) {
    using U = std::make_unsigned_t<T>;  // wraps like the model's int64 (-INT64_MIN too)
    for (size_t i = 0; i < n; ++i) {
        const U s = U{0} - ((words[i >> 5] >> (i & 31)) & 1);  // 0 or all ones
        out[i] = static_cast<T>((static_cast<U>(v[i]) ^ s) - s);
    }
}

OR_CLONES void negate_i64(const uint32_t* __restrict words, const int64_t* v, size_t n,
                          int64_t* out) {
    negate_by_words(words, v, n, out);
}

OR_CLONES void negate_i32(const uint32_t* __restrict words, const int32_t* v, size_t n,
                          int32_t* out) {
    negate_by_words(words, v, n, out);
}

constexpr size_t WORDS_PER_RUN = 256;  // signs of 8192 elements per batch of cipher calls

// s[j] = bit j mod 32 of words[j / 32], j < n
OR_CLONES void expand_words(const uint32_t* __restrict words, size_t n, uint8_t* __restrict s) {
    size_t w = 0;
    for (; 32 * (w + 1) <= n; ++w) {
        const uint32_t word = words[w];
        for (int l = 0; l < 32; ++l) s[32 * w + l] = static_cast<uint8_t>((word >> l) & 1);
    }
    for (size_t j = 32 * w; j < n; ++j) s[j] = static_cast<uint8_t>((words[w] >> (j & 31)) & 1);
}

template <class T, class Neg>
void apply_signs_t(const SignKey& k, uint64_t start, const T* v, size_t n, T* out, Neg neg) {
    uint32_t words[WORDS_PER_RUN + 1];
    size_t j = 0;
    // an unaligned start: the first partial word element by element
    while (j < n && ((start + j) & 31)) {
        const uint64_t e = start + j;
        const uint32_t w = speck_word(k.rk, static_cast<uint32_t>(e >> 5));
        using U = std::make_unsigned_t<T>;
        out[j] = ((w >> (e & 31)) & 1) ? static_cast<T>(U{0} - static_cast<U>(v[j])) : v[j];
        ++j;
    }
    while (j < n) {
        const size_t m = std::min(n - j, WORDS_PER_RUN * 32);
        sign_words(k.rk, static_cast<uint32_t>((start + j) >> 5), (m + 31) / 32, words);
        neg(words, v + j, m, out + j);
        j += m;
    }
}

// ------------------------------------------------------------------ Walsh-Hadamard

// The transform works on 64-byte vectors (GCC/Clang vector extensions: one zmm with AVX-512,
// two ymm with AVX2, four xmm with SSE): 8 int64 or 16 int32 lanes. A 64-element tile does the
// strides inside a vector with a lane permute and an add of the conditionally negated vector,
// and the strides across its vectors with plain adds; the strides >= 64 are radix-8 passes over whole vectors
// that load all 8 before storing, so 3 stages run in registers. A 4096-element block is 3
// passes over L1; a larger one is transformed 4096 elements at a time, then across them.
//
// Each stage adds one bit. While max|x| 2^s < 2^31 the first s stages are exact in int32, which
// holds twice the lanes: the encoder's input (|q| <= q_max < 2^(31-h), h the headroom bits)
// runs its first h stages in int32, sub-block by sub-block in L1 (encoder_split), and the rest
// in one pass that widens to int64 and saturates to the wire on the way out (or stays int32
// when its inputs show that nothing can clamp), so no int64 reaches memory. Otherwise (other
// widths, the decoder's wire values) everything is int64.
using V8 = int64_t __attribute__((vector_size(64)));
using V16 = int32_t __attribute__((vector_size(64)));
template <class T>
struct VecOf;
template <>
struct VecOf<int64_t> {
    using type = V8;
};
template <>
struct VecOf<int32_t> {
    using type = V16;
};
template <class T>
using Vec = typename VecOf<T>::type;
using V8n = int32_t __attribute__((vector_size(32)));    // 8 lanes narrowed
template <class T>
constexpr size_t LANES = 64 / sizeof(T);
constexpr size_t TILE = 64;

template <class T>
OR_INLINE Vec<T> vload(const T* p) {
    Vec<T> v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <class V, class T>
OR_INLINE void vstore(T* p, V v) {
    std::memcpy(p, &v, sizeof v);
}
// 8 int32 elements sign-extended to int64 on load: no separate widening pass.
OR_INLINE V8 load_widen8(const int32_t* p) {
    V8n v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, V8);
}

// Butterfly of stride H between the lanes of one vector:
// out[j] = v[j ^ H] + (bit H of j ? -v[j] : v[j]).
template <int H, class V, size_t... I>
OR_INLINE V lane_stage(V v, std::index_sequence<I...>) {
    const V partner = __builtin_shufflevector(v, v, (I ^ H)...);
    const V neg = {((I & H) ? -1 : 0)...};
    // not `neg ? partner - v : partner + v` (an add and a masked subtract with AVX-512): a
    // select on 64-byte vectors is scalarised for AVX2 and SSE, 4x slower there
    return partner + ((v ^ neg) - neg);
}

// All stages of strides 1 .. lanes/2 inside one vector.
template <class T>
OR_INLINE Vec<T> lane_stages(Vec<T> v) {
    using Seq = std::make_index_sequence<LANES<T>>;
    v = lane_stage<4>(lane_stage<2>(lane_stage<1>(v, Seq{}), Seq{}), Seq{});
    if constexpr (LANES<T> == 16) v = lane_stage<8>(v, Seq{});
    return v;
}

// All radix-2 stages across R vectors (element-wise, no shuffles).
template <int R, class V>
OR_INLINE void butterflies(V* v) {
#pragma GCC unroll 16
    for (int h = 1; h < R; h *= 2)
#pragma GCC unroll 16
        for (int i = 0; i < R; i += 2 * h)
#pragma GCC unroll 16
            for (int j = i; j < i + h; ++j) {
                const V a = v[j], c = v[j + h];
                v[j] = a + c;
                v[j + h] = a - c;
            }
}

// y[0 .. NV LANES) = H x[0 .. NV LANES), in working type W (x: int32 or W).
template <class W, int NV, class T>
OR_INLINE void tile(const T* x, W* y) {
    Vec<W> v[NV];
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
        if constexpr (std::is_same_v<T, W>)
            v[k] = lane_stages<W>(vload(x + LANES<W> * k));
        else
            v[k] = lane_stages<W>(load_widen8(x + LANES<W> * k));
    }
    butterflies<NV>(v);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) vstore(y + LANES<W> * k, v[k]);
}

// Radix-R butterflies at stride h (a multiple of the lanes) over y[0 .. b), in place.
template <int R, class W>
OR_INLINE void pass(W* y, size_t b, size_t h) {
    for (size_t i = 0; i < b; i += R * h)
        for (size_t j = i; j < i + h; j += LANES<W>) {
            Vec<W> v[R];
#pragma GCC unroll 16
            for (int k = 0; k < R; ++k) v[k] = vload(y + j + k * h);
            butterflies<R>(v);
#pragma GCC unroll 16
            for (int k = 0; k < R; ++k) vstore(y + j + k * h, v[k]);
        }
}

// The last pass of the int32 path: radix R at stride h over t (int32), widened to int64 in
// registers, written to y as int64 (exact) or as int32 clamped to +-limit (counted in over).
template <int R, class Out>
OR_INLINE void pass_widen(const int32_t* t, size_t b, size_t h, Out* y, int64_t limit,
                          int64_t& over) {
    const V8 hi_lim = V8{} + limit, lo_lim = V8{} - limit;
    V8 count{};
    for (size_t i = 0; i < b; i += R * h)
        for (size_t j = i; j < i + h; j += LANES<int64_t>) {
            V8 v[R];
#pragma GCC unroll 16
            for (int k = 0; k < R; ++k) v[k] = load_widen8(t + j + k * h);
            butterflies<R>(v);
#pragma GCC unroll 16
            for (int k = 0; k < R; ++k) {
                if constexpr (std::is_same_v<Out, int64_t>) {
                    vstore(y + j + k * h, v[k]);
                } else {
                    // clamp with shifts and masks (|v| < 2^62): vector compares on
                    // 64-bit lanes are scalarised by some compilers
                    const V8 hi = (hi_lim - v[k]) >> 63, lo = (v[k] - lo_lim) >> 63;  // -1: out
                    count += hi | lo;
                    V8 c = v[k] ^ ((v[k] ^ hi_lim) & hi);
                    c ^= (c ^ lo_lim) & lo;
                    vstore(y + j + k * h, __builtin_convertvector(c, V8n));
                }
            }
        }
    for (size_t l = 0; l < LANES<int64_t>; ++l) over -= count[l];
}

// Passes for `stages` radix-2 stages: radix 8 while 3 remain, then one of 4 or 2.
// Returns the number of passes; radix[k] is the k-th.
int plan_passes(int stages, int* radix) {
    int rest = stages, n = 0;
    for (; rest >= 3; rest -= 3) radix[n++] = 8;
    if (rest) radix[n++] = 1 << rest;
    return n;
}

// The passes after the 64-element tile of a block of b.
int plan_passes(size_t b, int* radix) { return plan_passes(__builtin_ctzll(b) - 6, radix); }

template <class W>
OR_INLINE void pass_r(int r, W* y, size_t b, size_t h) {
    if (r == 16)
        pass<16>(y, b, h);
    else if (r == 8)
        pass<8>(y, b, h);
    else if (r == 4)
        pass<4>(y, b, h);
    else
        pass<2>(y, b, h);
}

// b in 1..4: scalar radix-2.
template <class T>
void fwht_tiny(const T* x, size_t n, size_t b, int64_t* y) {
    for (size_t i = 0; i < n; ++i) y[i] = x[i];
    for (size_t h = 1; h < b; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; ++j) {
                const int64_t a = y[j], c = y[j + h];
                y[j] = a + c;
                y[j + h] = a - c;
            }
}

// The next block's (or sub-block's) lines, requested (into L2) a tile at a time while this one
// computes: a block is loaded, transformed in L1 and stored before the next, and the hardware
// prefetcher alone does not run a whole block ahead (nor past a 4 KiB page): +10 % for the
// transform streaming from DRAM. Prefetches never fault, so a short last block needs no care.
struct Ahead {
    const void* x = nullptr;  // the next block's input
    const void* y = nullptr;  // its output (fetched for writing)
    size_t x_size = 4, y_size = 4;  // bytes per element
};

OR_INLINE void prefetch_tile(const Ahead& a, size_t o) {
    const char* x = static_cast<const char*>(a.x);
    const char* y = static_cast<const char*>(a.y);
    if (x)
        for (size_t l = 0; l < TILE * a.x_size; l += 64) __builtin_prefetch(x + o * a.x_size + l, 0, 1);
    if (y)
        for (size_t l = 0; l < TILE * a.y_size; l += 64) __builtin_prefetch(y + o * a.y_size + l, 1, 1);
}

// int64 elements of a sub-block transformed in L1 (32 KiB of the 48) before the stages
// across sub-blocks: a larger block would go through L2 at every pass.
constexpr size_t L1_BLOCK64 = 4096;

// y = H_b x for one block in int64 (x == y allowed: every tile is loaded before it is
// stored). Blocks above L1_BLOCK64: each sub-block's stages first, then the stages across.
template <class T>
OR_INLINE void fwht_block64(const T* x, size_t b, int64_t* y, const Ahead& ahead = {}) {
    if (b < 8) return fwht_tiny(x, b, b, y);
    if (b == 8) return tile<int64_t, 1>(x, y);
    if (b == 16) return tile<int64_t, 2>(x, y);
    if (b == 32) return tile<int64_t, 4>(x, y);
    const size_t sub = std::min(b, L1_BLOCK64);
    int radix[8];
    const int np = plan_passes(sub, radix);
    for (size_t s = 0; s < b; s += sub) {
        for (size_t o = s; o < s + sub; o += TILE) {
            prefetch_tile(ahead, o);
            tile<int64_t, 8>(x + o, y + o);
        }
        size_t h = TILE;
        for (int k = 0; k < np; h *= static_cast<size_t>(radix[k]), ++k)
            pass_r(radix[k], y + s, sub, h);
    }
    const int nq = plan_passes(__builtin_ctzll(b / sub), radix);
    size_t h = sub;
    for (int k = 0; k < nq; h *= static_cast<size_t>(radix[k]), ++k) pass_r(radix[k], y, b, h);
}

// max |x[i]| (exact: |INT32_MIN| = 2^31 fits the uint32)
OR_INLINE uint32_t max_abs_loop(const int32_t* __restrict x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t a = x[i] < 0 ? 0u - static_cast<uint32_t>(x[i]) : static_cast<uint32_t>(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

// The int32 path for one block, b >= 128: tile and all passes but the last in int32 (in t, b
// elements; for int32 output in y itself), the last one widening into y. When every input of
// the last pass is within limit / radix, its outputs are within limit: then it runs in int32
// too and nothing is clamped (the usual case: the transform spreads a block's energy evenly).
// The caller has checked the bound that makes the int32 stages exact.
template <class Out>
OR_INLINE void fwht_block32(const int32_t* x, size_t b, int32_t* t, Out* y, int64_t limit,
                            int64_t& over, const Ahead& ahead = {}) {
    if constexpr (std::is_same_v<Out, int32_t>) t = y;
    for (size_t o = 0; o < b; o += TILE) {
        prefetch_tile(ahead, o);
        tile<int32_t, 4>(x + o, t + o);
    }
    int radix[8];
    const int np = plan_passes(b, radix);
    size_t h = TILE;
    for (int k = 0; k + 1 < np; h *= static_cast<size_t>(radix[k]), ++k)
        pass_r(radix[k], t, b, h);
    const int last = radix[np - 1];
    if constexpr (std::is_same_v<Out, int32_t>) {
        if (max_abs_loop(t, b) <= static_cast<uint64_t>(limit) / static_cast<uint64_t>(last)) {
            pass_r(last, t, b, h);
            return;
        }
    }
    switch (last) {
        case 8: pass_widen<8>(t, b, h, y, limit, over); break;
        case 4: pass_widen<4>(t, b, h, y, limit, over); break;
        default: pass_widen<2>(t, b, h, y, limit, over); break;
    }
}

// Stages of the int32 path before its widening pass.
int int32_stages(size_t b) {
    int radix[8];
    const int np = plan_passes(b, radix);
    return __builtin_ctzll(b) - __builtin_ctzll(static_cast<uint64_t>(radix[np - 1]));
}

OR_CLONES uint32_t max_abs_i32(const int32_t* __restrict x, size_t n) { return max_abs_loop(x, n); }

// True when the int32 path is exact for a block of b elements bounded by max_abs.
bool int32_path_ok(size_t b, uint64_t max_abs) {
    return b >= 128 && (max_abs << int32_stages(b)) <= 0x7FFFFFFFu;
}

OR_CLONES void fwht_blocks_i64(const int64_t* x, size_t n, size_t b, int64_t* y) {
    for (size_t o = 0; o < n; o += b)
        fwht_block64(x + o, b, y + o, o + b < n ? Ahead{x + o + b, y + o + b, 8, 8} : Ahead{});
}

// Exact transform of int32 input: per block, the int32 path when its bound allows (t: b int32
// of scratch; null: always int64). after: what to prefetch during the last block.
OR_CLONES void fwht_blocks_i32(const int32_t* x, size_t n, size_t b, int64_t* y, int32_t* t,
                               const Ahead& after) {
    int64_t unused = 0;
    for (size_t o = 0; o < n; o += b) {
        const Ahead next = o + b < n ? Ahead{x + o + b, y + o + b, 4, 8} : after;
        if (t && int32_path_ok(b, max_abs_i32(x + o, b)))
            fwht_block32(x + o, b, t, y + o, 0, unused, next);
        else
            fwht_block64(x + o, b, y + o, next);
    }
}

// clamp to +-limit, narrow to int32 (limit < 2^31), count the clamps
OR_CLONES int64_t saturate_narrow(const int64_t* __restrict t, size_t n, int64_t limit,
                                  int32_t* __restrict y) {
    int64_t over = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t v = t[i];
        over += (v > limit) | (v < -limit);
        y[i] = static_cast<int32_t>(std::clamp(v, -limit, limit));
    }
    return over;
}

// The saturating transform of blocks bounded by max_abs (< 0: measure each block).
// x == y allowed. t32: b int32, t64: b int64 of scratch. after: what to prefetch during the
// last block.
OR_CLONES int64_t fwht_saturate_blocks(const int32_t* x, size_t n, size_t b, int64_t limit,
                                       int64_t max_abs, int32_t* y, int32_t* t32,
                                       int64_t* t64, const Ahead& after) {
    int64_t over = 0;
    for (size_t o = 0; o < n; o += b) {
        const Ahead next = o + b < n ? Ahead{x + o + b, y + o + b, 4, 4} : after;
        const uint64_t m = max_abs >= 0 ? static_cast<uint64_t>(max_abs) : max_abs_i32(x + o, b);
        if (int32_path_ok(b, m)) {
            fwht_block32(x + o, b, t32, y + o, limit, over, next);
        } else {
            fwht_block64(x + o, b, t64);
            over += saturate_narrow(t64, b, limit, y + o);
        }
    }
    return over;
}

// The encoder's transform split at its headroom: q_max 2^S < 2^31 makes the first S stages
// exact in int32 whatever the data, so they run per sub-block of 2^S elements, in L1, right
// after the sub-block is quantized (fwht_sub32); the other R stages are one pass across the
// sub-blocks (fwht_across32). encoder_split returns S, or 0 where this does not apply (the
// block too small for a tile per sub-block, R = 0: nothing can saturate, R > 4: too many
// vectors for one pass): then fwht_saturate_blocks does the block.
int encoder_split(size_t b, int64_t q_max) {
    const int lb = __builtin_ctzll(b);
    int s = 0;
    while (s < lb && (q_max << (s + 1)) <= 0x7FFFFFFF) ++s;
    const int r = lb - s;
    return s >= 6 && r >= 1 && r <= 4 ? s : 0;
}

// The first log2(sub) stages of y[0 .. sub) in int32, in place; returns max |y|. ahead: the
// next sub-block's input and output (a sub-block is one 4 KiB page at b = 16384, and the
// hardware prefetcher stops at each page's end).
OR_CLONES uint32_t fwht_sub32(int32_t* y, size_t sub, const Ahead& ahead) {
    for (size_t o = 0; o < sub; o += TILE) {
        prefetch_tile(ahead, o);
        tile<int32_t, 4>(y + o, y + o);
    }
    int radix[8];
    const int np = plan_passes(sub, radix);
    size_t h = TILE;
    for (int k = 0; k < np; h *= static_cast<size_t>(radix[k]), ++k) pass_r(radix[k], y, sub, h);
    return max_abs_loop(y, sub);
}

// The stages across the b / sub (2..16) sub-blocks of y, in place, saturated to +-limit:
// widened to int64, or in int32 when top (max |y|) times the radix cannot reach limit.
// Returns the count clamped.
OR_CLONES int64_t fwht_across32(int32_t* y, size_t b, size_t sub, int64_t limit, uint64_t top) {
    const size_t r = b / sub;
    if (top <= static_cast<uint64_t>(limit) / r) {
        pass_r(static_cast<int>(r), y, b, sub);
        return 0;
    }
    int64_t over = 0;
    switch (r) {
        case 16: pass_widen<16>(y, b, sub, y, limit, over); break;
        case 8: pass_widen<8>(y, b, sub, y, limit, over); break;
        case 4: pass_widen<4>(y, b, sub, y, limit, over); break;
        default: pass_widen<2>(y, b, sub, y, limit, over); break;
    }
    return over;
}

// v[i] = div_round(t[i], d) for d > 0 while every |t| < 2^51; returns false (v then holds
// garbage) when some |t| is not, and the caller divides exactly: the bound is checked in the
// same pass. A power of two divides by a shift; otherwise the quotient through double is
// within one of the exact one (2|t| + d < 2^53 is exact in double) and one correction step
// makes it exact. Magnitudes are clamped to the bound first, so a larger t is no overflow.
// Branch-free on unsigned words, so that it vectorises: s = 0 or all ones (x < 0).
OR_INLINE uint64_t sign_mask(int64_t x) { return 0 - (static_cast<uint64_t>(x) >> 63); }
OR_INLINE uint64_t apply_sign(uint64_t m, uint64_t s) { return (m ^ s) - s; }

template <class T>
OR_INLINE bool div_round_loop(const int64_t* __restrict t, size_t n, int64_t d,
                              T* __restrict v) {
    constexpr uint64_t BOUND = uint64_t{1} << 51;
    uint64_t big = 0;
    if (is_pow2(d)) {
        const int sh = __builtin_ctzll(static_cast<uint64_t>(d));
        const uint64_t half = static_cast<uint64_t>(d) >> 1;  // (m + floor(d/2)) >> log2 d
        for (size_t i = 0; i < n; ++i) {
            const uint64_t s = sign_mask(t[i]);
            uint64_t m = apply_sign(static_cast<uint64_t>(t[i]), s);
            big |= m >> 51;
            m = m < BOUND ? m : BOUND;
            v[i] = static_cast<T>(apply_sign((m + half) >> sh, s));
        }
        return !big;
    }
    const int64_t two_d = 2 * d;
    const double inv = 1.0 / static_cast<double>(two_d);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t s = sign_mask(t[i]);
        uint64_t m = apply_sign(static_cast<uint64_t>(t[i]), s);
        big |= m >> 51;
        m = m < BOUND ? m : BOUND;
        const int64_t a = static_cast<int64_t>(2 * m) + d;
        int64_t q = static_cast<int64_t>(static_cast<double>(a) * inv);
        const int64_t r = a - q * two_d;
        q += (r >= two_d) - (r < 0);
        v[i] = static_cast<T>(apply_sign(static_cast<uint64_t>(q), s));
    }
    return !big;
}

OR_CLONES bool div_round_block(const int64_t* __restrict t, size_t n, int64_t d,
                               int64_t* __restrict v) {
    return div_round_loop(t, n, d, v);
}

OR_CLONES bool div_round_block32(const int64_t* __restrict t, size_t n, int64_t d,
                                 int32_t* __restrict v) {
    return div_round_loop(t, n, d, v);
}

OR_CLONES bool any_abs_at_least(const int64_t* __restrict v, size_t n, int64_t lim) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) any |= (v[i] >= lim) | (v[i] <= -lim);
    return any;
}

// The decoder's per-element steps after the transform, in one pass through the FPU (which
// vectorises): q = div_round(t, d), negated where s says, times 2^E rounded to float32, clamped
// to +-FLT_MAX. Exact: |t| < 2^51 converts exactly (the 1.5 * 2^52 trick, no int64 -> double
// instruction needed), a = 2|t| + d < 2^53 and q * 2d are exact integers in double, the
// quotient through the reciprocal is within one and one correction step makes it exact, and
// q 2^E is exact before the one rounding to float32. Valid with the default MXCSR and
// |E| <= 512 (fpu_ok).
// The clamp to +-FLT_MAX, where the exponent lets a value reach it (see decode_fpu_pow2).
template <bool CLAMP>
OR_INLINE float clamp_flt_max(float f, int64_t& saturated) {
    if constexpr (!CLAMP) return f;
    constexpr float FMAX = 3.40282346638528859812e+38f;
    const bool over = std::fabs(f) > FMAX;
    saturated += over;
    return over ? std::copysign(FMAX, f) : f;
}

template <bool CLAMP>
OR_INLINE int64_t decode_fpu_loop(const int64_t* __restrict t, size_t n, int64_t d,
                                  const uint8_t* __restrict s, double scale,
                                  float* __restrict out) {
    const double dd = static_cast<double>(d), two_d = 2.0 * dd, inv = 1.0 / two_d;
    constexpr int64_t MAGIC_BITS = 0x4338000000000000;  // 1.5 * 2^52
    constexpr double MAGIC = 6755399441055744.0;
    int64_t saturated = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t bits = t[i] + MAGIC_BITS;
        double tv;
        std::memcpy(&tv, &bits, sizeof tv);
        tv -= MAGIC;  // == t[i]
        const double a = 2.0 * std::fabs(tv) + dd;
        double q = std::floor(a * inv);
        const double r = a - q * two_d;
        q = r < 0.0 ? q - 1.0 : q;
        q = r >= two_d ? q + 1.0 : q;
        const bool neg = (tv < 0.0) != (s[i] != 0);
        const float f = static_cast<float>((neg ? 0.0 - q : q) * scale);  // 0 - 0 = +0
        out[i] = clamp_flt_max<CLAMP>(f, saturated);
    }
    return saturated;
}

// clamp: false when no value can reach FLT_MAX (decode_blocks: |t| <= 2^31 b <= 2^47, so
// |q| 2^E <= 2^127 for E <= 80), which saves the clamp's three instructions per vector.
OR_CLONES int64_t decode_fpu(const int64_t* __restrict t, size_t n, int64_t d,
                             const uint8_t* __restrict s, double scale, bool clamp,
                             float* __restrict out) {
    return clamp ? decode_fpu_loop<true>(t, n, d, s, scale, out)
                 : decode_fpu_loop<false>(t, n, d, s, scale, out);
}

// decode_fpu for d = 2^k (the plain estimator; unbiased with every packet of the block): then
// |t| 2^-k + 1/2 = (|t| + 2^(k-1)) 2^-k is exact in double (|t| < 2^51, k <= 16), and its floor
// is the model's div_round without a correction step.
template <bool CLAMP>
OR_INLINE int64_t decode_pow2_loop(const int64_t* __restrict t, size_t n, int k,
                                   const uint8_t* __restrict s, double scale,
                                   float* __restrict out) {
    const double inv = std::ldexp(1.0, -k);
    constexpr int64_t MAGIC_BITS = 0x4338000000000000;  // 1.5 * 2^52, as in decode_fpu
    constexpr double MAGIC = 6755399441055744.0;
    int64_t saturated = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t bits = t[i] + MAGIC_BITS;
        double tv;
        std::memcpy(&tv, &bits, sizeof tv);
        tv -= MAGIC;  // == t[i]
        const double q = std::floor(std::fabs(tv) * inv + 0.5);
        const bool neg = (tv < 0.0) != (s[i] != 0);
        const float f = static_cast<float>((neg ? 0.0 - q : q) * scale);  // 0 - 0 = +0
        out[i] = clamp_flt_max<CLAMP>(f, saturated);
    }
    return saturated;
}

OR_CLONES int64_t decode_fpu_pow2(const int64_t* __restrict t, size_t n, int k,
                                  const uint8_t* __restrict s, double scale, bool clamp,
                                  float* __restrict out) {
    return clamp ? decode_pow2_loop<true>(t, n, k, s, scale, out)
                 : decode_pow2_loop<false>(t, n, k, s, scale, out);
}

}  // namespace

// ------------------------------------------------------------------ Params

int Params::log2_b() const { return 63 - __builtin_clzll(static_cast<uint64_t>(b)); }

size_t Params::padded_len(size_t n) const {
    const size_t bb = static_cast<size_t>(b);
    const size_t blocks = (n + bb - 1) / bb;
    return (blocks ? blocks : 1) * bb;
}

void Params::check() const {
    auto need = [](bool ok, const char* name, long long v, const char* msg) {
        if (!ok) bad(std::string("Params.") + name + "=" + std::to_string(v) + ": " + msg);
    };
    need(b >= 2 && b <= MAX_BLOCK && is_pow2(b), "b", b, "must be a power of two in 2..65536");
    need(p >= 1 && p <= b && b % p == 0, "p", p, "must divide b");
    need(w_wire == 32, "w_wire", w_wire, "UBT v1 carries 32-bit elements");
    need(headroom_bits >= 1 && headroom_bits <= std::min(log2_b(), 16), "headroom_bits",
         headroom_bits, "must be in 1..min(log2(b), 16)");
    need(estimator == Estimator::unbiased || estimator == Estimator::plain, "estimator",
         static_cast<int>(estimator), "must be unbiased (0) or plain (1)");
}

// ------------------------------------------------------------------ float32 <-> fixed

int propose_exponent(const float* x, size_t n, const Params& p) {
    const uint32_t m = max_finite_magnitude(x, n);
    if (m == 0) return 0;
    const int e_field = static_cast<int>(m >> 23);
    const uint32_t f = m & 0x7FFFFF;
    const int e = e_field ? e_field - 127 : (32 - __builtin_clz(f)) - 1 - 149;
    int exp = std::clamp(e + 2 - p.w_in(), EXP_MIN, EXP_MAX);
    if (exp < EXP_MAX) {  // did rounding reach 2^(w_in-1)?
        int64_t sat = 0, nonfinite = 0;
        quantize_one(m, exp, p.q_max(), sat, nonfinite);
        exp += sat != 0;
    }
    return exp;
}

QuantizeCounts quantize(const float* x, size_t n, int exponent, int64_t q_max, int32_t* q) {
    if (q_max < 0 || q_max >= (int64_t{1} << 31) - 1) bad("quantize: q_max must be in 0..2^31-2");
    return quantize_i32(x, n, exponent, q_max, nullptr, q);
}

QuantizeCounts quantize(const float* x, size_t n, int exponent, int64_t q_max, int64_t* q) {
    if (q_max < 0 || q_max >= (int64_t{1} << 62)) bad("quantize: q_max must be in 0..2^62-1");
    return quantize_i64(x, n, exponent, q_max, q);
}

int64_t dequantize(const int64_t* v, size_t n, int exponent, float* out) {
    if (any_abs_at_least(v, n, int64_t{1} << 53)) bad("dequantize: |v| must stay below 2^53");
    return dequantize_range(v, n, exponent, out);
}

// ------------------------------------------------------------------ signs

SignKey speck_key_schedule(uint16_t l2, uint16_t l1, uint16_t l0, uint16_t k0) {
    auto ror = [](uint16_t x, int r) { return static_cast<uint16_t>((x >> r) | (x << (16 - r))); };
    auto rol = [](uint16_t x, int r) { return static_cast<uint16_t>((x << r) | (x >> (16 - r))); };
    uint16_t ls[SPECK_ROUNDS + 2] = {l0, l1, l2};
    SignKey k{};
    k.rk[0] = k0;
    for (int i = 0; i < SPECK_ROUNDS - 1; ++i) {
        ls[i + 3] = static_cast<uint16_t>(static_cast<uint16_t>(k.rk[i] + ror(ls[i], 7)) ^ i);
        k.rk[i + 1] = static_cast<uint16_t>(rol(k.rk[i], 2) ^ ls[i + 3]);
    }
    return k;
}

SignKey sign_key(uint32_t seed, uint32_t op_id) {
    return speck_key_schedule(static_cast<uint16_t>(op_id >> 16), static_cast<uint16_t>(op_id),
                              static_cast<uint16_t>(seed >> 16), static_cast<uint16_t>(seed));
}

void speck_encrypt(const SignKey& k, uint16_t& x, uint16_t& y) {
    const uint32_t w = speck_word(k.rk, (uint32_t{x} << 16) | y);
    x = static_cast<uint16_t>(w >> 16);
    y = static_cast<uint16_t>(w);
}

uint32_t sign_word(const SignKey& k, uint32_t ctr) { return speck_word(k.rk, ctr); }

void sign_bits(const SignKey& k, uint64_t start, size_t n, uint8_t* out) {
    size_t j = 0;
    for (; j < n && ((start + j) & 31); ++j) {  // an unaligned start: the first partial word
        const uint64_t e = start + j;
        out[j] = static_cast<uint8_t>((speck_word(k.rk, static_cast<uint32_t>(e >> 5)) >> (e & 31)) & 1);
    }
    uint32_t words[WORDS_PER_RUN];
    while (j < n) {
        const size_t m = std::min(n - j, WORDS_PER_RUN * 32);
        sign_words(k.rk, static_cast<uint32_t>((start + j) >> 5), (m + 31) / 32, words);
        expand_words(words, m, out + j);
        j += m;
    }
}

void apply_signs(const SignKey& k, uint64_t start, const int64_t* v, size_t n, int64_t* out) {
    apply_signs_t(k, start, v, n, out, negate_i64);
}

void apply_signs(const SignKey& k, uint64_t start, const int32_t* v, size_t n, int32_t* out) {
    apply_signs_t(k, start, v, n, out, negate_i32);
}

// ------------------------------------------------------------------ transform

void fwht_blocks(const int32_t* x, size_t n, int b, int64_t* y) {
    check_block(b, n);
    fwht_blocks_i32(x, n, static_cast<size_t>(b), y, scratch(static_cast<size_t>(b)).t32, {});
}

void fwht_blocks(const int64_t* x, size_t n, int b, int64_t* y) {
    check_block(b, n);
    fwht_blocks_i64(x, n, static_cast<size_t>(b), y);
}

int64_t fwht_saturate(const int32_t* x, size_t n, int b, int64_t limit, int32_t* y) {
    check_block(b, n);
    if (limit < 0 || limit > 0x7FFFFFFF) bad("fwht_saturate: limit must be in 0..2^31-1");
    const Scratch s = scratch(static_cast<size_t>(b));
    return fwht_saturate_blocks(x, n, static_cast<size_t>(b), limit, -1, y, s.t32, s.t64, {});
}

// ------------------------------------------------------------------ the mean

namespace {
template <class T>
void div_round_n_t(const int64_t* t, size_t n, int64_t d, T* out) {
    if (d < 1) bad("div_round: d must be >= 1, got " + std::to_string(d));
    bool done;
    if constexpr (std::is_same_v<T, int32_t>)
        done = div_round_block32(t, n, d, out);
    else
        done = div_round_block(t, n, d, out);
    if (done) return;
    for (size_t i = 0; i < n; ++i) {  // beyond the double path: exact integer division
        if (t[i] >= (int64_t{1} << 61) || t[i] <= -(int64_t{1} << 61))
            bad("div_round: |t| must stay below 2^61");
        out[i] = static_cast<T>(div_round(t[i], d));
    }
}
}  // namespace

void div_round_n(const int64_t* t, size_t n, int64_t d, int64_t* out) {
    div_round_n_t(t, n, d, out);
}

void div_round_n(const int64_t* t, size_t n, int64_t d, int32_t* out) {
    div_round_n_t(t, n, d, out);
}

// ------------------------------------------------------------------ encode / decode

namespace {

// Block k of the op (x at the op's start, n elements) encoded into yb[0 .. b).
void encode_one(const float* x, size_t n, int exponent, const SignKey& key, const Params& p,
                int split, const Scratch& s, size_t k, int32_t* yb, EncodeCounts& c) {
    const size_t b = static_cast<size_t>(p.b);
    const size_t o = k * b;
    const size_t m = o < n ? std::min(b, n - o) : 0;  // real elements of the block
    if (p.rht) sign_bits(key, o, m, s.signs);  // applied as the values are quantized
    if (p.rht && split) {  // sub-block by sub-block: quantized, then transformed in L1
        const size_t sub = size_t{1} << split;
        uint32_t top = 0;
        for (size_t j = 0; j < b; j += sub) {
            const size_t mj = j < m ? std::min(sub, m - j) : 0;
            const QuantizeCounts qc =
                quantize_i32(x + o + j, mj, exponent, p.q_max(), s.signs + j, yb + j);
            c.sat_quantize += qc.saturated;
            c.nonfinite += qc.nonfinite;
            std::fill(yb + j + mj, yb + j + sub, 0);
            const Ahead next{x + o + j + sub, yb + j + sub, 4, 4};
            top = std::max(top, fwht_sub32(yb + j, sub, next));
        }
        c.sat_transform += fwht_across32(yb, b, sub, p.wire_max(), top);
        return;
    }
    const QuantizeCounts qc =
        quantize_i32(x + o, m, exponent, p.q_max(), p.rht ? s.signs : nullptr, yb);
    c.sat_quantize += qc.saturated;
    c.nonfinite += qc.nonfinite;
    std::fill(yb + m, yb + b, 0);
    if (!p.rht) return;  // |q| <= q_max < wire_max: nothing to saturate
    // |signed q| <= q_max bounds the block: no need to measure it
    c.sat_transform +=
        fwht_saturate_blocks(yb, b, b, p.wire_max(), p.q_max(), yb, s.t32, s.t64, {});
}

void check_block_range(const char* what, size_t begin, size_t end, size_t blocks) {
    if (begin > end || end > blocks)
        bad(std::string(what) + ": block range [" + std::to_string(begin) + ", " +
            std::to_string(end) + ") outside the op's " + std::to_string(blocks) + " blocks");
}

}  // namespace

EncodeCounts encode_blocks(const float* x, size_t n, int exponent, uint32_t op_id,
                           const Params& p, size_t block_begin, size_t block_end, int32_t* y) {
    p.check();
    const size_t b = static_cast<size_t>(p.b);
    check_block_range("encode_blocks", block_begin, block_end, p.padded_len(n) / b);
    const SignKey key = sign_key(p.seed, op_id);
    const Scratch s = scratch(b);
    const int split = encoder_split(b, p.q_max());
    EncodeCounts c;
    for (size_t k = block_begin; k < block_end; ++k)
        encode_one(x, n, exponent, key, p, split, s, k, y + k * b, c);
    return c;
}

EncodeCounts encode_block(const float* x, size_t n, int exponent, uint32_t op_id,
                          const Params& p, size_t block, int32_t* y) {
    p.check();
    const size_t b = static_cast<size_t>(p.b);
    check_block_range("encode_block", block, block + 1, p.padded_len(n) / b);
    EncodeCounts c;
    encode_one(x, n, exponent, sign_key(p.seed, op_id), p, encoder_split(b, p.q_max()),
               scratch(b), block, y, c);
    return c;
}

EncodeCounts encode(const float* x, size_t n, int exponent, uint32_t op_id, const Params& p,
                    int32_t* y) {
    p.check();
    return encode_blocks(x, n, exponent, op_id, p, 0, p.padded_len(n) / static_cast<size_t>(p.b),
                         y);
}

DecodeCounts decode_blocks(const int32_t* z, const uint8_t* have, size_t n, int exponent,
                           uint32_t op_id, const Params& p, size_t block_begin,
                           size_t block_end, float* out) {
    p.check();
    const size_t b = static_cast<size_t>(p.b);
    const size_t ppb = static_cast<size_t>(p.packets_per_block());
    check_block_range("decode_blocks", block_begin, block_end, p.padded_len(n) / b);
    const SignKey key = sign_key(p.seed, op_id);
    const Scratch s = scratch(b);
    int64_t* t = s.t64;
    int64_t* v = s.v;
    DecodeCounts c;
    for (size_t k = block_begin; k < block_end; ++k) {
        const size_t o = k * b;
        int64_t kept = 0;
        for (size_t i = 0; i < ppb; ++i) kept += have[k * ppb + i] != 0;
        c.empty_blocks += kept == 0;
        const size_t m = o < n ? std::min(b, n - o) : 0;
        if (m == 0) continue;  // padding only (n = 0): nothing to write
        if (p.rht) {
            // wire values: the int64 path; the next block's input and output fetched meanwhile
            fwht_blocks_i32(z + o, b, b, t, nullptr, Ahead{z + o + b, out + o + b, 4, 4});
            const int64_t d = p.estimator == Estimator::unbiased
                                  ? std::max<int64_t>(kept, 1) * p.p
                                  : static_cast<int64_t>(b);
            if (fpu_ok(exponent)) {  // only the elements that are output
                sign_bits(key, o, m, s.signs);
                const double scale = std::ldexp(1.0, exponent);
                const bool clamp = exponent > 80;  // below, |q| 2^E <= 2^127 (|t| <= 2^47)
                c.sat_output += is_pow2(d) ? decode_fpu_pow2(t, m, __builtin_ctzll(d), s.signs,
                                                             scale, clamp, out + o)
                                           : decode_fpu(t, m, d, s.signs, scale, clamp, out + o);
                continue;
            }
            div_round_block(t, m, d, v);
            apply_signs(key, o, v, m, v);
        } else {
            for (size_t i = 0; i < m; ++i) v[i] = z[o + i];
        }
        c.sat_output += dequantize_range(v, m, exponent, out + o);
    }
    return c;
}

DecodeCounts decode(const int32_t* z, const uint8_t* have, size_t n, int exponent,
                    uint32_t op_id, const Params& p, float* out) {
    p.check();
    return decode_blocks(z, have, n, exponent, op_id, p, 0,
                         p.padded_len(n) / static_cast<size_t>(p.b), out);
}

}  // namespace optireduce
