// One UDP socket per rank, batched: see transport.hpp.
#include "transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace optireduce {

const char* const TRANSPORT_COUNTER_NAMES[N_TRANSPORT_COUNTERS] = {
    "rx_datagrams", "tx_datagrams", "not_member",   "wrong_sender",  "rx_oversize",
    "tx_again",     "tx_errors",    "rx_syscalls",  "tx_syscalls",
};

namespace {

[[noreturn]] void fail(const char* what) {
    throw std::system_error(errno, std::generic_category(), what);
}

// The sender field of a UBT header (bytes 6..7, big-endian).
constexpr size_t SENDER_OFFSET = 6;
constexpr size_t CTRL_BYTES = CMSG_SPACE(sizeof(timespec));

}  // namespace

PeerAddr parse_peer(const std::string& ip, int port) {
    in_addr a{};
    if (inet_pton(AF_INET, ip.c_str(), &a) != 1)
        throw std::invalid_argument("'" + ip + "' is not an IPv4 address");
    if (port < 0 || port > 65535)
        throw std::invalid_argument("port " + std::to_string(port) + " outside 0..65535");
    return PeerAddr{ntohl(a.s_addr), static_cast<uint16_t>(port)};
}

std::string ip_string(uint32_t ip) {
    in_addr a{};
    a.s_addr = htonl(ip);
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &a, buf, sizeof buf);
    return buf;
}

UdpTransport::UdpTransport(const std::string& ip, int port, int buffer_bytes,
                           size_t max_datagram) {
    const PeerAddr want = parse_peer(ip, port);
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail("socket");
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(want.ip);
    sa.sin_port = htons(want.port);
    try {
        // buffers before bind, so that nothing queued meanwhile is cut by a small default
        setup(buffer_bytes, max_datagram);
        if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) fail("bind");
        socklen_t len = sizeof sa;
        if (getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) fail("getsockname");
    } catch (...) {
        close(fd_);
        throw;
    }
    local_ = PeerAddr{ntohl(sa.sin_addr.s_addr), ntohs(sa.sin_port)};
}

UdpTransport::UdpTransport(int fd, int buffer_bytes, size_t max_datagram) {
    fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) fail("dup");
    try {
        int type = 0;
        socklen_t tl = sizeof type;
        sockaddr_in sa{};
        socklen_t len = sizeof sa;
        if (getsockopt(fd_, SOL_SOCKET, SO_TYPE, &type, &tl) != 0) fail("getsockopt(SO_TYPE)");
        if (getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) fail("getsockname");
        if (type != SOCK_DGRAM || sa.sin_family != AF_INET)
            throw std::invalid_argument("adopted socket is not a bound IPv4 UDP socket");
        const int fl = fcntl(fd_, F_GETFL);
        if (fl < 0 || fcntl(fd_, F_SETFL, fl | O_NONBLOCK) != 0) fail("fcntl(O_NONBLOCK)");
        setup(buffer_bytes, max_datagram);
        local_ = PeerAddr{ntohl(sa.sin_addr.s_addr), ntohs(sa.sin_port)};
    } catch (...) {
        close(fd_);
        throw;
    }
}

UdpTransport::~UdpTransport() {
    if (fd_ >= 0) close(fd_);
}

void UdpTransport::setup(int buffer_bytes, size_t max_datagram) {
    if (max_datagram < 1 || max_datagram > 65507)
        throw std::invalid_argument("max_datagram must be in 1..65507");
    if (buffer_bytes > 0) {
        // FORCE passes net.core.*mem_max (root or CAP_NET_ADMIN); the plain option is capped
        if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &buffer_bytes, sizeof buffer_bytes) != 0)
            setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
        if (setsockopt(fd_, SOL_SOCKET, SO_SNDBUFFORCE, &buffer_bytes, sizeof buffer_bytes) != 0)
            setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    }
    socklen_t l = sizeof rcvbuf_;
    getsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf_, &l);
    l = sizeof sndbuf_;
    getsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &sndbuf_, &l);

    // Each datagram's arrival time: the engine thread may read it late (descheduled on a
    // busy host), and a phase must not end for data that was already here.
    const int on = 1;
    if (setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) != 0)
        fail("setsockopt(SO_TIMESTAMPNS)");
    slot_ = (max_datagram + 1 + 63) & ~size_t{63};
    rx_buf_.assign(BATCH * slot_, 0);
    rx_msgs_.assign(BATCH, mmsghdr{});
    rx_iov_.assign(BATCH, iovec{});
    rx_from_.assign(BATCH, sockaddr_in{});
    rx_ctrl_.assign(BATCH * CTRL_BYTES, 0);
    tx_msgs_.assign(BATCH, mmsghdr{});
    tx_iov_.assign(BATCH, iovec{});
    for (size_t i = 0; i < BATCH; ++i) {
        rx_iov_[i] = iovec{rx_buf_.data() + i * slot_, slot_};
        msghdr& h = rx_msgs_[i].msg_hdr;
        h.msg_iov = &rx_iov_[i];
        h.msg_iovlen = 1;
        h.msg_name = &rx_from_[i];
        h.msg_namelen = sizeof(sockaddr_in);
        h.msg_control = rx_ctrl_.data() + i * CTRL_BYTES;
        h.msg_controllen = CTRL_BYTES;
    }
}

