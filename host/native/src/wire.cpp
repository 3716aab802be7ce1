// UBT v1 header, frames and receiver checks: see wire.hpp; the Python reference is
// optireduce/ubt.py and optireduce/frame_checks.py, check for check in the same order.
#include "wire.hpp"

#include "clones.hpp"

#include <algorithm>
#include <cstring>

namespace optireduce {

const char* const DROP_NAMES[N_DROPS] = {
    "truncated",        "not_ipv4",    "bad_ip_header",  "bad_ip_checksum",
    "ip_fragment",      "not_udp",     "wrong_address",  "wrong_port",
    "bad_udp_length",   "bad_version", "bad_type",       "malformed_header",
    "wrong_job",        "unknown_rank", "own_rank",      "bad_length",
    "stale_op",         "future_op",   "index_out_of_range", "wrong_owner",
    "exponent_mismatch", "late",       "duplicate",
};

namespace {

uint16_t be16(const uint8_t* d) { return static_cast<uint16_t>((d[0] << 8) | d[1]); }
uint32_t be32(const uint8_t* d) {
    return (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) | d[3];
}
void put16(uint8_t* d, uint16_t v) {
    d[0] = static_cast<uint8_t>(v >> 8);
    d[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* d, uint32_t v) {
    d[0] = static_cast<uint8_t>(v >> 24);
    d[1] = static_cast<uint8_t>(v >> 16);
    d[2] = static_cast<uint8_t>(v >> 8);
    d[3] = static_cast<uint8_t>(v);
}

}  // namespace

Header unpack_header(const uint8_t* d) {
    Header h;
    h.version = d[0];
    h.msg_type = d[1];
    h.flags = d[2];
    h.exponent = static_cast<int8_t>(d[3]);
    h.job_id = be16(d + 4);
    h.sender = be16(d + 6);
    h.op_id = be32(d + 8);
    h.pkt_index = be32(d + 12);
    h.count = be16(d + 16);
    h.contributors = be16(d + 18);
    h.t_c_us = be32(d + 20);
    h.op_len = be32(d + 24);
    h.world = be16(d + 28);
    h.reserved = be16(d + 30);
    return h;
}

void pack_header(const Header& h, uint8_t* d) {
    d[0] = h.version;
    d[1] = h.msg_type;
    d[2] = h.flags;
    d[3] = static_cast<uint8_t>(h.exponent);
    put16(d + 4, h.job_id);
    put16(d + 6, h.sender);
    put32(d + 8, h.op_id);
    put32(d + 12, h.pkt_index);
    put16(d + 16, h.count);
    put16(d + 18, h.contributors);
    put32(d + 20, h.t_c_us);
    put32(d + 24, h.op_len);
    put16(d + 28, h.world);
    put16(d + 30, h.reserved);
}

void Addressing::mac(int rank, uint8_t* out6) const {
    const uint64_t m = mac_base + static_cast<uint64_t>(rank);
    for (int k = 0; k < 6; ++k) out6[k] = static_cast<uint8_t>(m >> (8 * (5 - k)));
}

uint16_t ipv4_checksum(const uint8_t* hdr20) {
    uint32_t s = 0;
    for (int k = 0; k < 20; k += 2) s += be16(hdr20 + k);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    return static_cast<uint16_t>(~s & 0xFFFF);
}

namespace {
// ipv4_checksum of the header build_frame writes, from its fields: reading the header back
// right after writing it stalls (the load cannot be forwarded from the pending narrow stores).
uint16_t frame_checksum(size_t ip_len, uint32_t src_ip, uint32_t dst_ip) {
    uint32_t s = 0x4500 + static_cast<uint32_t>(ip_len) + 0x4000 + (64u << 8 | 17u);
    s += (src_ip >> 16) + (src_ip & 0xFFFF) + (dst_ip >> 16) + (dst_ip & 0xFFFF);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    return static_cast<uint16_t>(~s & 0xFFFF);
}
}  // namespace

void build_frame(const Header& h, const int32_t* values, int src, int dst, uint16_t port,
                 const Addressing& a, uint8_t* out) {
    const size_t udp_len = UDP_LEN + HEADER_LEN + 4 * size_t{h.count};
    const size_t ip_len = IP_LEN + udp_len;
    a.mac(dst, out);
    a.mac(src, out + 6);
    put16(out + 12, 0x0800);
    uint8_t* ip = out + ETH_LEN;
    ip[0] = 0x45;
    ip[1] = 0;
    put16(ip + 2, static_cast<uint16_t>(ip_len));
    put16(ip + 4, 0);       // identification
    put16(ip + 6, 0x4000);  // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    put16(ip + 10, frame_checksum(ip_len, a.ip(src), a.ip(dst)));
    put32(ip + 12, a.ip(src));
    put32(ip + 16, a.ip(dst));
    uint8_t* udp = ip + IP_LEN;
    put16(udp, port);
    put16(udp + 2, port);
    put16(udp + 4, static_cast<uint16_t>(udp_len));
    put16(udp + 6, 0);
    pack_header(h, udp + UDP_LEN);
    i32_to_payload(values, h.count, udp + UDP_LEN + HEADER_LEN);
}

namespace {
uint32_t load_be(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}
}  // namespace

// A packet's values go to its slot in an op-sized buffer: a cold destination at a new place
// for every packet, where the hardware prefetcher ramps up again and stops at every 4 KiB page.
// These loops request the destination PF_AHEAD bytes ahead, PF_STEP bytes per step (16 KiB
// packets into a 16 MiB buffer in random order, microbenchmark: 9 -> 15 GB/s).
constexpr size_t PF_STEP = 1024, PF_AHEAD = 2048;

// Prefetch (for writing) the step PF_AHEAD bytes after element o of dst[0 .. n), if inside.
template <class T>
inline __attribute__((always_inline)) void prefetch_ahead(const T* dst, size_t o, size_t n) {
    const char* at = reinterpret_cast<const char*>(dst + o) + PF_AHEAD;
    if (at + PF_STEP > reinterpret_cast<const char*>(dst + n)) return;
    for (size_t l = 0; l < PF_STEP; l += 64) __builtin_prefetch(at + l, 1, 3);
}

OR_CLONES void payload_to_i32(const uint8_t* __restrict payload, size_t n,
                              int32_t* __restrict out) {
    constexpr size_t step = PF_STEP / sizeof(int32_t);
    for (size_t o = 0; o < n; o += step) {
        prefetch_ahead(out, o, n);
        const size_t end = std::min(n, o + step);
        for (size_t i = o; i < end; ++i) out[i] = static_cast<int32_t>(load_be(payload + 4 * i));
    }
}

OR_CLONES void payload_to_i64(const uint8_t* __restrict payload, size_t n,
                              int64_t* __restrict out) {
    constexpr size_t step = PF_STEP / sizeof(int64_t);
    for (size_t o = 0; o < n; o += step) {
        prefetch_ahead(out, o, n);
        const size_t end = std::min(n, o + step);
        for (size_t i = o; i < end; ++i) out[i] = static_cast<int32_t>(load_be(payload + 4 * i));
    }
}

OR_CLONES void payload_add_i64(const uint8_t* __restrict payload, size_t n,
                               int64_t* __restrict acc) {
    constexpr size_t step = PF_STEP / sizeof(int64_t);
    for (size_t o = 0; o < n; o += step) {
        prefetch_ahead(acc, o, n);
        const size_t end = std::min(n, o + step);
        for (size_t i = o; i < end; ++i) acc[i] += static_cast<int32_t>(load_be(payload + 4 * i));
    }
}

OR_CLONES void i32_to_payload(const int32_t* __restrict v, size_t n,
                              uint8_t* __restrict payload) {
    for (size_t i = 0; i < n; ++i) {
        const uint32_t be = __builtin_bswap32(static_cast<uint32_t>(v[i]));
        std::memcpy(payload + 4 * i, &be, 4);
    }
}

int parse_frame(const uint8_t* f, size_t n, uint16_t port, int rank, const Addressing& a,
                Parsed& out, bool inband) {
    if (n < L2_L4_LEN) return DROP_TRUNCATED;
    if (f[12] != 0x08 || f[13] != 0x00) return DROP_NOT_IPV4;
    const uint8_t* ip = f + ETH_LEN;
    if (ip[0] != 0x45) return DROP_BAD_IP_HEADER;
    if (ipv4_checksum(ip) != 0) return DROP_BAD_IP_CHECKSUM;
    const size_t ip_len = be16(ip + 2);
    if (ip_len < IP_LEN + UDP_LEN || ETH_LEN + ip_len > n) return DROP_TRUNCATED;
    if (be16(ip + 6) & 0x3FFF) return DROP_IP_FRAGMENT;
    if (ip[9] != 17) return DROP_NOT_UDP;
    uint8_t mac[6];
    a.mac(rank, mac);
    if (std::memcmp(f, mac, 6) != 0 || be32(ip + 16) != a.ip(rank)) return DROP_WRONG_ADDRESS;
    const uint8_t* udp = ip + IP_LEN;
    if (be16(udp + 2) != port) return DROP_WRONG_PORT;
    if (be16(udp + 4) != ip_len - IP_LEN) return DROP_BAD_UDP_LENGTH;
    return parse_ubt(f + L2_L4_LEN, ETH_LEN + ip_len - L2_L4_LEN, out, inband);
}

int parse_ubt(const uint8_t* d, size_t n, Parsed& out, bool inband) {
    if (n < HEADER_LEN) return DROP_TRUNCATED;
    const Header h = unpack_header(d);
    if (h.version != UBT_VERSION) return DROP_BAD_VERSION;
    if (h.msg_type != MSG_SCATTER && h.msg_type != MSG_GATHER) return DROP_BAD_TYPE;
    if (h.flags & ~FLAGS_KNOWN) return DROP_MALFORMED_HEADER;
    if (inband ? !proposal_word_ok(h.reserved) : h.reserved != 0) return DROP_MALFORMED_HEADER;
    if ((h.msg_type == MSG_SCATTER) != (h.contributors == 0)) return DROP_MALFORMED_HEADER;
    if (h.contributors > h.world || h.t_c_us == 0) return DROP_MALFORMED_HEADER;
    if (n != HEADER_LEN + 4 * size_t{h.count}) return DROP_BAD_LENGTH;
    out.h = h;
    out.payload = d + HEADER_LEN;
    return OK;
}

int check_peer(const Header& h, int job_id, int rank, int world) {
    if (h.job_id != job_id) return DROP_WRONG_JOB;
    if (h.sender >= world) return DROP_UNKNOWN_RANK;
    if (h.sender == rank) return DROP_OWN_RANK;
    if (h.world != world) return DROP_MALFORMED_HEADER;
    return OK;
}

int check_op(const Header& h, int p, int64_t c, int64_t b, int rank, int world, int64_t base,
             int64_t rx_window) {
    if (h.count != p || h.op_len < 1 || int64_t{h.op_len} > c) return DROP_BAD_LENGTH;
    if (int64_t{h.op_id} < base) return DROP_STALE_OP;
    if (int64_t{h.op_id} >= base + rx_window) return DROP_FUTURE_OP;
    const int64_t blocks = (int64_t{h.op_len} + b - 1) / b;
    const int64_t packets = (blocks < 1 ? 1 : blocks) * b / p;
    if (int64_t{h.pkt_index} >= packets) return DROP_INDEX_OUT_OF_RANGE;
    const int owner = static_cast<int>(h.pkt_index % static_cast<uint32_t>(world));
    if (owner != (h.msg_type == MSG_SCATTER ? rank : int{h.sender})) return DROP_WRONG_OWNER;
    return OK;
}

}  // namespace optireduce
