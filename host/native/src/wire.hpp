// UBT v1 on the wire in C++: the native twin of optireduce/ubt.py (header, frames, parser)
// and optireduce/frame_checks.py (the receiver's checks against rank, world and window).
//
// docs/protocol.md is the spec. Frames are Ethernet / IPv4 / UDP / 32-byte UBT header /
// P big-endian int32 elements. Parsers return a drop code (the index of the reason in
// DROP_REASONS, the counter order) or OK; they never allocate and never read past `n`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce {

constexpr int UBT_VERSION = 1;
constexpr size_t HEADER_LEN = 32;
constexpr size_t ETH_LEN = 14, IP_LEN = 20, UDP_LEN = 8;
constexpr size_t L2_L4_LEN = ETH_LEN + IP_LEN + UDP_LEN;
constexpr uint8_t MSG_SCATTER = 1, MSG_GATHER = 2;
constexpr uint8_t FLAG_LAST = 0x01, FLAG_NONFINITE = 0x02;
constexpr uint8_t FLAGS_KNOWN = FLAG_LAST | FLAG_NONFINITE;

// ubt.proposal_word: with NicParams.exp_inband the `reserved` field carries the sender's
// exponent proposal for op_id + lead: bits 15..8 an int8, bit 0 set when there is one.
constexpr uint16_t PROPOSAL_PRESENT = 0x0001;
inline uint16_t proposal_word(bool present, int proposal) {
    return present ? static_cast<uint16_t>(((proposal & 0xFF) << 8) | PROPOSAL_PRESENT) : 0;
}
inline bool proposal_word_ok(uint16_t w) { return w == 0 || (w & 0xFF) == PROPOSAL_PRESENT; }
inline bool proposal_present(uint16_t w) { return w & PROPOSAL_PRESENT; }
inline int proposal_value(uint16_t w) { return static_cast<int8_t>(w >> 8); }

// ubt.DROP_REASONS, in its order (the register bank's counter order).
enum Drop : int {
    DROP_TRUNCATED,
    DROP_NOT_IPV4,
    DROP_BAD_IP_HEADER,
    DROP_BAD_IP_CHECKSUM,
    DROP_IP_FRAGMENT,
    DROP_NOT_UDP,
    DROP_WRONG_ADDRESS,
    DROP_WRONG_PORT,
    DROP_BAD_UDP_LENGTH,
    DROP_BAD_VERSION,
    DROP_BAD_TYPE,
    DROP_MALFORMED_HEADER,
    DROP_WRONG_JOB,
    DROP_UNKNOWN_RANK,
    DROP_OWN_RANK,
    DROP_BAD_LENGTH,
    DROP_STALE_OP,
    DROP_FUTURE_OP,
    DROP_INDEX_OUT_OF_RANGE,
    DROP_WRONG_OWNER,
    DROP_EXPONENT_MISMATCH,
    DROP_LATE,
    DROP_DUPLICATE,
    N_DROPS,
    OK = -1,
};
extern const char* const DROP_NAMES[N_DROPS];

// ubt.FIELDS, in wire order.
struct Header {
    uint8_t version = UBT_VERSION;
    uint8_t msg_type = 0;
    uint8_t flags = 0;
    int8_t exponent = 0;
    uint16_t job_id = 0;
    uint16_t sender = 0;
    uint32_t op_id = 0;
    uint32_t pkt_index = 0;
    uint16_t count = 0;
    uint16_t contributors = 0;
    uint32_t t_c_us = 0;
    uint32_t op_len = 0;
    uint16_t world = 0;
    uint16_t reserved = 0;
};

Header unpack_header(const uint8_t* d);        // d: HEADER_LEN bytes
void pack_header(const Header& h, uint8_t* d);  // d: HEADER_LEN bytes

// ubt.Addressing: MAC mac_base + rank, IPv4 ip_base + rank + 1.
struct Addressing {
    uint64_t mac_base = 0x024F52000000ull;
    uint32_t ip_base = (198u << 24) | (18u << 16);
    void mac(int rank, uint8_t* out6) const;
    uint32_t ip(int rank) const { return ip_base + static_cast<uint32_t>(rank) + 1; }
};

// ubt.ipv4_checksum: RFC 1071 sum of a 20-byte header (0 over a header with a good checksum).
uint16_t ipv4_checksum(const uint8_t* hdr20);

inline size_t frame_len(size_t count) { return L2_L4_LEN + HEADER_LEN + 4 * count; }

// ubt.build_frame with the payload from int32 values: frame_len(h.count) bytes into out.
void build_frame(const Header& h, const int32_t* values, int src, int dst, uint16_t port,
                 const Addressing& a, uint8_t* out);

struct Parsed {
    Header h;
    const uint8_t* payload = nullptr;  // 4 * h.count big-endian int32 bytes
};

// ubt.parse_frame: L2-L4 checks for a frame addressed to `rank`, then parse_ubt.
// inband (NicParams.exp_inband): `reserved` may carry a proposal word.
int parse_frame(const uint8_t* f, size_t n, uint16_t port, int rank, const Addressing& a,
                Parsed& out, bool inband = false);
// ubt.parse_ubt: the header's own consistency and the payload length of a UDP payload.
int parse_ubt(const uint8_t* d, size_t n, Parsed& out, bool inband = false);

inline int32_t payload_value(const uint8_t* payload, size_t i) {
    const uint8_t* b = payload + 4 * i;
    return static_cast<int32_t>((uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
                                (uint32_t{b[2]} << 8) | uint32_t{b[3]});
}

// The payload's byte order in one pass each, vectorised (AVX-512/AVX2 where the CPU has them):
// n big-endian int32 into out (i32, or widened to i64), added into acc, or written from v.
void payload_to_i32(const uint8_t* payload, size_t n, int32_t* out);
void payload_to_i64(const uint8_t* payload, size_t n, int64_t* out);
void payload_add_i64(const uint8_t* payload, size_t n, int64_t* acc);
void i32_to_payload(const int32_t* v, size_t n, uint8_t* payload);

// frame_checks.check_peer: our job, a known peer, its world size. OK or a drop code.
int check_peer(const Header& h, int job_id, int rank, int world);
// frame_checks.check_op: payload count, op length, window [base, base + rx_window), index
// range (NicParams.packets_for, from p and b) and ownership. OK or a drop code.
int check_op(const Header& h, int p, int64_t c, int64_t b, int rank, int world, int64_t base,
             int64_t rx_window);

}  // namespace optireduce
