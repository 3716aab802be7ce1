// Phase deadlines: see engine_deadline.hpp; host/model/deadline.py is the reference.
#include "engine_deadline.hpp"

#include <algorithm>

namespace optireduce {

const char* reason_name(Reason r) {
    switch (r) {
        case Reason::complete: return "complete";
        case Reason::early: return "early";
        case Reason::deadline: return "deadline";
        default: return "";
    }
}

int64_t TcEstimator::sample(int64_t s, const Params& p) {
    if (!has_mean) {
        has_mean = true;
        mean = s;
        dev = s >> 1;
    } else {
        const int64_t err = s - mean;
        mean += err >> p.tc_gain_shift;  // arithmetic shift: floor, as Python's >>
        dev += ((err < 0 ? -err : err) - dev) >> p.tc_dev_shift;
    }
    tc = std::min(std::max(mean + p.tc_dev_mult * dev, p.t_c_min_us), p.t_b_us);
    return tc;
}

int64_t agreed_timeout(const int64_t* tc_table, int n, int64_t t_b,
                       std::vector<int64_t>& scratch) {
    scratch.assign(tc_table, tc_table + n);
    const auto mid = scratch.begin() + (n - 1) / 2;
    std::nth_element(scratch.begin(), mid, scratch.end());
    return std::min(*mid, t_b);
}

void PhaseTracker::reset(int world, int32_t alpha_q8) {
    exp_.assign(world, 0);
    rcv_.assign(world, 0);
    senders_.assign(world, 0);
    flagged_.assign(world, 0);
    gone_.assign(world, 0);
    alpha_q8_ = alpha_q8;
    has_last_arrival_ = has_start_ = has_end_ = any_gone_ = false;
    last_arrival_ = last_gone_ = start_ = anchor_ = timeout_ = end_ = 0;
    reason_ = Reason::none;
    expected_ = received_ = unflagged_ = 0;
}

void PhaseTracker::set_expected(int sender, int64_t n) {
    expected_ += n - exp_[sender];
    unflagged_ -= senders_[sender];
    exp_[sender] = n;
    senders_[sender] = n > 0;
    unflagged_ += senders_[sender];
}

void PhaseTracker::arrive(int64_t now, int sender, bool last) {
    rcv_[sender] += 1;
    received_ += 1;
    has_last_arrival_ = true;
    last_arrival_ = now;
    if (last && !flagged_[sender]) {
        flagged_[sender] = 1;
        unflagged_ -= senders_[sender];
    }
}

void PhaseTracker::sender_gone(int64_t now, int sender) {
    if (senders_[sender] && !gone_[sender] && !has_end_) {
        gone_[sender] = 1;
        any_gone_ = true;
        last_gone_ = now;
    }
}

void PhaseTracker::begin(int64_t now) { begin(now, now); }

void PhaseTracker::begin(int64_t now, int64_t anchor) {
    has_start_ = true;
    start_ = now;
    anchor_ = std::max(now, anchor);
}

std::vector<int64_t> PhaseTracker::missing_from() const {
    std::vector<int64_t> m(exp_.size());
    for (size_t q = 0; q < m.size(); ++q) m[q] = exp_[q] - rcv_[q];
    return m;
}

int64_t PhaseTracker::busy_until() const {
    // the model's `last_arrival or start`: an arrival at tick 0 counts as none
    const int64_t la = has_last_arrival_ && last_arrival_ != 0 ? last_arrival_ : start_;
    return std::max(start_, la);
}

void PhaseTracker::times(int64_t timeout, int64_t floor, bool& has_early, int64_t& early,
                         int64_t& deadline) const {
    deadline = std::max(anchor_ + timeout, floor);
    has_early = unflagged_ == 0;
    if (!has_early) return;
    const int64_t idle = std::max<int64_t>(1, (int64_t{alpha_q8_} * timeout) >> 8);
    early = std::max(busy_until() + idle, floor);
}

bool PhaseTracker::due(int64_t now, int64_t timeout, int64_t floor, int64_t& t,
                       Reason& reason) const {
    if (!has_start_ || has_end_) return false;
    if (received_ >= expected_) {
        t = busy_until();
        reason = Reason::complete;
        return true;
    }
    if (any_gone_) {
        bool rest_lost = true;
        for (size_t s = 0; s < exp_.size() && rest_lost; ++s)
            rest_lost = rcv_[s] >= exp_[s] || gone_[s];
        if (rest_lost) {
            t = std::max(busy_until(), last_gone_);
            reason = Reason::early;
            return true;
        }
    }
    bool has_early;
    int64_t early = 0, deadline;
    times(timeout, floor, has_early, early, deadline);
    if (has_early && early <= now && early < deadline) {
        t = early;
        reason = Reason::early;
        return true;
    }
    if (deadline <= now) {
        t = deadline;
        reason = Reason::deadline;
        return true;
    }
    return false;
}

bool PhaseTracker::next_timer(int64_t timeout, int64_t floor, int64_t& t) const {
    if (!has_start_ || has_end_) return false;
    bool has_early;
    int64_t early = 0, deadline;
    times(timeout, floor, has_early, early, deadline);
    t = has_early ? std::min(early, deadline) : deadline;
    return true;
}

bool PhaseTracker::finish(int64_t t, Reason reason, int64_t timeout, TcSample rule,
                          int64_t& sample) {
    has_end_ = true;
    end_ = t;
    reason_ = reason;
    timeout_ = timeout;
    if (reason == Reason::deadline && rule == TcSample::duration) {
        sample = t - start_;
        return true;
    }
    if (!has_last_arrival_ || last_arrival_ <= start_) return false;
    sample = last_arrival_ - start_;
    return true;
}

}  // namespace optireduce
