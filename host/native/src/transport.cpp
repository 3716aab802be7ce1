// One UDP socket per rank, batched: see transport.hpp.
#include "transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace optireduce {

const char* const TRANSPORT_COUNTER_NAMES[N_TRANSPORT_COUNTERS] = {
    "rx_datagrams", "tx_datagrams", "not_member",   "wrong_sender",  "rx_oversize",
    "tx_again",     "tx_errors",    "rx_syscalls",  "tx_syscalls",  "tx_resent",
    "bad_tag",
};

namespace {

[[noreturn]] void fail(const char* what) {
    throw std::system_error(errno, std::generic_category(), what);
}

// The sender field of a UBT header (bytes 6..7, big-endian).
constexpr size_t SENDER_OFFSET = 6;
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
constexpr size_t CTRL_BYTES = CMSG_SPACE(sizeof(timespec)) + CMSG_SPACE(sizeof(int));
constexpr size_t GSO_CTRL_BYTES = CMSG_SPACE(sizeof(uint16_t));
constexpr size_t MAX_UDP_PAYLOAD = 65507;  // IPv4: 65535 - 20 - 8, also for a GSO message

bool gso_wanted() {
    const char* v = std::getenv("OPTIREDUCE_UDP_GSO");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

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
    if (fd_ < 0) return;
    if (gro_) {  // an adopted socket goes back to its owner as it came (no coalescing)
        const int off = 0;
        setsockopt(fd_, SOL_UDP, UDP_GRO, &off, sizeof off);
    }
    close(fd_);
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
    max_datagram_ = max_datagram;
    if (gso_wanted()) {
        // GSO: the option's getter answers where the kernel has it; GRO: the setter
        int seg = 0;
        socklen_t sl = sizeof seg;
        gso_ = getsockopt(fd_, SOL_UDP, UDP_SEGMENT, &seg, &sl) == 0;
        gro_ = setsockopt(fd_, SOL_UDP, UDP_GRO, &on, sizeof on) == 0;
    }
    // with GRO a message holds up to 64 KiB of coalesced datagrams; without, one datagram
    // (+1 byte to see an oversize one)
    slot_ = gro_ ? size_t{65536} : (max_datagram + TAG_LEN + 1 + 63) & ~size_t{63};
    rx_msgs_n_ = gro_ ? GRO_BATCH : BATCH;
    rx_buf_.assign(rx_msgs_n_ * slot_, 0);
    rx_msgs_.assign(rx_msgs_n_, mmsghdr{});
    rx_iov_.assign(rx_msgs_n_, iovec{});
    rx_from_.assign(rx_msgs_n_, sockaddr_in{});
    rx_ctrl_.assign(rx_msgs_n_ * CTRL_BYTES, 0);
    tx_msgs_.assign(BATCH, mmsghdr{});
    tx_iov_.assign(BATCH * MAX_SEGMENTS * 2, iovec{});  // a keyed datagram's tag is the 2nd
    tx_ctrl_.assign(BATCH * GSO_CTRL_BYTES, 0);
    for (size_t i = 0; i < rx_msgs_n_; ++i) {
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

std::unique_ptr<UdpTransport> open_transport(int adopt_fd, const std::string& bind_ip, int port,
                                             int buffer_bytes, size_t max_datagram,
                                             const JobKey& key) {
    auto t = adopt_fd >= 0
                 ? std::make_unique<UdpTransport>(adopt_fd, buffer_bytes, max_datagram)
                 : std::make_unique<UdpTransport>(bind_ip, port, buffer_bytes, max_datagram);
    t->set_key(key);
    return t;
}

void UdpTransport::set_key(const JobKey& key) {
    if (key && max_datagram_ + TAG_LEN > MAX_UDP_PAYLOAD)
        throw std::invalid_argument("a keyed job's datagrams carry an 8-byte tag: max_datagram "
                                    "must be at most 65499");
    if (key)
        key_ = tag_key(key->data());
    else
        key_.reset();
}

int UdpTransport::lookup(uint64_t key) {
    const int n = static_cast<int>(peers_.size());
    if (n == 0) return -1;
    if (last_hit_ < n && peers_[last_hit_].key() == key) return last_hit_;
    for (int r = 0; r < n; ++r)
        if (peers_[r].key() == key) return last_hit_ = r;
    return -1;
}

void UdpTransport::admit(const uint8_t* d, size_t len, int rank, int64_t arrival,
                         std::vector<Datagram>& out) {
    if (rank < 0) {
        counters_[T_NOT_MEMBER] += 1;
        return;
    }
    if (len > max_datagram_ + (key_ ? TAG_LEN : 0)) {
        counters_[T_RX_OVERSIZE] += 1;
        return;
    }
    if (key_) {
        if (len < TAG_LEN || !tag_ok(*key_, d, len)) {
            counters_[T_BAD_TAG] += 1;
            return;
        }
        len -= TAG_LEN;
    }
    if (len >= SENDER_OFFSET + 2) {
        const int sender = (d[SENDER_OFFSET] << 8) | d[SENDER_OFFSET + 1];
        if (sender != rank) {
            counters_[T_WRONG_SENDER] += 1;
            return;
        }
    }
    counters_[T_RX_DATAGRAMS] += 1;
    out.push_back(Datagram{d, len, rank, arrival});
}

size_t UdpTransport::recv_batch(std::vector<Datagram>& out) {
    out.clear();
    for (size_t i = 0; i < rx_msgs_n_; ++i) {
        rx_msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        rx_msgs_[i].msg_hdr.msg_flags = 0;
        rx_msgs_[i].msg_hdr.msg_controllen = CTRL_BYTES;
    }
    const int got = recvmmsg(fd_, rx_msgs_.data(), static_cast<unsigned>(rx_msgs_n_),
                             MSG_DONTWAIT, nullptr);
    counters_[T_RX_SYSCALLS] += 1;
    if (got <= 0) {
        if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ECONNREFUSED)
            fail("recvmmsg");
        return 0;
    }
    size_t datagrams = 0;
    for (int i = 0; i < got; ++i) {
        const mmsghdr& m = rx_msgs_[i];
        const sockaddr_in& from = rx_from_[i];
        const PeerAddr src{ntohl(from.sin_addr.s_addr), ntohs(from.sin_port)};
        const int rank = from.sin_family == AF_INET ? lookup(src.key()) : -1;
        int64_t arrival = 0;
        size_t seg = 0;  // GRO: the length of each coalesced datagram but the last
        for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg_hdr); c != nullptr;
             c = CMSG_NXTHDR(const_cast<msghdr*>(&m.msg_hdr), c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                timespec ts;
                std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
                arrival = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
            } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                int s = 0;
                std::memcpy(&s, CMSG_DATA(c), sizeof s);
                seg = s > 0 ? static_cast<size_t>(s) : 0;
            }
        }
        const uint8_t* d = rx_buf_.data() + i * slot_;
        if ((m.msg_hdr.msg_flags & MSG_TRUNC) || m.msg_len >= slot_) {  // no GRO: too long
            counters_[rank < 0 ? T_NOT_MEMBER : T_RX_OVERSIZE] += 1;
            datagrams += 1;
            continue;
        }
        const size_t len = m.msg_len;
        if (seg == 0 || seg >= len) {
            admit(d, len, rank, arrival, out);
            datagrams += 1;
            continue;
        }
        for (size_t o = 0; o < len; o += seg) {
            admit(d + o, std::min(seg, len - o), rank, arrival, out);
            datagrams += 1;
        }
    }
    return datagrams;
}

