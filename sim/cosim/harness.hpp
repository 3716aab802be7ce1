// What the co-simulation harnesses share: bit access on Verilated ports of any width, and
// the process's CPU time.
#pragma once

#include "verilated.h"

#include <cstdint>
#include <ctime>
#include <type_traits>

template <typename T>
typename std::enable_if<std::is_integral<T>::value>::type setb(T& s, int lsb, int w,
                                                               uint64_t v) {
    const uint64_t m = (w >= 64 ? ~0ULL : ((1ULL << w) - 1)) << lsb;
    s = static_cast<T>((static_cast<uint64_t>(s) & ~m) | ((v << lsb) & m));
}
template <typename T>
typename std::enable_if<std::is_integral<T>::value, uint64_t>::type getb(const T& s, int lsb,
                                                                         int w) {
    const uint64_t v = static_cast<uint64_t>(s) >> lsb;
    return w >= 64 ? v : v & ((1ULL << w) - 1);
}
template <std::size_t N>
void setb(VlWide<N>& s, int lsb, int w, uint64_t v) {
    for (int i = 0; i < w; i++) {
        const int b = lsb + i;
        const uint32_t bit = 1u << (b % 32);
        if ((v >> i) & 1)
            s[b / 32] |= bit;
        else
            s[b / 32] &= ~bit;
    }
}
template <std::size_t N>
uint64_t getb(const VlWide<N>& s, int lsb, int w) {
    uint64_t v = 0;
    for (int i = 0; i < w; i++) v |= static_cast<uint64_t>((s[(lsb + i) / 32] >> ((lsb + i) % 32)) & 1) << i;
    return v;
}

// CPU time of this process: the speed figure that a loaded machine does not skew.
inline uint64_t cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}
