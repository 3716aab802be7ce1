// Tags of keyed jobs (docs/security.md): BLAKE2b (RFC 7693) keyed with the job's 32-byte key,
// an 8-byte digest over a datagram's UBT header; the native twin of ubt.header_tag, which
// uses Python's hashlib. Written here because the engine needs it per datagram without a
// library: the key's block is compressed once (TagKey), each tag is one more compression.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace optireduce {

constexpr size_t TAG_LEN = 8;   // ubt.TAG_LEN
constexpr size_t KEY_LEN = 32;  // ubt.KEY_LEN

// A job's key, or none (an unkeyed job).
using JobKey = std::optional<std::array<uint8_t, KEY_LEN>>;

struct TagKey {
    uint64_t h[8];       // BLAKE2b's state after the key's block
    uint64_t h0[8];      // its state before (an empty message ends with the key's block)
    uint8_t key[KEY_LEN];
};

// key: KEY_LEN bytes.
TagKey tag_key(const uint8_t* key);
// The tag of d[0 .. min(n, ubt.HEADER_LEN)) into out[0 .. TAG_LEN).
void header_tag(const TagKey& k, const uint8_t* d, size_t n, uint8_t* out);
// out == the tag of d[0 .. n - TAG_LEN) as header_tag computes it (n >= TAG_LEN).
bool tag_ok(const TagKey& k, const uint8_t* d, size_t n);

}  // namespace optireduce