size_t UdpTransport::send_batch(const OutDatagram* items, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (items[i].dst < 0 || items[i].dst >= static_cast<int>(peer_sa_.size()))
            throw std::logic_error("send_batch: no address for rank " +
                                   std::to_string(items[i].dst));
    if (key_) tx_tags_.resize(std::max(tx_tags_.size(), n * TAG_LEN));
    return gso_ ? send_gso(items, n) : send_plain(items, n);
}

size_t UdpTransport::put_iov(const OutDatagram& o, size_t i, iovec* iov) {
    iov[0] = iovec{const_cast<uint8_t*>(o.data), o.len};
    if (!key_) return 1;
    uint8_t* tag = tx_tags_.data() + i * TAG_LEN;
    header_tag(*key_, o.data, o.len, tag);
    iov[1] = iovec{tag, TAG_LEN};
    return 2;
}

size_t UdpTransport::send_plain(const OutDatagram* items, size_t n) {
    size_t done = 0;
    while (done < n) {
        const size_t k = std::min(n - done, BATCH);
        for (size_t i = 0; i < k; ++i) {
            const OutDatagram& o = items[done + i];
            msghdr& h = tx_msgs_[i].msg_hdr;
            h = msghdr{};
            h.msg_name = &peer_sa_[o.dst];
            h.msg_namelen = sizeof(sockaddr_in);
            h.msg_iov = &tx_iov_[2 * i];
            h.msg_iovlen = put_iov(o, done + i, h.msg_iov);
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

// One sendmmsg per window of items: each message holds, in order, the datagrams of one
// peer of one length (the kernel cuts a GSO message at that length), at most 64 KiB of them;
// the messages are in the order of their first datagram.
size_t UdpTransport::send_gso(const OutDatagram* items, size_t n) {
    item_msg_.resize(std::max(item_msg_.size(), n));
    const size_t stride = key_ ? 2 : 1;  // iovecs per datagram
    const size_t tag_len = key_ ? TAG_LEN : 0;
    size_t done = 0;
    while (done < n) {
        size_t n_msgs = 0, end = done;
        int open[64];  // per peer (the first 64 ranks): its open message, or -1
        const int n_open = std::min<int>(64, static_cast<int>(peer_sa_.size()));
        std::fill(open, open + n_open, -1);
        for (; end < n; ++end) {
            const OutDatagram& o = items[end];
            int m = o.dst < n_open ? open[o.dst] : -1;
            if (m >= 0) {
                msghdr& h = tx_msgs_[m].msg_hdr;
                const size_t segs = h.msg_iovlen / stride;
                const size_t seg_len = h.msg_iov[0].iov_len;
                if (o.len != seg_len || segs >= MAX_SEGMENTS ||
                    (segs + 1) * (seg_len + tag_len) > MAX_UDP_PAYLOAD)
                    m = -1;
            }
            // a new message to o.dst, no segment yet
            auto new_message = [&]() {
                const int k = static_cast<int>(n_msgs++);
                msghdr& h = tx_msgs_[k].msg_hdr;
                h = msghdr{};
                h.msg_name = &peer_sa_[o.dst];
                h.msg_namelen = sizeof(sockaddr_in);
                h.msg_iov = &tx_iov_[static_cast<size_t>(k) * MAX_SEGMENTS * 2];
                h.msg_iovlen = 0;
                return k;
            };
            if (o.len == 0) {  // an empty datagram cannot be a segment: a message of its own
                if (n_msgs == BATCH) break;
                m = new_message();
                msghdr& h = tx_msgs_[m].msg_hdr;
                h.msg_iovlen = put_iov(o, end, h.msg_iov);
                item_msg_[end] = static_cast<uint32_t>(m);
                if (o.dst < n_open) open[o.dst] = -1;
                continue;
            }
            if (m < 0) {
                if (n_msgs == BATCH) break;
                m = new_message();
                if (o.dst < n_open) open[o.dst] = m;
            }
            msghdr& h = tx_msgs_[m].msg_hdr;
            h.msg_iovlen += put_iov(o, end, h.msg_iov + h.msg_iovlen);
            item_msg_[end] = static_cast<uint32_t>(m);
        }
        for (size_t m = 0; m < n_msgs; ++m) {  // the segment size, where there are several
            msghdr& h = tx_msgs_[m].msg_hdr;
            if (h.msg_iovlen < 2 * stride) continue;
            uint8_t* ctl = tx_ctrl_.data() + m * GSO_CTRL_BYTES;
            h.msg_control = ctl;
            h.msg_controllen = GSO_CTRL_BYTES;
            cmsghdr* c = CMSG_FIRSTHDR(&h);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            const uint16_t seg = static_cast<uint16_t>(h.msg_iov[0].iov_len + tag_len);
            std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
        }
        const int sent = sendmmsg(fd_, tx_msgs_.data(), static_cast<unsigned>(n_msgs), 0);
        counters_[T_TX_SYSCALLS] += 1;
        if (sent < 0 && (errno == EIO || errno == EINVAL || errno == EMSGSIZE ||
                         errno == ENOPROTOOPT || errno == EOPNOTSUPP) &&
            tx_msgs_[0].msg_hdr.msg_controllen != 0) {
            // the route cannot segment (e.g. a device without checksum offload): plain sends
            gso_ = false;
            return done + send_plain(items + done, n - done);
        }
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                counters_[T_TX_AGAIN] += 1;
                return done;
            }
            if (errno == EINTR) continue;
            // the first message's datagrams are lost (e.g. ECONNREFUSED), go on: only those
            // up to the first datagram of another message count as taken
            size_t k = done;
            while (k < end && item_msg_[k] == 0) ++k;
            counters_[T_TX_ERRORS] += static_cast<int64_t>(k - done);
            done = k;
            continue;
        }
        // messages [0, sent) went out: items up to the first of a later message are taken
        size_t k = done;
        while (k < end && item_msg_[k] < static_cast<uint32_t>(sent)) ++k;
        int64_t out = 0, resent = 0;
        for (size_t i = done; i < end; ++i) {
            const bool went = item_msg_[i] < static_cast<uint32_t>(sent);
            out += went;
            resent += went && i >= k;
        }
        counters_[T_TX_DATAGRAMS] += out;
        counters_[T_TX_RESENT] += resent;
        done = k;
        if (static_cast<size_t>(sent) < n_msgs) {
            counters_[T_TX_AGAIN] += 1;
            return done;
        }
    }
    return done;
}

}  // namespace optireduce
