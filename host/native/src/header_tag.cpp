// BLAKE2b for short keyed messages: see header_tag.hpp.
#include "header_tag.hpp"

#include <cstring>

#include "wire.hpp"

namespace optireduce {

namespace {

constexpr uint64_t IV[8] = {
    0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull, 0xa54ff53a5f1d36f1ull,
    0x510e527fade682d1ull, 0x9b05688c2b3e6c1full, 0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull,
};

constexpr uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

constexpr size_t BLOCK = 128;

inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

inline uint64_t load_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

// RFC 7693's F: one 128-byte block into h, t bytes so far, last block or not.
void compress(uint64_t h[8], const uint8_t block[BLOCK], uint64_t t, bool last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; ++i) m[i] = load_le(block + 8 * i);
    for (int i = 0; i < 8; ++i) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    auto g = [&v](int a, int b, int c, int d, uint64_t x, uint64_t y) {
        v[a] += v[b] + x;
        v[d] = rotr(v[d] ^ v[a], 32);
        v[c] += v[d];
        v[b] = rotr(v[b] ^ v[c], 24);
        v[a] += v[b] + y;
        v[d] = rotr(v[d] ^ v[a], 16);
        v[c] += v[d];
        v[b] = rotr(v[b] ^ v[c], 63);
    };
    for (const auto& s : SIGMA) {
        g(0, 4, 8, 12, m[s[0]], m[s[1]]);
        g(1, 5, 9, 13, m[s[2]], m[s[3]]);
        g(2, 6, 10, 14, m[s[4]], m[s[5]]);
        g(3, 7, 11, 15, m[s[6]], m[s[7]]);
        g(0, 5, 10, 15, m[s[8]], m[s[9]]);
        g(1, 6, 11, 12, m[s[10]], m[s[11]]);
        g(2, 7, 8, 13, m[s[12]], m[s[13]]);
        g(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

}  // namespace

TagKey tag_key(const uint8_t* key) {
    TagKey k;
    std::memcpy(k.h, IV, sizeof IV);
    k.h[0] ^= 0x01010000ull ^ (uint64_t{KEY_LEN} << 8) ^ TAG_LEN;  // parameter block
    std::memcpy(k.h0, k.h, sizeof k.h0);
    std::memcpy(k.key, key, KEY_LEN);
    uint8_t block[BLOCK] = {};
    std::memcpy(block, key, KEY_LEN);
    compress(k.h, block, BLOCK, false);
    return k;
}

void header_tag(const TagKey& k, const uint8_t* d, size_t n, uint8_t* out) {
    const size_t len = n < HEADER_LEN ? n : HEADER_LEN;
    uint8_t block[BLOCK] = {};
    uint64_t h[8];
    if (len == 0) {  // the key's block is the last
        std::memcpy(block, k.key, KEY_LEN);
        std::memcpy(h, k.h0, sizeof h);
        compress(h, block, BLOCK, true);
    } else {
        std::memcpy(block, d, len);
        std::memcpy(h, k.h, sizeof h);
        compress(h, block, BLOCK + len, true);
    }
    for (size_t i = 0; i < TAG_LEN; ++i) out[i] = static_cast<uint8_t>(h[0] >> (8 * i));
}

bool tag_ok(const TagKey& k, const uint8_t* d, size_t n) {
    uint8_t want[TAG_LEN];
    header_tag(k, d, n - TAG_LEN, want);
    uint8_t diff = 0;  // every byte compared: the time does not tell how much matched
    for (size_t i = 0; i < TAG_LEN; ++i) diff |= static_cast<uint8_t>(want[i] ^ d[n - TAG_LEN + i]);
    return diff == 0;
}

}  // namespace optireduce
