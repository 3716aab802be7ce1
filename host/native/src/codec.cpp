// The codec's arithmetic: each loop does the integer steps of docs/numerics.md that
// host/model/kernels.py does, written so that the compiler vectorises it (no branches on
// data in the hot loops, plain strided loops in the transform).
#include "codec.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

// The wheel is built for x86-64-v2 (SSE4.2: every x86 CI machine of this project's kind and
// much older ones). The hot loops are also compiled for x86-64-v3 (AVX2) and v4 (AVX-512) and
// chosen at load time by the CPU's features (GCC function multiversioning), so one build runs
// everywhere and still uses the wide vectors where they exist; -march=native would not run on
// an older machine. Sanitizer builds keep one version (simpler stacks).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12 && \
    !defined(OPTIREDUCE_NO_CLONES)
#define OR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OR_CLONES
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

// One B-element int64 scratch per thread: the transform of one block stays in L1/L2.
int64_t* scratch(size_t n) {
    thread_local std::vector<int64_t> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
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

template <class Q>
OR_INLINE QuantizeCounts quantize_loop(const float* __restrict x, size_t n, int64_t exponent,
                                       int64_t q_max, Q* __restrict q) {
    int64_t sat = 0, nonfinite = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, 4);
        q[i] = static_cast<Q>(quantize_one(bits, exponent, q_max, sat, nonfinite));
    }
    return {sat, nonfinite};
}

OR_CLONES QuantizeCounts quantize_i32(const float* __restrict x, size_t n, int64_t exponent,
                                      int64_t q_max, int32_t* __restrict q) {
    return quantize_loop(x, n, exponent, q_max, q);
}

OR_CLONES QuantizeCounts quantize_i64(const float* __restrict x, size_t n, int64_t exponent,
                                      int64_t q_max, int64_t* __restrict q) {
    return quantize_loop(x, n, exponent, q_max, q);
}

OR_CLONES uint32_t max_finite_magnitude(const float* __restrict x, size_t n) {
    uint32_t top = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, 4);
        const uint32_t mag = bits & 0x7FFFFFFFu;
        const uint32_t m = mag < 0x7F800000u ? mag : 0;  // inf and NaN are skipped
        top = m > top ? m : top;
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

bool fpu_default_mode() {
#if defined(__x86_64__)
    // rounding control bits 13-14 = 0 (nearest), FTZ (bit 15) and DAZ (bit 6) clear;
    // torch.set_flush_denormal(True) sets FTZ/DAZ, and then the exact path is used.
    return (_mm_getcsr() & 0xE040u) == 0;
#else
    return std::fegetround() == FE_TONEAREST;
#endif
}

OR_CLONES bool any_abs_at_least_2p53(const int64_t* __restrict v, size_t n) {
    const int64_t lim = int64_t{1} << 53;
    bool any = false;
    for (size_t i = 0; i < n; ++i) any |= (v[i] >= lim) | (v[i] <= -lim);
    return any;
}

