// UBT datagrams between ranks over one UDP socket per rank (IPv4), batched with
// recvmmsg/sendmmsg: the native twin of host/transport.py's socket half.
//
// Admission happens here, before the engine sees a byte: a datagram whose source address is
// not a member of the peers table is counted (not_member) and dropped; one from a member
// whose UBT header names another sender is counted (wrong_sender) and dropped. Everything
// else goes to the engine, which does the protocol's own checks. No locks: one thread owns a
// transport (the live engine thread).
//
// Where the kernel has them (Linux 4.18 / 5.0), UDP GSO and GRO: send_batch puts up to 64 KiB
// of equal-length datagrams to one peer in one message (UDP_SEGMENT), and the socket takes
// coalesced datagrams (UDP_GRO), which recv_batch splits again at the segment size. On the
// wire nothing changes: the kernel (or the NIC) cuts them into the same datagrams. Measured on
// loopback, 16 KiB datagrams: kernel CPU per GB sent and received 0.35 -> 0.30 s.
// OPTIREDUCE_UDP_GSO=0 turns both off.
//
// Keyed jobs (set_key, docs/security.md): every datagram sent gets its header's tag appended
// (header_tag.hpp); one received from a member without the right tag is counted (bad_tag)
// and dropped, and the tag is cut off before the engine sees the datagram.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "header_tag.hpp"

namespace optireduce {

// An IPv4 address and UDP port, host byte order.
struct PeerAddr {
    uint32_t ip = 0;
    uint16_t port = 0;
    uint64_t key() const { return (uint64_t{ip} << 16) | port; }
};
PeerAddr parse_peer(const std::string& ip, int port);  // throws std::invalid_argument
std::string ip_string(uint32_t ip);

// The transport's counters by name (TRANSPORT_COUNTER_NAMES, in this order).
enum TransportCounter : int {
    T_RX_DATAGRAMS,  // admitted and handed on
    T_TX_DATAGRAMS,  // accepted by the kernel
    T_NOT_MEMBER,    // source address not in the peers table
    T_WRONG_SENDER,  // a member's address, another rank in the header
    T_RX_OVERSIZE,   // longer than the largest UBT datagram of these params (cut by the kernel)
    T_TX_AGAIN,      // sendmmsg stopped at a full send buffer (retried later, not lost)
    T_TX_ERRORS,     // sendmmsg failed otherwise: the datagram is dropped
    T_RX_SYSCALLS,
    T_TX_SYSCALLS,
    T_TX_RESENT,     // sent again after a partial GSO batch (the receiver drops the duplicate)
    T_BAD_TAG,       // a keyed job's datagram from a member without the right tag
    N_TRANSPORT_COUNTERS,
};
extern const char* const TRANSPORT_COUNTER_NAMES[N_TRANSPORT_COUNTERS];

struct Datagram {
    const uint8_t* data;
    size_t len;
    int rank;            // the admitted sender
    int64_t arrival_ns;  // kernel receive time (CLOCK_REALTIME, SO_TIMESTAMPNS); 0 if none
};

struct OutDatagram {
    int dst;
    const uint8_t* data;
    size_t len;
};

class UdpTransport;

// A transport on (a dup of) the bound socket adopt_fd when >= 0, else a new socket bound to
// bind_ip:port; keyed with `key` (the live NIC's and the reliable baselines' one way in).
std::unique_ptr<UdpTransport> open_transport(int adopt_fd, const std::string& bind_ip, int port,
                                             int buffer_bytes, size_t max_datagram,
                                             const JobKey& key);

class UdpTransport {
public:
    static constexpr size_t BATCH = 64;  // messages per recvmmsg / sendmmsg call
    static constexpr size_t GRO_BATCH = 24;  // per recvmmsg with GRO (up to 64 KiB each)
    static constexpr size_t MAX_SEGMENTS = 64;  // datagrams per GSO message (the kernel's limit)

