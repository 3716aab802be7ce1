// The codec on random inputs and edge values, against references that need no Python:
// long double arithmetic for quantize/dequantize, the transform's own algebra (H H = b I),
// the whole-op functions against their block-range forms, the exact dequantize path against
// the FPU one. Built with ASan + UBSan (OPTIREDUCE_SANITIZE=ON), so every out-of-bounds
// access, overflow or bad shift on these inputs fails the run. The bit-for-bit comparison with
// the Python model is tests/native/test_codec_native.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec.hpp"
#include "selftest.hpp"

using namespace optireduce;

namespace {

std::mt19937_64 rng(12345);

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
uint32_t to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

const uint32_t SPECIAL[] = {
    0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00400000, 0x00800000, 0x3F800000,
    0xBF800000, 0x3EFFFFFF, 0x3F000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
    0x7FC00000, 0xFFFFFFFF, 0x7F800001,
};

// Random float32s: any bit pattern, normal values, and the special ones.
std::vector<float> random_floats(size_t n) {
    std::vector<float> x(n);
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < n; ++i) {
        switch (rng() % 4) {
            case 0: x[i] = from_bits(static_cast<uint32_t>(rng())); break;
            case 1: x[i] = normal(rng); break;
            case 2: x[i] = std::ldexp(normal(rng), static_cast<int>(rng() % 120) - 60); break;
            default: x[i] = from_bits(SPECIAL[rng() % std::size(SPECIAL)]);
        }
    }
    return x;
}

std::vector<int32_t> random_ints(size_t n, int width) {  // |v| < 2^(width-1)
    std::vector<int32_t> v(n);
    const int64_t lim = int64_t{1} << (width - 1);
    for (auto& e : v) e = static_cast<int32_t>(static_cast<int64_t>(rng() % (2 * lim)) - lim);
    if (n) v[0] = static_cast<int32_t>(lim - 1), v[n - 1] = static_cast<int32_t>(-lim);
    return v;
}

Params params(int p, int b, int headroom, bool rht = true, Estimator est = Estimator::unbiased) {
    Params r;
    r.p = p;
    r.b = b;
    r.headroom_bits = headroom;
    r.rht = rht;
    r.estimator = est;
    r.seed = static_cast<uint32_t>(rng());
    r.check();
    return r;
}

// sign(x) floor(|x| 2^-E + 1/2) clamped to q_max, in long double (exact: 64-bit mantissa)
int64_t quantize_ref(float x, int e, int64_t q_max, bool& sat, bool& nonfinite) {
    sat = nonfinite = false;
    if (std::isnan(x)) {
        nonfinite = true;
        return 0;
    }
    if (std::isinf(x)) nonfinite = true;
    const long double a = std::ldexp(std::fabs(static_cast<long double>(x)), -e);
    const long double m = std::floor(a + 0.5L);
    if (m > static_cast<long double>(q_max)) {
        sat = true;
        return std::signbit(x) ? -q_max : q_max;
    }
    const int64_t q = static_cast<int64_t>(m);
    return std::signbit(x) ? -q : q;
}

}  // namespace

TEST(speck_published_vector) {
    // Beaulieu et al., "The SIMON and SPECK Families of Lightweight Block Ciphers", App. C
    const SignKey k = speck_key_schedule(0x1918, 0x1110, 0x0908, 0x0100);
    uint16_t x = 0x6574, y = 0x694C;
    speck_encrypt(k, x, y);
    CHECK(x == 0xA868 && y == 0x42F2);
}

