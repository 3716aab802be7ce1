// Deadlines of one phase in microsecond ticks: the native twin of host/model/deadline.py
// (TcEstimator, agreed_timeout, flagged_count, PhaseTracker). docs/deadlines.md states the
// rules; every integer step here is the model's (floor shifts, lower median, live T).
#pragma once

#include <cstdint>
#include <vector>

#include "codec.hpp"

namespace optireduce {

enum class Reason : uint8_t { none = 0, complete, early, deadline };
const char* reason_name(Reason r);  // "" | "complete" | "early" | "deadline"

// deadline.TcEstimator: a node's own t_C of one phase (shift-only EWMAs of mean and
// deviation, t_C = mean + mult * dev clamped to [t_c_min, t_B]).
struct TcEstimator {
    int64_t tc = 0;
    int64_t mean = 0;
    bool has_mean = false;
    int64_t dev = 0;

    explicit TcEstimator(const Params& p) : tc(p.t_c_init_us) {}
    int64_t sample(int64_t duration_us, const Params& p);
};

// deadline.agreed_timeout: min(lower median of the world's t_C values, t_B). `scratch` is
// reused (no allocation once it holds `n` values).
int64_t agreed_timeout(const int64_t* tc_table, int n, int64_t t_b, std::vector<int64_t>& scratch);

// deadline.flagged_count: how many of a sender's last packets to one destination carry LAST.
inline int64_t flagged_count(int64_t n_packets, int64_t last_percent) {
    if (!n_packets) return 0;
    const int64_t k = (n_packets * last_percent + 99) / 100;
    return k > 1 ? k : 1;
}

// deadline.PhaseTracker: arrivals and timers of one phase of one op at one receiver.
class PhaseTracker {
public:
    void reset(int world, int32_t alpha_q8);  // every sender expected 0, nothing arrived
    void set_expected(int sender, int64_t n);  // before any arrival
    void arrive(int64_t now, int sender, bool last);
    void sender_gone(int64_t now, int sender);
    void begin(int64_t now);
    void begin(int64_t now, int64_t anchor);
    // (end tick, reason) if the phase is over at `now`.
    bool due(int64_t now, int64_t timeout, int64_t floor, int64_t& t, Reason& reason) const;
    bool next_timer(int64_t timeout, int64_t floor, int64_t& t) const;
    // Records the end; true (and the completion-time sample) when it says something of t_C.
    bool finish(int64_t t, Reason reason, int64_t timeout, TcSample rule, int64_t& sample);

    bool started() const { return has_start_; }
    bool ended() const { return has_end_; }
    int64_t start() const { return start_; }
    int64_t timeout() const { return timeout_; }
    int64_t expected() const { return expected_; }
    int64_t received() const { return received_; }
    // per sender: expected minus arrived (OpStats.p*_missing_from)
    std::vector<int64_t> missing_from() const;

private:
    int64_t busy_until() const;  // max(start, last arrival or start)
    void times(int64_t timeout, int64_t floor, bool& has_early, int64_t& early,
               int64_t& deadline) const;

    std::vector<int64_t> exp_, rcv_;
    std::vector<uint8_t> senders_, flagged_, gone_;
    int32_t alpha_q8_ = 0;
    bool has_last_arrival_ = false, has_start_ = false, has_end_ = false, any_gone_ = false;
    int64_t last_arrival_ = 0, last_gone_ = 0, start_ = 0, anchor_ = 0, timeout_ = 0, end_ = 0;
    Reason reason_ = Reason::none;
    int64_t expected_ = 0, received_ = 0, unflagged_ = 0;
};

}  // namespace optireduce