int64_t dequantize_range(const int64_t* v, size_t n, int exponent, float* out) {
    if (exponent >= -512 && exponent <= 512 && fpu_default_mode())
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
    for (size_t i = 0; i < n; ++i) {
        const T s = -static_cast<T>((words[i >> 5] >> (i & 31)) & 1);  // 0 or -1
        out[i] = (v[i] ^ s) - s;
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

template <class T, class Neg>
void apply_signs_t(const SignKey& k, uint64_t start, const T* v, size_t n, T* out, Neg neg) {
    uint32_t words[WORDS_PER_RUN + 1];
    size_t j = 0;
    // an unaligned start: the first partial word element by element
    while (j < n && ((start + j) & 31)) {
        const uint64_t e = start + j;
        const uint32_t w = speck_word(k.rk, static_cast<uint32_t>(e >> 5));
        out[j] = ((w >> (e & 31)) & 1) ? -v[j] : v[j];
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

// Strides 1, 2 and 4 inside each group of 8 (b >= 8), reading T and writing int64.
template <class T>
OR_INLINE void stages_1_2_4(const T* __restrict x, size_t b, int64_t* __restrict y) {
    for (size_t i = 0; i < b; i += 8) {
        int64_t a[8];
        for (int k = 0; k < 8; ++k) a[k] = x[i + k];
        const int64_t s0 = a[0] + a[1], s1 = a[0] - a[1], s2 = a[2] + a[3], s3 = a[2] - a[3];
        const int64_t s4 = a[4] + a[5], s5 = a[4] - a[5], s6 = a[6] + a[7], s7 = a[6] - a[7];
        const int64_t t0 = s0 + s2, t1 = s1 + s3, t2 = s0 - s2, t3 = s1 - s3;
        const int64_t t4 = s4 + s6, t5 = s5 + s7, t6 = s4 - s6, t7 = s5 - s7;
        y[i + 0] = t0 + t4;
        y[i + 1] = t1 + t5;
        y[i + 2] = t2 + t6;
        y[i + 3] = t3 + t7;
        y[i + 4] = t0 - t4;
        y[i + 5] = t1 - t5;
        y[i + 6] = t2 - t6;
        y[i + 7] = t3 - t7;
    }
}

// Radix-8 butterflies (strides h, 2h, 4h) over y[0..b): loads 8 vectors, 3 stages in registers.
OR_INLINE void pass8(int64_t* __restrict y, size_t b, size_t h) {
    for (size_t i = 0; i < b; i += 8 * h) {
        int64_t* __restrict p = y + i;
        for (size_t j = 0; j < h; ++j) {
            const int64_t a0 = p[j], a1 = p[j + h], a2 = p[j + 2 * h], a3 = p[j + 3 * h];
            const int64_t a4 = p[j + 4 * h], a5 = p[j + 5 * h], a6 = p[j + 6 * h],
                          a7 = p[j + 7 * h];
            const int64_t s0 = a0 + a1, s1 = a0 - a1, s2 = a2 + a3, s3 = a2 - a3;
            const int64_t s4 = a4 + a5, s5 = a4 - a5, s6 = a6 + a7, s7 = a6 - a7;
            const int64_t t0 = s0 + s2, t1 = s1 + s3, t2 = s0 - s2, t3 = s1 - s3;
            const int64_t t4 = s4 + s6, t5 = s5 + s7, t6 = s4 - s6, t7 = s5 - s7;
            p[j] = t0 + t4;
            p[j + h] = t1 + t5;
            p[j + 2 * h] = t2 + t6;
            p[j + 3 * h] = t3 + t7;
            p[j + 4 * h] = t0 - t4;
            p[j + 5 * h] = t1 - t5;
            p[j + 6 * h] = t2 - t6;
            p[j + 7 * h] = t3 - t7;
        }
    }
}

OR_INLINE void pass4(int64_t* __restrict y, size_t b, size_t h) {
    for (size_t i = 0; i < b; i += 4 * h) {
        int64_t* __restrict p = y + i;
        for (size_t j = 0; j < h; ++j) {
            const int64_t a0 = p[j], a1 = p[j + h], a2 = p[j + 2 * h], a3 = p[j + 3 * h];
            const int64_t s0 = a0 + a1, s1 = a0 - a1, s2 = a2 + a3, s3 = a2 - a3;
            p[j] = s0 + s2;
            p[j + h] = s1 + s3;
            p[j + 2 * h] = s0 - s2;
            p[j + 3 * h] = s1 - s3;
        }
    }
}

OR_INLINE void pass2(int64_t* __restrict y, size_t b, size_t h) {
    for (size_t i = 0; i < b; i += 2 * h) {
        int64_t* __restrict p = y + i;
        for (size_t j = 0; j < h; ++j) {
            const int64_t a0 = p[j], a1 = p[j + h];
            p[j] = a0 + a1;
            p[j + h] = a0 - a1;
        }
    }
}

// y = H_b x for one block (b >= 8): strides 1..4, then radix-8 passes, radix 4/2 for the rest.
template <class T>
OR_INLINE void fwht_block(const T* __restrict x, size_t b, int64_t* __restrict y) {
    stages_1_2_4(x, b, y);
    size_t h = 8;
    while (h * 8 <= b) {
        pass8(y, b, h);
        h *= 8;
    }
    if (h * 4 <= b) {
        pass4(y, b, h);
        h *= 4;
    } else if (h * 2 <= b) {
        pass2(y, b, h);
    }
}

// b in 1..4: scalar radix-2.
template <class T>
void fwht_tiny(const T* x, size_t n, size_t b, int64_t* y) {
    for (size_t i = 0; i < n; ++i) y[i] = x[i];
    for (size_t h = 1; h < b; h *= 2) pass2(y, n, h);
}

OR_CLONES void fwht_blocks_i32(const int32_t* __restrict x, size_t n, size_t b,
                               int64_t* __restrict y) {
    for (size_t o = 0; o < n; o += b) fwht_block(x + o, b, y + o);
}

OR_CLONES void fwht_block_i64(int64_t* y, size_t b) {
    // the first pass reads and writes the same elements of a group of 8: in place is safe,
    // but the restrict of fwht_block forbids the alias, so copy the group through registers
    for (size_t i = 0; i < b; i += 8) {
        int64_t a[8];
        std::memcpy(a, y + i, sizeof a);
        stages_1_2_4(a, 8, y + i);
    }
    size_t h = 8;
    while (h * 8 <= b) {
        pass8(y, b, h);
        h *= 8;
    }
    if (h * 4 <= b) {
        pass4(y, b, h);
    } else if (h * 2 <= b) {
        pass2(y, b, h);
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

// v[i] = div_round(t[i], d) for one block; d > 0 and |t| < 2^52 here (|t| <= 2^31 b).
// A power of two divides by a shift; otherwise the quotient through double is within one of
// the exact one (2|t| + d < 2^53 is exact in double) and one correction step makes it exact.
OR_CLONES void div_round_block(const int64_t* __restrict t, size_t n, int64_t d,
                               int64_t* __restrict v) {
    if (is_pow2(d)) {
        const int sh = __builtin_ctzll(static_cast<uint64_t>(d));
        const int64_t half = d >> 1;  // floor((2m + d) / 2d) = (m + d/2) >> log2 d, d even
        if (d == 1) {
            for (size_t i = 0; i < n; ++i) v[i] = t[i];
            return;
        }
        for (size_t i = 0; i < n; ++i) {
            const int64_t x = t[i];
            const int64_t m = x < 0 ? -x : x;
            const int64_t q = (m + half) >> sh;
            v[i] = x < 0 ? -q : q;
        }
        return;
    }
    const int64_t two_d = 2 * d;
    const double inv = 1.0 / static_cast<double>(two_d);
    for (size_t i = 0; i < n; ++i) {
        const int64_t x = t[i];
        const int64_t a = 2 * (x < 0 ? -x : x) + d;
        int64_t q = static_cast<int64_t>(static_cast<double>(a) * inv);
        const int64_t r = a - q * two_d;
        q += (r >= two_d) - (r < 0);
        v[i] = x < 0 ? -q : q;
    }
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
    return quantize_i32(x, n, exponent, q_max, q);
}

QuantizeCounts quantize(const float* x, size_t n, int exponent, int64_t q_max, int64_t* q) {
    if (q_max < 0 || q_max >= (int64_t{1} << 62)) bad("quantize: q_max must be in 0..2^62-1");
    return quantize_i64(x, n, exponent, q_max, q);
}

int64_t dequantize(const int64_t* v, size_t n, int exponent, float* out) {
    if (any_abs_at_least_2p53(v, n)) bad("dequantize: |v| must stay below 2^53");
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
    while (j < n) {
        const uint64_t e = start + j;
        const uint32_t w = speck_word(k.rk, static_cast<uint32_t>(e >> 5));
        const size_t end = std::min<uint64_t>(n, ((e >> 5) + 1) * 32 - start);
        for (; j < end; ++j) out[j] = static_cast<uint8_t>((w >> ((start + j) & 31)) & 1);
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
    if (b < 8)
        fwht_tiny(x, n, static_cast<size_t>(b), y);
    else
        fwht_blocks_i32(x, n, static_cast<size_t>(b), y);
}

void fwht_blocks(const int64_t* x, size_t n, int b, int64_t* y) {
    check_block(b, n);
    if (b < 8) {
        fwht_tiny(x, n, static_cast<size_t>(b), y);
        return;
    }
    if (x != y) std::memcpy(y, x, n * sizeof(int64_t));
    for (size_t o = 0; o < n; o += static_cast<size_t>(b)) fwht_block_i64(y + o, b);
}

int64_t fwht_saturate(const int32_t* x, size_t n, int b, int64_t limit, int32_t* y) {
    check_block(b, n);
    if (limit < 0 || limit > 0x7FFFFFFF) bad("fwht_saturate: limit must be in 0..2^31-1");
    int64_t* t = scratch(static_cast<size_t>(b));
    int64_t over = 0;
    for (size_t o = 0; o < n; o += static_cast<size_t>(b)) {
        fwht_blocks(x + o, static_cast<size_t>(b), b, t);
        over += saturate_narrow(t, static_cast<size_t>(b), limit, y + o);
    }
    return over;
}

// ------------------------------------------------------------------ encode / decode

EncodeCounts encode_blocks(const float* x, size_t n, int exponent, uint32_t op_id,
                           const Params& p, size_t block_begin, size_t block_end, int32_t* y) {
    p.check();
    const size_t b = static_cast<size_t>(p.b);
    const size_t blocks = p.padded_len(n) / b;
    if (block_begin > block_end || block_end > blocks)
        bad("encode_blocks: block range [" + std::to_string(block_begin) + ", " +
            std::to_string(block_end) + ") outside the op's " + std::to_string(blocks) +
            " blocks");
    const SignKey key = sign_key(p.seed, op_id);
    int64_t* t = scratch(b);
    EncodeCounts c;
    for (size_t k = block_begin; k < block_end; ++k) {
        const size_t o = k * b;
        const size_t m = o < n ? std::min(b, n - o) : 0;  // real elements of the block
        int32_t* yb = y + o;
        const QuantizeCounts qc = quantize_i32(x + o, m, exponent, p.q_max(), yb);
        c.sat_quantize += qc.saturated;
        c.nonfinite += qc.nonfinite;
        std::fill(yb + m, yb + b, 0);
        if (!p.rht) continue;  // |q| <= q_max < wire_max: nothing to saturate
        apply_signs(key, o, yb, b, yb);
        fwht_blocks_i32(yb, b, b, t);
        c.sat_transform += saturate_narrow(t, b, p.wire_max(), yb);
    }
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
    const size_t blocks = p.padded_len(n) / b;
    if (block_begin > block_end || block_end > blocks)
        bad("decode_blocks: block range [" + std::to_string(block_begin) + ", " +
            std::to_string(block_end) + ") outside the op's " + std::to_string(blocks) +
            " blocks");
    const SignKey key = sign_key(p.seed, op_id);
    int64_t* t = scratch(2 * b);
    int64_t* v = t + b;
    DecodeCounts c;
    for (size_t k = block_begin; k < block_end; ++k) {
        const size_t o = k * b;
        int64_t kept = 0;
        for (size_t i = 0; i < ppb; ++i) kept += have[k * ppb + i] != 0;
        c.empty_blocks += kept == 0;
        const size_t m = o < n ? std::min(b, n - o) : 0;
        if (m == 0) continue;  // padding only (n = 0): nothing to write
        if (p.rht) {
            fwht_blocks_i32(z + o, b, b, t);
            const int64_t d = p.estimator == Estimator::unbiased
                                  ? std::max<int64_t>(kept, 1) * p.p
                                  : static_cast<int64_t>(b);
            div_round_block(t, m, d, v);  // only the elements that are output
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