TEST(signs_windows_and_involution) {
    for (int rep = 0; rep < 20; ++rep) {
        const SignKey k = sign_key(static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()));
        const size_t n = 1 + rng() % 20000;
        std::vector<uint8_t> whole(n);
        sign_bits(k, 0, n, whole.data());
        const uint64_t start = rng() % n, len = rng() % (n - start + 1);
        std::vector<uint8_t> part(len);
        sign_bits(k, start, len, part.data());
        CHECK(std::equal(part.begin(), part.end(), whole.begin() + static_cast<long>(start)));
        // apply_signs from any start negates exactly where the bits say; twice is identity
        std::vector<int64_t> v(len), w(len);
        for (auto& e : v) e = static_cast<int64_t>(rng());
        if (len) v[0] = std::numeric_limits<int64_t>::min();  // -v wraps, as in the model
        apply_signs(k, start, v.data(), len, w.data());
        for (size_t i = 0; i < len; ++i)
            CHECK(w[i] == (part[i] ? static_cast<int64_t>(0 - static_cast<uint64_t>(v[i])) : v[i]));
        apply_signs(k, start, w.data(), len, w.data());
        CHECK(w == v);
        std::vector<int32_t> v32(len);
        for (size_t i = 0; i < len; ++i) v32[i] = static_cast<int32_t>(v[i] >> 33);
        std::vector<int32_t> w32(v32);
        apply_signs(k, start, w32.data(), len, w32.data());
        for (size_t i = 0; i < len; ++i) CHECK(w32[i] == (part[i] ? -v32[i] : v32[i]));
    }
}

TEST(quantize_against_long_double) {
    for (int rep = 0; rep < 40; ++rep) {
        const std::vector<float> x = random_floats(1 + rng() % 5000);
        const int headroom = 1 + static_cast<int>(rng() % 16);
        const int64_t q_max = (int64_t{1} << (31 - headroom)) - 1;
        const int e = static_cast<int>(rng() % 300) - 150;
        std::vector<int32_t> q(x.size());
        std::vector<int64_t> q64(x.size());
        const QuantizeCounts c = quantize(x.data(), x.size(), e, q_max, q.data());
        const QuantizeCounts c64 = quantize(x.data(), x.size(), e, q_max, q64.data());
        int64_t sat = 0, nonfinite = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            bool s, nf;
            const int64_t ref = quantize_ref(x[i], e, q_max, s, nf);
            sat += s;
            nonfinite += nf;
            CHECK(q[i] == ref && q64[i] == ref);
        }
        CHECK(c.saturated == sat && c.nonfinite == nonfinite);
        CHECK(c64.saturated == sat && c64.nonfinite == nonfinite);
    }
}

TEST(propose_exponent_is_the_smallest_without_saturation) {
    for (int rep = 0; rep < 200; ++rep) {
        Params p = params(8, 64, 1 + static_cast<int>(rng() % 6));
        const std::vector<float> x = random_floats(1 + rng() % 300);
        const int e = propose_exponent(x.data(), x.size(), p);
        CHECK(e >= EXP_MIN && e <= EXP_MAX);
        float top = 0;
        for (float v : x)
            if (std::isfinite(v)) top = std::max(top, std::fabs(v));
        if (top == 0) {
            CHECK(e == 0);
            continue;
        }
        bool s, nf;
        quantize_ref(top, e, p.q_max(), s, nf);
        CHECK(!s || e == EXP_MAX);
        if (e > EXP_MIN) {  // one step finer and the largest value saturates
            quantize_ref(top, e - 1, p.q_max(), s, nf);
            CHECK(s);
        }
    }
}