void UdpTransport::set_peers(const std::vector<PeerAddr>& peers, int own_rank) {
    if (own_rank < 0 || own_rank >= static_cast<int>(peers.size()))
        throw std::invalid_argument("set_peers: own rank outside the table");
    for (size_t i = 0; i < peers.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            if (peers[i].key() == peers[j].key())
                throw std::invalid_argument("set_peers: ranks " + std::to_string(j) + " and " +
                                            std::to_string(i) + " have the same address");
    peers_ = peers;
    own_rank_ = own_rank;
    peer_sa_.assign(peers.size(), sockaddr_in{});
    for (size_t i = 0; i < peers.size(); ++i) {
        peer_sa_[i].sin_family = AF_INET;
        peer_sa_[i].sin_addr.s_addr = htonl(peers[i].ip);
        peer_sa_[i].sin_port = htons(peers[i].port);
    }
    last_hit_ = 0;
}

int UdpTransport::lookup(uint64_t key) {
    const int n = static_cast<int>(peers_.size());
    if (n == 0) return -1;
    if (last_hit_ < n && peers_[last_hit_].key() == key) return last_hit_;
    for (int r = 0; r < n; ++r)
        if (peers_[r].key() == key) return last_hit_ = r;
    return -1;
}

size_t UdpTransport::recv_batch(std::vector<Datagram>& out) {
    out.clear();
    for (size_t i = 0; i < BATCH; ++i) {
        rx_msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        rx_msgs_[i].msg_hdr.msg_flags = 0;
        rx_msgs_[i].msg_hdr.msg_controllen = CTRL_BYTES;
    }
    const int got = recvmmsg(fd_, rx_msgs_.data(), BATCH, MSG_DONTWAIT, nullptr);
    counters_[T_RX_SYSCALLS] += 1;
    if (got <= 0) {
        if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ECONNREFUSED)
            fail("recvmmsg");
        return 0;
    }
    for (int i = 0; i < got; ++i) {
        const mmsghdr& m = rx_msgs_[i];
        const sockaddr_in& from = rx_from_[i];
        const PeerAddr src{ntohl(from.sin_addr.s_addr), ntohs(from.sin_port)};
        const int rank = from.sin_family == AF_INET ? lookup(src.key()) : -1;
        if (rank < 0) {
            counters_[T_NOT_MEMBER] += 1;
            continue;
        }
        if ((m.msg_hdr.msg_flags & MSG_TRUNC) || m.msg_len >= slot_) {
            counters_[T_RX_OVERSIZE] += 1;
            continue;
        }
        const uint8_t* d = rx_buf_.data() + i * slot_;
        if (m.msg_len >= SENDER_OFFSET + 2) {
            const int sender = (d[SENDER_OFFSET] << 8) | d[SENDER_OFFSET + 1];
            if (sender != rank) {
                counters_[T_WRONG_SENDER] += 1;
                continue;
            }
        }
        int64_t arrival = 0;
        for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg_hdr); c != nullptr;
             c = CMSG_NXTHDR(const_cast<msghdr*>(&m.msg_hdr), c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                timespec ts;
                std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
                arrival = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
            }
        }
        counters_[T_RX_DATAGRAMS] += 1;
        out.push_back(Datagram{d, m.msg_len, rank, arrival});
    }
    return static_cast<size_t>(got);
}

size_t UdpTransport::send_batch(const OutDatagram* items, size_t n) {
    size_t done = 0;
    while (done < n) {
        const size_t k = std::min(n - done, BATCH);
        for (size_t i = 0; i < k; ++i) {
            const OutDatagram& o = items[done + i];
            if (o.dst < 0 || o.dst >= static_cast<int>(peer_sa_.size()))
                throw std::logic_error("send_batch: no address for rank " + std::to_string(o.dst));
            tx_iov_[i] = iovec{const_cast<uint8_t*>(o.data), o.len};
            msghdr& h = tx_msgs_[i].msg_hdr;
            h = msghdr{};
            h.msg_name = &peer_sa_[o.dst];
            h.msg_namelen = sizeof(sockaddr_in);
            h.msg_iov = &tx_iov_[i];
            h.msg_iovlen = 1;
        }
        const int sent = sendmmsg(fd_, tx_msgs_.data(), static_cast<unsigned>(k), 0);
        counters_[T_TX_SYSCALLS] += 1;
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                counters_[T_TX_AGAIN] += 1;
                return done;
            }
            if (errno == EINTR) continue;
            // e.g. ECONNREFUSED from an earlier ICMP: this datagram is lost, go on
            counters_[T_TX_ERRORS] += 1;
            done += 1;
            continue;
        }
        counters_[T_TX_DATAGRAMS] += sent;
        done += static_cast<size_t>(sent);
    }
    return done;
}

}  // namespace optireduce