    // A new socket bound to ip:port (port 0: the kernel picks). buffer_bytes is asked for
    // both SO_RCVBUF and SO_SNDBUF (the ...FORCE variants first, which root may use past
    // net.core.{r,w}mem_max); rcvbuf()/sndbuf() say what the kernel granted.
    UdpTransport(const std::string& ip, int port, int buffer_bytes, size_t max_datagram);
    // Adopts a bound UDP socket (a dup of fd: the caller keeps and closes its own).
    UdpTransport(int fd, int buffer_bytes, size_t max_datagram);
    ~UdpTransport();
    UdpTransport(const UdpTransport&) = delete;
    UdpTransport& operator=(const UdpTransport&) = delete;

    int fd() const { return fd_; }
    PeerAddr local() const { return local_; }
    int rcvbuf() const { return rcvbuf_; }
    int sndbuf() const { return sndbuf_; }

    // Every rank's address, index = rank (our own included).
    void set_peers(const std::vector<PeerAddr>& peers, int own_rank);
    const std::vector<PeerAddr>& peers() const { return peers_; }
    // The job's key (none: an unkeyed job, the default).
    void set_key(const JobKey& key);
    bool keyed() const { return key_.has_value(); }

    // One non-blocking recvmmsg: the admitted datagrams (valid until the next call) in out;
    // returns how many the kernel gave (admitted or not), 0 when nothing was queued.
    size_t recv_batch(std::vector<Datagram>& out);
    // sendmmsg of items[0..n): how many were taken (n unless a full buffer stopped it;
    // a datagram the kernel refused with another error counts as taken and as tx_errors).
    // With GSO, datagrams to one peer go in one message, so a full buffer may stop the batch
    // with some datagrams after the first one not taken already sent: the caller sends them
    // again (counted in tx_resent; the receiver drops the duplicates).
    size_t send_batch(const OutDatagram* items, size_t n);
    bool gso() const { return gso_; }
    bool gro() const { return gro_; }

    const int64_t* counters() const { return counters_; }

private:
    void setup(int buffer_bytes, size_t max_datagram);
    int lookup(uint64_t key);
    size_t send_plain(const OutDatagram* items, size_t n);
    size_t send_gso(const OutDatagram* items, size_t n);
    // The iovecs of item i (its bytes, and its tag in a keyed job) from iov on; how many.
    size_t put_iov(const OutDatagram& o, size_t i, iovec* iov);
    void admit(const uint8_t* d, size_t len, int rank, int64_t arrival, std::vector<Datagram>& out);

    int fd_ = -1;
    PeerAddr local_;
    int rcvbuf_ = 0, sndbuf_ = 0;
    int own_rank_ = -1;
    size_t slot_ = 0;  // bytes per receive slot: max datagram + 1 (to see an oversize one)
    std::vector<PeerAddr> peers_;
    std::vector<sockaddr_in> peer_sa_;
    int last_hit_ = 0;
    std::vector<uint8_t> rx_buf_;
    std::vector<mmsghdr> rx_msgs_, tx_msgs_;
    std::vector<iovec> rx_iov_, tx_iov_;
    std::vector<sockaddr_in> rx_from_;
    std::vector<uint8_t> rx_ctrl_;  // SO_TIMESTAMPNS and UDP_GRO control messages per slot
    size_t rx_msgs_n_ = BATCH;
    size_t max_datagram_ = 0;
    bool gso_ = false, gro_ = false;
    // GSO: one control message per tx message, and which message each item of a batch went in
    std::vector<uint8_t> tx_ctrl_;
    std::vector<uint32_t> item_msg_;
    std::optional<TagKey> key_;
    std::vector<uint8_t> tx_tags_;  // keyed: the tags of the batch being sent, TAG_LEN each
    int64_t counters_[N_TRANSPORT_COUNTERS] = {};
};

}  // namespace optireduce