TEST(dequantize_against_long_double_and_exact_path) {
    for (int rep = 0; rep < 60; ++rep) {
        const size_t n = 1 + rng() % 3000;
        std::vector<int64_t> v(n);
        for (auto& e : v) {
            const int width = static_cast<int>(rng() % 54);
            e = width ? static_cast<int64_t>(rng() >> (64 - width)) * ((rng() & 1) ? -1 : 1) : 0;
        }
        v[0] = (int64_t{1} << 53) - 1;
        const int e = rep < 50 ? static_cast<int>(rng() % 300) - 200 : (rep % 2 ? 900 : -900);
        std::vector<float> out(n), exact(n);
        const int64_t sat = dequantize(v.data(), n, e, out.data());
        int64_t ref_sat = 0;
        for (size_t i = 0; i < n; ++i) {
            float r = static_cast<float>(std::ldexp(static_cast<long double>(v[i]), e));
            if (std::isinf(r)) {
                ++ref_sat;
                r = std::copysign(std::numeric_limits<float>::max(), r);
            }
            CHECK(to_bits(out[i]) == to_bits(r) || (v[i] == 0 && out[i] == 0));
        }
        CHECK(sat == ref_sat);
#if defined(__x86_64__)
        // flush-to-zero and denormals-are-zero force the integer path: same bits
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040u);
        const int64_t sat2 = dequantize(v.data(), n, e, exact.data());
        _mm_setcsr(csr);
        CHECK(sat2 == sat);
        for (size_t i = 0; i < n; ++i) CHECK(to_bits(exact[i]) == to_bits(out[i]));
#endif
    }
    int64_t big[] = {1, int64_t{1} << 53};
    float o[2];
    CHECK_THROWS(dequantize(big, 2, 0, o), std::invalid_argument);
    big[1] = std::numeric_limits<int64_t>::min();
    CHECK_THROWS(dequantize(big, 2, 0, o), std::invalid_argument);
}

TEST(fwht_is_its_own_inverse_and_paths_agree) {
    for (int log2_b = 0; log2_b <= 16; ++log2_b) {
        const int b = 1 << log2_b;
        const size_t n = static_cast<size_t>(b) * (log2_b > 13 ? 1 : 1 + rng() % 3);
        for (int width : {2, 12, 32 - log2_b + 1, 31 - log2_b + 1 - 1, 23, 32}) {
            if (width < 2 || width > 32) continue;
            const std::vector<int32_t> x = random_ints(n, width);
            std::vector<int64_t> y(n), y64(n), z(n);
            fwht_blocks(x.data(), n, b, y.data());  // int32 path where the width allows
            std::vector<int64_t> x64(x.begin(), x.end());
            fwht_blocks(x64.data(), n, b, y64.data());  // always int64
            CHECK(y == y64);
            fwht_blocks(y.data(), n, b, z.data());
            for (size_t i = 0; i < n; ++i) CHECK(z[i] == static_cast<int64_t>(b) * x[i]);
            fwht_blocks(y64.data(), n, b, y64.data());  // in place
            CHECK(y64 == z);
            for (int64_t limit : {int64_t{0x7FFFFFFF}, (int64_t{1} << (width - 1)) - 1, int64_t{0}}) {
                std::vector<int32_t> s(n);
                const int64_t over = fwht_saturate(x.data(), n, b, limit, s.data());
                int64_t ref_over = 0;
                for (size_t i = 0; i < n; ++i) {
                    ref_over += y[i] > limit || y[i] < -limit;
                    CHECK(s[i] == std::clamp(y[i], -limit, limit));
                }
                CHECK(over == ref_over);
            }
        }
    }
    std::vector<int32_t> x(24);
    std::vector<int64_t> y(24);
    CHECK_THROWS(fwht_blocks(x.data(), 24, 16, y.data()), std::invalid_argument);
    CHECK_THROWS(fwht_blocks(x.data(), 24, 3, y.data()), std::invalid_argument);
    CHECK_THROWS(fwht_blocks(x.data(), 24, 0, y.data()), std::invalid_argument);
    CHECK_THROWS(fwht_blocks(x.data(), 0, 131072, y.data()), std::invalid_argument);
}

