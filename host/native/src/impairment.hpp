// Network impairment in C++: the semantics of host/model/impairment.py (ImpairmentSpec,
// Impairment.fates), drawn per datagram by the sending engine thread, and the release-time
// queue that holds each surviving copy until its delay has passed (a min-heap: no timer
// threads). The random stream is seeded but is not numpy's: the same seed gives the same
// fates here, the same distributions as the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "transport.hpp"

namespace optireduce {

constexpr double Z99 = 2.3263478740408408;  // standard normal quantile at 0.99

struct ImpairmentSpec {
    double median_us = 0.0;  // lognormal delay: median m, P99/P50 = p99_ratio
    double p99_ratio = 1.0;
    double loss = 0.0;       // each copy dropped with this probability
    double duplicate = 0.0;  // a second copy, with its own delay and loss draw
    double reorder = 0.0;    // a copy held one more median, behind later packets
    double extra_us = 0.0;   // added to every copy's delay: a late link (a straggler's step)

    void check() const;  // throws std::invalid_argument as ImpairmentSpec.__post_init__
    double sigma() const;
    bool active() const { return median_us > 0 || extra_us > 0 || loss > 0 || duplicate > 0; }
    ImpairmentSpec reliable() const { return {median_us, p99_ratio, 0.0, 0.0, reorder, extra_us}; }
};

class Impairment {
public:
    Impairment(const ImpairmentSpec& spec, uint64_t seed);
    void set_spec(const ImpairmentSpec& spec);  // the stream goes on
    const ImpairmentSpec& spec() const { return spec_; }

    double delay_us();
    // Delays (us) of the copies of one datagram that get through: 0, 1 or 2 of them.
    int fates(double out[2]);

    int64_t lost = 0, duplicated = 0, reordered = 0;

private:
    double uniform();  // [0, 1)

    ImpairmentSpec spec_;
    double sigma_ = 0.0;
    std::mt19937_64 rng_;
    std::normal_distribution<double> normal_;
};

// Copies of datagrams waiting for their release tick, earliest first (ties: push order).
class ReleaseQueue {
public:
    explicit ReleaseQueue(size_t max_datagram) : slot_bytes_(max_datagram) {}
    ReleaseQueue(const ReleaseQueue&) = delete;
    ReleaseQueue& operator=(const ReleaseQueue&) = delete;

    void push(int64_t due_us, int dst, const uint8_t* data, size_t len);
    std::optional<int64_t> next() const;
    size_t size() const { return heap_.size(); }

    // Up to `max` datagrams due at `now` into out (their bytes stay valid until done()).
    size_t pop_due(int64_t now, size_t max, std::vector<OutDatagram>& out);
    // After pop_due: the first `sent` went out; the rest go back in their old places.
    void done(size_t sent);

private:
    struct Entry {
        int64_t due;
        uint64_t seq;
        int dst;
        uint32_t slot;
        uint32_t len;
        bool operator>(const Entry& o) const {
            return due != o.due ? due > o.due : seq > o.seq;
        }
    };
    uint32_t take_slot();

    size_t slot_bytes_;
    uint64_t seq_ = 0;
    std::vector<Entry> heap_;  // std::push_heap with greater<>: a min-heap
    std::vector<Entry> popped_;
    std::vector<std::unique_ptr<uint8_t[]>> slots_;
    std::vector<uint32_t> free_;
};

}  // namespace optireduce
