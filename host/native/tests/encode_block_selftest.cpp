// encode_block (one block into a block-sized buffer) against encode (the whole op, compared
// with the Python model in tests/native), under ASan + UBSan: every geometry the encoder
// splits differently, partial and padding-only blocks, out-of-range block indices.
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "codec.hpp"
#include "selftest.hpp"

using namespace optireduce;

namespace {

std::mt19937_64 block_rng(777);

Params geometry(int p, int b, int headroom) {
    Params r;
    r.p = p;
    r.b = b;
    r.headroom_bits = headroom;
    r.seed = static_cast<uint32_t>(block_rng());
    r.check();
    return r;
}

}  // namespace

TEST(encode_block_equals_the_op_slice) {
    // split at 10 (4 stages across), 9 (3), 7 (1), 6 (4), not split (h = log2 b, tiny b)
    const Params geometries[] = {
        geometry(4096, 16384, 10), geometry(256, 4096, 9), geometry(16, 256, 7),
        geometry(64, 1024, 6),     geometry(64, 1024, 10), geometry(8, 32, 5),
    };
    std::normal_distribution<float> normal;
    for (const Params& p : geometries) {
        const size_t b = static_cast<size_t>(p.b);
        for (int rep = 0; rep < 4; ++rep) {
            const size_t n = 1 + block_rng() % (2 * b + 5);
            std::vector<float> x(n);
            for (auto& v : x) v = normal(block_rng);
            const int e = propose_exponent(x.data(), n, p) - static_cast<int>(block_rng() % 2);
            const uint32_t op = static_cast<uint32_t>(block_rng());
            const size_t L = p.padded_len(n), blocks = L / b;
            std::vector<int32_t> y(L);
            const EncodeCounts c = encode(x.data(), n, e, op, p, y.data());
            EncodeCounts sum;
            std::vector<int32_t> one(b, 7);  // exactly one block: no write past it
            for (size_t k = 0; k < blocks; ++k) {
                const EncodeCounts ck = encode_block(x.data(), n, e, op, p, k, one.data());
                sum.sat_quantize += ck.sat_quantize;
                sum.sat_transform += ck.sat_transform;
                sum.nonfinite += ck.nonfinite;
                CHECK(std::vector<int32_t>(y.begin() + k * b, y.begin() + (k + 1) * b) == one);
            }
            CHECK(c.sat_quantize == sum.sat_quantize && c.sat_transform == sum.sat_transform &&
                  c.nonfinite == sum.nonfinite);
            CHECK_THROWS(encode_block(x.data(), n, e, op, p, blocks, one.data()),
                         std::invalid_argument);
        }
    }
}