TEST(div_round_n_equals_the_scalar_division) {
    for (int rep = 0; rep < 200; ++rep) {
        const size_t n = rng() % 300;
        const int64_t d = rep % 3 ? 1 + static_cast<int64_t>(rng() % 70000)
                                  : int64_t{1} << (rng() % 17);
        const int width = 1 + static_cast<int>(rng() % 61);  // past 2^51: the integer loop
        std::vector<int64_t> t(n), q(n);
        std::vector<int32_t> q32(n);
        for (auto& v : t)
            v = static_cast<int64_t>(rng() >> (64 - width)) * ((rng() & 1) ? -1 : 1);
        div_round_n(t.data(), n, d, q.data());
        for (size_t i = 0; i < n; ++i) {
            // floor(|t| / d + 1/2) with the sign of t, in 128 bits
            const __int128 a = t[i] < 0 ? -static_cast<__int128>(t[i]) : t[i];
            const __int128 m = (2 * a + d) / (2 * static_cast<__int128>(d));
            CHECK(q[i] == static_cast<int64_t>(t[i] < 0 ? -m : m));
        }
        if (width <= 31) {
            div_round_n(t.data(), n, d, q32.data());
            for (size_t i = 0; i < n; ++i) CHECK(q32[i] == q[i]);
        }
    }
    int64_t t[1] = {1}, q[1];
    CHECK_THROWS(div_round_n(t, 1, 0, q), std::invalid_argument);
    t[0] = int64_t{1} << 62;
    CHECK_THROWS(div_round_n(t, 1, 3, q), std::invalid_argument);
}

TEST(encode_decode_block_ranges_equal_the_whole_op) {
    const Params geometries[] = {
        params(8, 32, 5), params(4, 64, 1), params(16, 128, 7), params(256, 4096, 9),
        params(128, 1024, 10), params(8, 8, 3), params(1, 2, 1), params(16, 256, 8, false),
        params(32, 512, 9, true, Estimator::plain),
    };
    for (const Params& p : geometries) {
        for (int rep = 0; rep < 6; ++rep) {
            const size_t n = rng() % (3 * static_cast<size_t>(p.b) + 7);
            const std::vector<float> x = random_floats(n);
            const int e = propose_exponent(x.data(), n, p) - static_cast<int>(rng() % 3) * 6;
            const uint32_t op = static_cast<uint32_t>(rng());
            const size_t L = p.padded_len(n), blocks = L / static_cast<size_t>(p.b);
            std::vector<int32_t> y(L, 7), yb(L, 7);
            const EncodeCounts c = encode(x.data(), n, e, op, p, y.data());
            EncodeCounts sum;
            for (size_t k = 0; k < blocks;) {  // uneven ranges, some empty
                const size_t end = std::min(blocks, k + rng() % 3);
                const EncodeCounts ck = encode_blocks(x.data(), n, e, op, p, k, end, yb.data());
                sum.sat_quantize += ck.sat_quantize;
                sum.sat_transform += ck.sat_transform;
                sum.nonfinite += ck.nonfinite;
                k = end;
            }
            CHECK(y == yb);
            CHECK(c.sat_quantize == sum.sat_quantize && c.sat_transform == sum.sat_transform &&
                  c.nonfinite == sum.nonfinite);
            for (int32_t v : y) CHECK(v >= -p.wire_max() && v <= p.wire_max());

            std::vector<uint8_t> have(p.packets_for(n));
            for (auto& h : have) h = static_cast<uint8_t>(rng() % 4 != 0);
            std::vector<int32_t> z(y);
            for (size_t i = 0; i < L; ++i)
                if (!have[i / static_cast<size_t>(p.p)]) z[i] = 0;
            std::vector<float> out(n), outb(n);
            const DecodeCounts d = decode(z.data(), have.data(), n, e, op, p, out.data());
            DecodeCounts dsum;
            for (size_t k = 0; k < blocks; ++k) {
                const DecodeCounts dk =
                    decode_blocks(z.data(), have.data(), n, e, op, p, k, k + 1, outb.data());
                dsum.sat_output += dk.sat_output;
                dsum.empty_blocks += dk.empty_blocks;
            }
            for (size_t i = 0; i < n; ++i) CHECK(to_bits(out[i]) == to_bits(outb[i]));
            CHECK(d.sat_output == dsum.sat_output && d.empty_blocks == dsum.empty_blocks);
        }
        std::vector<float> x(1);
        std::vector<int32_t> y(p.padded_len(1));
        CHECK_THROWS(encode_blocks(x.data(), 1, 0, 0, p, 0, 2, y.data()), std::invalid_argument);
        CHECK_THROWS(encode_blocks(x.data(), 1, 0, 0, p, 1, 0, y.data()), std::invalid_argument);
    }
}

