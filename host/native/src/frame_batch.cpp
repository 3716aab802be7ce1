#include "frame_batch.hpp"

#include <linux/if_packet.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <system_error>

namespace optireduce {

namespace {

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Wait for `events` on fd until deadline (steady ms); false when it passed.
bool wait_for(int fd, short events, int64_t deadline) {
    for (;;) {
        const int64_t left = deadline - now_ms();
        if (left < 0) return false;
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(left));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    }
}

}  // namespace

size_t send_frames(int fd, const std::vector<std::string>& frames, int timeout_ms) {
    const int64_t deadline = now_ms() + timeout_ms;
    size_t done = 0;
    mmsghdr msgs[FRAME_BATCH];
    iovec iov[FRAME_BATCH];
    while (done < frames.size()) {
        const size_t k = std::min(FRAME_BATCH, frames.size() - done);
        for (size_t i = 0; i < k; ++i) {
            const std::string& f = frames[done + i];
            iov[i] = {const_cast<char*>(f.data()), f.size()};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        const int r = ::sendmmsg(fd, msgs, static_cast<unsigned>(k), MSG_DONTWAIT);
        if (r > 0) {
            done += static_cast<size_t>(r);
        } else if (r < 0 && (errno == EAGAIN || errno == ENOBUFS || errno == EINTR)) {
            if (errno != EINTR && !wait_for(fd, POLLOUT, deadline)) break;
        } else {
            throw std::system_error(errno, std::generic_category(), "sendmmsg");
        }
    }
    return done;
}

std::vector<std::string> recv_frames(int fd, size_t max, int timeout_ms, uint64_t* syscalls) {
    std::vector<std::string> out;
    if (!wait_for(fd, POLLIN, now_ms() + timeout_ms)) return out;
    static thread_local std::vector<char> buf(FRAME_BATCH * 2048);
    mmsghdr msgs[FRAME_BATCH];
    iovec iov[FRAME_BATCH];
    sockaddr_ll from[FRAME_BATCH];
    while (out.size() < max) {
        const size_t k = std::min(FRAME_BATCH, max - out.size());
        for (size_t i = 0; i < k; ++i) {
            iov[i] = {buf.data() + 2048 * i, 2048};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &from[i];
            msgs[i].msg_hdr.msg_namelen = sizeof from[i];
        }
        const int r = ::recvmmsg(fd, msgs, static_cast<unsigned>(k), MSG_DONTWAIT, nullptr);
        if (syscalls) ++*syscalls;
        if (r <= 0) {
            if (r < 0 && errno != EAGAIN && errno != EINTR)
                throw std::system_error(errno, std::generic_category(), "recvmmsg");
            break;
        }
        for (int i = 0; i < r; ++i) {
            if (from[i].sll_pkttype == PACKET_OUTGOING) continue;  // our own send
            // a frame longer than a board's MAC FIFO arrives cut (MSG_TRUNC): kept cut,
            // so the caller's checks drop it
            out.emplace_back(buf.data() + 2048 * i, msgs[i].msg_len > 2048 ? 2048 : msgs[i].msg_len);
        }
        if (static_cast<size_t>(r) < k) break;
    }
    return out;
}

}  // namespace optireduce
