// Batches of Ethernet frames on a packet socket (AF_PACKET): one sendmmsg or recvmmsg
// call moves up to FRAME_BATCH frames. The board backend's host port (host/board_nic.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace optireduce {

constexpr size_t FRAME_BATCH = 64;  // frames per system call

// Send every frame in order; a full queue is waited out (poll, at most timeout_ms in all).
// Returns the frames sent; throws std::system_error on any other failure.
size_t send_frames(int fd, const std::vector<std::string>& frames, int timeout_ms);

// The frames waiting on fd, at most `max`, after waiting up to timeout_ms for the first;
// frames the socket saw leave (PACKET_OUTGOING) are skipped. `syscalls` counts the calls.
std::vector<std::string> recv_frames(int fd, size_t max, int timeout_ms, uint64_t* syscalls);

}  // namespace optireduce