TEST(lossless_round_trip_returns_the_quantized_input) {
    std::normal_distribution<float> normal;
    for (const Estimator est : {Estimator::unbiased, Estimator::plain}) {
        const Params p = params(256, 4096, 9, true, est);
        for (size_t n : {size_t{1}, size_t{4095}, size_t{4096}, size_t{10000}}) {
            std::vector<float> x(n);
            for (auto& v : x) v = normal(rng);
            const int e = propose_exponent(x.data(), n, p);
            std::vector<int32_t> y(p.padded_len(n));
            const EncodeCounts c = encode(x.data(), n, e, 9, p, y.data());
            CHECK(c.sat_transform == 0 && c.sat_quantize == 0);
            std::vector<uint8_t> have(p.packets_for(n), 1);
            std::vector<float> out(n), ref(n);
            decode(y.data(), have.data(), n, e, 9, p, out.data());
            std::vector<int64_t> q(n);
            quantize(x.data(), n, e, p.q_max(), q.data());
            dequantize(q.data(), n, e, ref.data());
            for (size_t i = 0; i < n; ++i) CHECK(to_bits(out[i]) == to_bits(ref[i]));
        }
    }
}

TEST(params_check_rejects_what_the_codec_cannot_use) {
    Params p;
    p.check();
    Params bad = p;
    bad.b = 3000;
    CHECK_THROWS(bad.check(), std::invalid_argument);
    bad = p;
    bad.p = 300;
    CHECK_THROWS(bad.check(), std::invalid_argument);
    bad = p;
    bad.headroom_bits = 13;
    CHECK_THROWS(bad.check(), std::invalid_argument);
    bad = p;
    bad.w_wire = 16;
    CHECK_THROWS(bad.check(), std::invalid_argument);
    CHECK(p.padded_len(0) == 4096 && p.padded_len(4097) == 8192 && p.packets_for(1) == 16);
    CHECK(p.q_max() == (1 << 22) - 1 && p.wire_max() == 0x7FFFFFFF && p.log2_b() == 12);
}

TEST(encode_decode_integer_paths_equal_the_fpu_paths) {
#if defined(__x86_64__)
    // flush-to-zero / denormals-are-zero (or a far exponent) select the integer loops
    for (const Estimator est : {Estimator::unbiased, Estimator::plain}) {
        const Params p = params(16, 512, 9, true, est);
        for (int rep = 0; rep < 8; ++rep) {
            const size_t n = 1 + rng() % 2000;
            const std::vector<float> x = random_floats(n);
            const int e = propose_exponent(x.data(), n, p) - static_cast<int>(rng() % 2) * 8;
            std::vector<int32_t> y(p.padded_len(n)), y2(y.size());
            std::vector<uint8_t> have(p.packets_for(n));
            for (auto& h : have) h = static_cast<uint8_t>(rng() % 3 != 0);
            std::vector<float> out(n), out2(n);
            const EncodeCounts c = encode(x.data(), n, e, 5, p, y.data());
            const DecodeCounts d = decode(y.data(), have.data(), n, e, 5, p, out.data());
            const unsigned csr = _mm_getcsr();
            _mm_setcsr(csr | 0x8040u);
            const EncodeCounts c2 = encode(x.data(), n, e, 5, p, y2.data());
            const DecodeCounts d2 = decode(y2.data(), have.data(), n, e, 5, p, out2.data());
            _mm_setcsr(csr);
            CHECK(y == y2);
            CHECK(c.sat_quantize == c2.sat_quantize && c.sat_transform == c2.sat_transform &&
                  c.nonfinite == c2.nonfinite);
            CHECK(d.sat_output == d2.sat_output && d.empty_blocks == d2.empty_blocks);
            for (size_t i = 0; i < n; ++i) CHECK(to_bits(out[i]) == to_bits(out2[i]));
        }
    }
#endif
}
