// The native event engine: see engine.hpp. host/model/nic_model.py is the reference; each
// method here is the model's method of the same name, step for step, so that the frames,
// timers, drops and stats come out identical (tests/native/test_engine.py checks it).
#include "engine.hpp"

#include "clones.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <stdexcept>
#include <string>

namespace optireduce {

namespace {

const char* const EXTRA_COUNTERS[N_COUNTERS - N_DROPS] = {
    "rx_scatter", "rx_gather", "tx_scatter", "tx_gather", "ops_started", "ops_completed",
};

const char* const EXP_COUNTER_NAMES[N_EXP_COUNTERS] = {
    "exp_given", "exp_inband", "exp_incomplete", "exp_followed", "exp_missing", "exp_saturated",
};

// A proposal table cell: nothing heard yet, "no proposal", or an int8 proposal.
constexpr int16_t NO_RECORD = INT16_MIN;
constexpr int16_t NO_PROPOSAL = INT16_MIN + 1;

// Python's repr of a list of ints, for messages equal to the model's.
std::string py_list(const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// Packets of an op of n_packets that rank r owns: indices r, r + N, r + 2N, ...
int64_t owned(int64_t n_packets, int r, int world) {
    return n_packets > r ? (n_packets - r + world - 1) / world : 0;
}

// The owner's own contribution to a slot, widened (vectorised for the CPU at hand).
OR_CLONES void widen_into(const int32_t* __restrict v, size_t n, int64_t* __restrict a) {
    for (size_t j = 0; j < n; ++j) a[j] = v[j];
}
OR_CLONES void add_into(const int32_t* __restrict v, size_t n, int64_t* __restrict a) {
    for (size_t j = 0; j < n; ++j) a[j] += v[j];
}

}  // namespace

const char* counter_name(int k) {
    if (k < 0 || k >= N_COUNTERS) return "";
    return k < N_DROPS ? DROP_NAMES[k] : EXTRA_COUNTERS[k - N_DROPS];
}

const char* exp_counter_name(int k) {
    return k < 0 || k >= N_EXP_COUNTERS ? "" : EXP_COUNTER_NAMES[k];
}

// One op in the window: the model's _Op with its Aggregator and GatherBuffer inlined.
struct Engine::Op {
    int64_t op_id = 0, n = 0, n_packets = 0, n_slots = 0;
    int exponent = 0;
    uint16_t proposal_word = 0;  // the reserved field of its frames (exp_inband)
    bool started = false, done = false;
    // a non-finite input here or a peer's accepted frame flagged so: the gather frames carry
    // FLAG_NONFINITE and the result is NaN (NicModel's _Op.nonfinite); the scatter frames
    // carry it for this rank's own input only (nonfinite_own)
    bool nonfinite = false, nonfinite_own = false;
    float* out = nullptr;  // the caller's result buffer, if start_op was given one
    // aggregator: slot row k is packet rank + k N; a row's acc is written by its first
    // contribution (count 0) and added to by the others, so it is never zeroed in full
    std::vector<int64_t> acc, count;
    std::vector<uint8_t> bitmap;  // n_slots x world
    // gather buffer: every packet of the op
    std::vector<int32_t> z;
    std::vector<uint8_t> have;
    std::vector<int64_t> contributors;
    PhaseTracker p1, p2;
    std::shared_ptr<OpStats> stats;

    // Aggregator.add: false (nothing changed) for a duplicate.
    bool add(int64_t pkt_index, int sender, int world, int p, const uint8_t* payload) {
        const int64_t row = pkt_index / world;
        uint8_t& seen = bitmap[row * world + sender];
        if (seen) return false;
        seen = 1;
        int64_t* a = acc.data() + row * p;
        if (count[row]++ == 0)
            payload_to_i64(payload, static_cast<size_t>(p), a);
        else
            payload_add_i64(payload, static_cast<size_t>(p), a);
        return true;
    }
    void add_own(int64_t pkt_index, int sender, int world, int p, const int32_t* v) {
        const int64_t row = pkt_index / world;
        bitmap[row * world + sender] = 1;
        int64_t* a = acc.data() + row * p;
        if (count[row]++ == 0)
            widen_into(v, static_cast<size_t>(p), a);
        else
            add_into(v, static_cast<size_t>(p), a);
    }
    // Aggregator.clear: forget every contribution; how many there were.
    int64_t clear() {
        int64_t k = 0;
        for (int64_t c : count) k += c;
        std::fill(count.begin(), count.end(), 0);  // acc: rewritten by each row's next add
        std::fill(bitmap.begin(), bitmap.end(), 0);
        return k;
    }
    // GatherBuffer.place from wire bytes: false (nothing changed) if already here. z is not
    // zeroed per op: the packets that never arrived are zeroed before the decode.
    bool place(int64_t pkt_index, int p, const uint8_t* payload, int64_t contrib) {
        if (have[pkt_index]) return false;
        payload_to_i32(payload, static_cast<size_t>(p), z.data() + pkt_index * p);
        have[pkt_index] = 1;
        contributors[pkt_index] = contrib;
        return true;
    }
};

Engine::Engine(const Params& p, int rank, int world, const Addressing& a, int64_t first_op,
               Inband inband)
    : p_(p), rank_(rank), world_(world), addr_(a), tc_{TcEstimator(p), TcEstimator(p)},
      inband_(inband), base_(first_op), last_started_(first_op - 1) {
    p_.check();
    if (inband.on && (inband.lead < p.ops_in_flight || inband.lead > 256))
        throw std::invalid_argument("exp_lead=" + std::to_string(inband.lead) + ": must be in K=" +
                                    std::to_string(p.ops_in_flight) + "..256");
    if (world < 2 || world > p.n_max)
        throw std::invalid_argument("world=" + std::to_string(world) +
                                    ": must be in 2..n_max=" + std::to_string(p.n_max));
    if (rank < 0 || rank >= world)
        throw std::invalid_argument("rank=" + std::to_string(rank) +
                                    ": must be in 0..world-1=" + std::to_string(world - 1));
    for (auto& t : tc_table_) t.assign(world, p.t_c_init_us);
    is_gone_.assign(world, 0);
    peer_done_.assign(world, first_op - 1);
}

Engine::~Engine() = default;

// ---- host port -------------------------------------------------------------------------

void Engine::start_op(int64_t now, int64_t op_id, const float* data, size_t n,
                      std::optional<int> given, std::optional<int> next_proposal, float* out) {
    const int64_t k = p_.ops_in_flight;
    if (n < 1 || static_cast<int64_t>(n) > p_.c)
        throw std::invalid_argument("start_op: " + std::to_string(n) +
                                    " elements; an op holds 1..c=" + std::to_string(p_.c));
    if ((!given || next_proposal) && !inband_.on)
        throw std::invalid_argument("start_op: in-band exponents need NicParams.exp_inband");
    if (given && (*given < EXP_MIN || *given > EXP_MAX))
        throw std::invalid_argument("start_op: exponent " + std::to_string(*given) +
                                    " outside int8");
    if (next_proposal && (*next_proposal < EXP_MIN || *next_proposal > EXP_MAX))
        throw std::invalid_argument("start_op: next_proposal " +
                                    std::to_string(*next_proposal) + " outside int8");
    if (op_id != last_started_ + 1)
        throw std::invalid_argument("start_op: op " + std::to_string(op_id) +
                                    " is not the next op (" + std::to_string(last_started_ + 1) +
                                    ")");
    if (op_id < base_ || op_id >= base_ + k)
        throw std::invalid_argument("start_op: op " + std::to_string(op_id) +
                                    " outside the window [" + std::to_string(base_) + ", " +
                                    std::to_string(base_ + k) + "): wait for op " +
                                    std::to_string(base_) + " to complete");
    int exponent = given.value_or(0);
    int source = EXP_GIVEN;
    size_t n_missing = 0;
    if (!given) {
        const InbandExponent inb = inband_exponent(op_id);
        if (!inb.exponent)
            throw std::invalid_argument("start_op: op " + std::to_string(op_id) +
                                        " has no in-band exponent (no proposal from ranks " +
                                        py_list(inb.unknown) + "): give one");
        const Op* held = find(op_id);
        n_missing = inb.missing.size();
        if (held != nullptr && held->exponent != *inb.exponent) {
            // peers ahead already sent this op with their exponent: follow them
            exponent = held->exponent;
            source = EXP_FOLLOWED;
        } else {
            exponent = *inb.exponent;
            source = n_missing ? EXP_INCOMPLETE : EXP_INBAND;
        }
    }
    advance(now);
    Op* op = find(op_id);
    const int64_t len = static_cast<int64_t>(n);
    if (op != nullptr && (op->exponent != exponent || op->n != len)) {
        // Peers sent this op with another exponent or length: theirs cannot be used.
        const int reason = op->exponent != exponent ? DROP_EXPONENT_MISMATCH : DROP_BAD_LENGTH;
        int64_t kept = op->clear();
        for (uint8_t h : op->have) kept += h;
        counters_[reason] += kept;
        for (auto& slot : ops_) {  // the new op keeps the old one's place in the window
            if (slot.get() == op) {
                std::unique_ptr<Op> fresh = make_op(op_id, len, exponent, now);
                std::swap(slot, fresh);
                op = slot.get();
                release(std::move(fresh));
                break;
            }
        }
    } else if (op == nullptr) {
        op = new_op(op_id, len, exponent, now);
    }
    last_started_ = op_id;
    counters_[OPS_STARTED] += 1;
    op->started = true;
    op->out = out;
    OpStats& st = *op->stats;
    st.start_us = now;
    if (inband_.on) {
        proposals_.erase(op_id);
        proposal_row(op_id + inband_.lead)[rank_] =
            next_proposal ? static_cast<int16_t>(*next_proposal) : NO_PROPOSAL;
        op->proposal_word = proposal_word(next_proposal.has_value(), next_proposal.value_or(0));
    }

    enc_.resize(p_.padded_len(n));
    const EncodeCounts ec = encode(data, n, exponent, static_cast<uint32_t>(op_id), p_,
                                   enc_.data());
    st.sat_quantize = ec.sat_quantize;
    st.sat_transform = ec.sat_transform;
    st.nonfinite = ec.nonfinite;
    op->nonfinite_own = ec.nonfinite > 0;
    op->nonfinite = op->nonfinite || op->nonfinite_own;
    exp_counters_[source] += 1;
    exp_counters_[EXP_MISSING] += static_cast<int64_t>(n_missing);
    // an inf (counted as a saturation) is not a prediction too small
    if (source != EXP_GIVEN && ec.sat_quantize && !ec.nonfinite)
        exp_counters_[EXP_SATURATED] += 1;
    const int P = p_.p;
    for (int64_t row = 0; row < op->n_slots; ++row) {
        const int64_t i = rank_ + row * world_;
        op->add_own(i, rank_, world_, P, enc_.data() + i * P);
    }
    // phase 1: packet i to its owner i mod N, the last packets to each owner flagged
    const int64_t tc1 = tc_[0].tc;
    for (int64_t i = 0; i < op->n_packets; ++i) {
        const int dst = static_cast<int>(i % world_);
        if (dst == rank_) continue;
        const int64_t per_dst = owned(op->n_packets, dst, world_);
        const bool last = i / world_ >= per_dst - flagged_count(per_dst, p_.last_percent);
        const Header h = header(*op, MSG_SCATTER, i, 0, last, tc1);
        send(now, *op, 1, dst, i, h, enc_.data() + i * P);
    }
    op->p1.begin(now);
    progress(*op, now);
}

void Engine::detach_outputs() {
    for (auto& op : ops_) op->out = nullptr;
}

std::vector<OpResult> Engine::poll_results() {
    std::vector<OpResult> out;
    out.swap(results_);
    return out;
}

InbandExponent Engine::inband_exponent(int64_t op_id) const {
    InbandExponent r;
    const auto it = proposals_.find(op_id);
    int best = INT_MIN;
    for (int q = 0; q < world_; ++q) {
        const int16_t v = it == proposals_.end() ? NO_RECORD : it->second[q];
        if (v == NO_PROPOSAL || (v == NO_RECORD && q == rank_))
            r.unknown.push_back(q);
        else if (v == NO_RECORD) {
            if (!is_gone_[q]) r.missing.push_back(q);
        } else
            best = std::max<int>(best, v);
    }
    if (r.unknown.empty()) r.exponent = best;
    return r;
}

void Engine::put_proposal(int64_t op_id, int rank, std::optional<int> proposal) {
    if (!inband_.on)
        throw std::invalid_argument("put_proposal: in-band exponents need NicParams.exp_inband");
    if (rank < 0 || rank >= world_)
        throw std::invalid_argument("put_proposal: rank " + std::to_string(rank) +
                                    " outside 0.." + std::to_string(world_ - 1));
    const int64_t top = base_ + 2 * int64_t{p_.ops_in_flight} + inband_.lead;
    if (!(last_started_ < op_id && op_id < top))
        throw std::invalid_argument("put_proposal: op " + std::to_string(op_id) + " outside (" +
                                    std::to_string(last_started_) + ", " + std::to_string(top) +
                                    ")");
    if (proposal && (*proposal < EXP_MIN || *proposal > EXP_MAX))
        throw std::invalid_argument("put_proposal: proposal " + std::to_string(*proposal) +
                                    " outside int8");
    proposal_row(op_id)[rank] = proposal ? static_cast<int16_t>(*proposal) : NO_PROPOSAL;
}

// ---- network port ----------------------------------------------------------------------

void Engine::receive(int64_t now, const uint8_t* frame, size_t n) {
    advance(now);
    Parsed r;
    const int code =
        parse_frame(frame, n, static_cast<uint16_t>(p_.udp_port), rank_, addr_, r, inband_.on);
    accept(now, code, r);
}

void Engine::receive_datagram(int64_t now, const uint8_t* datagram, size_t n) {
    advance(now);
    Parsed r;
    const int code = parse_ubt(datagram, n, r, inband_.on);
    accept(now, code, r);
}

void Engine::clear_tx() {
    tx_.clear();
    arena_.clear();  // keeps its capacity: the next frames reuse it
}

// ---- time ------------------------------------------------------------------------------

std::optional<int64_t> Engine::next_timer() const {
    std::optional<int64_t> best;
    for (const auto& op : ops_) {
        int64_t t;
        if (op_timer(*op, t) && (!best || t < *best)) best = t;
    }
    return best;
}

void Engine::advance(int64_t now) {
    while (true) {
        Op* due = nullptr;
        int64_t due_t = 0;
        for (const auto& op : ops_) {
            int64_t t;
            if (!op_timer(*op, t)) continue;
            if (due == nullptr || t < due_t || (t == due_t && op->op_id < due->op_id)) {
                due = op.get();
                due_t = t;
            }
        }
        if (due == nullptr || due_t > now) return;
        const int64_t id = due->op_id;
        const int before = phase(*due);
        progress(*due, due_t);
        const Op* after = find(id);
        if (after != nullptr && phase(*after) == before)  // would fire again forever
            throw std::logic_error("engine: a timer fired without ending its phase");
    }
}

void Engine::exclude(int64_t now, int rank) {
    if (rank < 0 || rank >= world_)
        throw std::invalid_argument("exclude: rank " + std::to_string(rank) +
                                    " outside 0..world-1=" + std::to_string(world_ - 1));
    if (rank == rank_ || is_gone_[rank]) return;
    is_gone_[rank] = 1;
    gone_order_.push_back(rank);
    ids_.clear();
    for (const auto& op : ops_) ids_.push_back(op->op_id);
    for (int64_t id : ids_) {
        Op* op = find(id);  // gone: completed and left the window meanwhile
        if (op == nullptr || op->done) continue;
        op->p1.sender_gone(now, rank);
        op->p2.sender_gone(now, rank);
        progress(*op, now);
    }
}

void Engine::set_t_b(int64_t t_b_us) {
    if (t_b_us < 1 || t_b_us >= (int64_t{1} << 32))
        throw std::invalid_argument("set_t_b: t_b_us must be in 1..2^32-1");
    p_.t_b_us = t_b_us;
    t_valid_[0] = t_valid_[1] = false;
}

std::vector<int> Engine::gone() const { return gone_order_; }

// ---- internals -------------------------------------------------------------------------

Engine::Op* Engine::find(int64_t op_id) const {
    for (const auto& op : ops_)
        if (op->op_id == op_id) return op.get();
    return nullptr;
}

std::unique_ptr<Engine::Op> Engine::make_op(int64_t op_id, int64_t n, int exponent,
                                            int64_t now) {
    std::unique_ptr<Op> op;
    if (!pool_.empty()) {
        op = std::move(pool_.back());
        pool_.pop_back();
    } else {
        op = std::make_unique<Op>();
    }
    const int P = p_.p;
    op->op_id = op_id;
    op->n = n;
    op->exponent = exponent;
    op->proposal_word = 0;
    op->n_packets = static_cast<int64_t>(p_.packets_for(static_cast<size_t>(n)));
    op->n_slots = owned(op->n_packets, rank_, world_);
    op->started = op->done = false;
    op->nonfinite = op->nonfinite_own = false;
    op->out = nullptr;
    // acc and z: no zeroing (see add and place); a pooled op keeps its pages
    if (op->acc.size() < static_cast<size_t>(op->n_slots * P)) op->acc.resize(op->n_slots * P);
    op->count.assign(op->n_slots, 0);
    op->bitmap.assign(op->n_slots * world_, 0);
    if (op->z.size() < static_cast<size_t>(op->n_packets * P)) op->z.resize(op->n_packets * P);
    op->have.assign(op->n_packets, 0);
    op->contributors.assign(op->n_packets, 0);
    op->p1.reset(world_, p_.alpha_q8);
    op->p2.reset(world_, p_.alpha_q8);
    for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        op->p1.set_expected(r, op->n_slots);  // one contribution per slot we own
        op->p2.set_expected(r, owned(op->n_packets, r, world_));  // the slots r owns
    }
    op->stats = std::make_shared<OpStats>();
    OpStats& st = *op->stats;
    st.op_id = op_id;
    st.rank = rank_;
    st.world = world_;
    st.n = n;
    st.exponent = exponent;
    for (int r : gone_order_) {
        op->p1.sender_gone(now, r);
        op->p2.sender_gone(now, r);
    }
    if (p_.progress_ahead)
        for (int r = 0; r < world_; ++r)
            if (peer_done_[r] >= op_id) {
                op->p1.sender_gone(now, r);
                op->p2.sender_gone(now, r);
            }
    return op;
}

Engine::Op* Engine::new_op(int64_t op_id, int64_t n, int exponent, int64_t now) {
    ops_.push_back(make_op(op_id, n, exponent, now));
    return ops_.back().get();
}

void Engine::release(std::unique_ptr<Op> op) {
    if (pool_.size() < static_cast<size_t>(2 * p_.ops_in_flight)) pool_.push_back(std::move(op));
}

int Engine::phase(const Op& op) const {
    if (op.done) return 3;
    if (!op.started) return 0;
    return op.p1.ended() ? 2 : 1;
}

void Engine::drop(int reason, OpStats* stats) {
    counters_[reason] += 1;
    if (stats != nullptr && reason == DROP_LATE) stats->late += 1;
    if (stats != nullptr && reason == DROP_DUPLICATE) stats->duplicate += 1;
}

int64_t Engine::timeout(int phase) const {
    if (!t_valid_[phase - 1]) {
        t_cached_[phase - 1] = agreed_timeout(tc_table_[phase - 1].data(), world_, p_.t_b_us,
                                              median_);
        t_valid_[phase - 1] = true;
    }
    return t_cached_[phase - 1];
}

void Engine::set_tc(int phase, int rank, int64_t tc, int64_t now) {
    int64_t& cell = tc_table_[phase - 1][rank];
    if (cell != tc) {
        cell = tc;
        t_change_[phase - 1] = now;
        t_valid_[phase - 1] = false;
    }
}

bool Engine::op_timer(const Op& op, int64_t& t) const {
    const int ph = phase(op);
    if (ph == 1) return op.p1.next_timer(timeout(1), t_change_[0], t);
    if (ph == 2) return op.p2.next_timer(timeout(2), t_change_[1], t);
    return false;
}

void Engine::accept(int64_t now, int code, const Parsed& r) {
    if (code != OK) return drop(code);
    const Header& h = r.h;
    int reason = check_peer(h, p_.job_id, rank_, world_);
    if (reason == OK)
        reason = check_op(h, p_.p, p_.c, p_.b, rank_, world_, base_, 2 * p_.ops_in_flight);
    if (inband_.on && (reason == OK || reason == DROP_STALE_OP))
        note_proposal(h);  // even a frame dropped below, or of a completed op
    if (reason == DROP_FUTURE_OP && p_.progress_ahead)  // far ahead: done with op_id - K
        peer_progress(now, h.sender, h.op_id);
    if (reason != OK) return drop(reason);
    Op* op = find(h.op_id);
    if (op == nullptr) op = new_op(h.op_id, h.op_len, h.exponent, now);  // a peer is ahead
    const std::shared_ptr<OpStats> keep = op->stats;  // op may leave the window below
    OpStats* st = keep.get();
    if (op->exponent != h.exponent) return drop(DROP_EXPONENT_MISMATCH, st);
    if (op->n != int64_t{h.op_len}) return drop(DROP_BAD_LENGTH, st);
    const bool scatter = h.msg_type == MSG_SCATTER;
    // piggybacked t_C of a valid peer frame, at most t_c_max_us (above every t_B)
    set_tc(scatter ? 1 : 2, h.sender, std::min<int64_t>(h.t_c_us, p_.t_c_max_us), now);
    peer_progress(now, h.sender, h.op_id);
    op = find(h.op_id);
    if (op == nullptr) return drop(DROP_LATE, st);  // it was complete and has left the window
    const bool last = h.flags & FLAG_LAST;
    if (scatter) {
        if (op->p1.ended() || op->done) return drop(DROP_LATE, st);
        if (!op->add(h.pkt_index, h.sender, world_, p_.p, r.payload))
            return drop(DROP_DUPLICATE, st);
        op->p1.arrive(now, h.sender, last);
        counters_[RX_SCATTER] += 1;
    } else {
        if (op->done) return drop(DROP_LATE, st);
        if (!op->place(h.pkt_index, p_.p, r.payload, h.contributors))
            return drop(DROP_DUPLICATE, st);
        op->p2.arrive(now, h.sender, last);
        counters_[RX_GATHER] += 1;
    }
    if (h.flags & FLAG_NONFINITE) op->nonfinite = true;
    progress(*op, now);
}

std::vector<int16_t>& Engine::proposal_row(int64_t op_id) {
    auto [it, fresh] = proposals_.try_emplace(op_id);
    if (fresh) it->second.assign(world_, NO_RECORD);
    return it->second;
}

void Engine::note_proposal(const Header& h) {
    // the sender's proposal for op_id + lead, if that op has not started; the first heard wins
    const int64_t target = int64_t{h.op_id} + inband_.lead;
    if (target <= last_started_) return;
    int16_t& cell = proposal_row(target)[h.sender];
    if (cell == NO_RECORD)
        cell = proposal_present(h.reserved) ? static_cast<int16_t>(proposal_value(h.reserved))
                                            : NO_PROPOSAL;
}

void Engine::peer_progress(int64_t now, int sender, int64_t op_id) {
    // A NIC starts op j only after op j - K is complete: sender is done with those.
    const int64_t done = op_id - p_.ops_in_flight;
    peer_done_[sender] = std::max(peer_done_[sender], done);
    ids_.clear();
    for (const auto& op : ops_) ids_.push_back(op->op_id);
    for (int64_t id : ids_) {
        Op* o = find(id);
        if (o == nullptr || o->op_id > done || o->done) continue;
        o->p1.sender_gone(now, sender);
        o->p2.sender_gone(now, sender);
        progress(*o, now);
    }
}

void Engine::progress(Op& op, int64_t now) {
    int64_t t;
    Reason reason;
    if (phase(op) == 1 && op.p1.due(now, timeout(1), t_change_[0], t, reason))
        end_phase1(op, t, reason);
    if (phase(op) == 2 && op.p2.due(now, timeout(2), t_change_[1], t, reason))
        end_phase2(op, t, reason);  // may release op
}

void Engine::end_phase(int phase, PhaseTracker& ph, int64_t t, Reason reason) {
    int64_t sample;
    if (ph.finish(t, reason, timeout(phase), p_.tc_sample, sample))
        set_tc(phase, rank_, tc_[phase - 1].sample(sample, p_), t);
}

void Engine::end_phase1(Op& op, int64_t t, Reason reason) {
    end_phase(1, op.p1, t, reason);
    OpStats& st = *op.stats;
    st.phase1_reason = reason;
    st.phase1_end_us = t;
    st.phase1_timeout_us = op.p1.timeout();
    st.p1_expected = op.p1.expected();
    st.p1_received = op.p1.received();
    st.p1_missing_from = op.p1.missing_from();
    const int P = p_.p;
    means_.resize(op.n_slots * P);
    reduced_.resize(op.n_slots);
    for (int64_t row = 0; row < op.n_slots; ++row) {
        const int64_t* a = op.acc.data() + row * P;
        const int64_t i = rank_ + row * world_;
        const bool own = !op.have[i];  // the owner's own reduced packets: straight into z
        int32_t* m = own ? op.z.data() + i * P : means_.data() + row * P;
        if (op.count[row] == 0)
            std::fill(m, m + P, 0);  // nothing arrived (its acc was never written)
        else
            div_round_n(a, static_cast<size_t>(P), op.count[row], m);
        if (own) {
            op.have[i] = 1;
            op.contributors[i] = op.count[row];
        }
        reduced_[row] = m;
    }
    // phase 2: each reduced slot to every other rank, the last slots flagged
    const int64_t nflag = flagged_count(op.n_slots, p_.last_percent);
    const int64_t tc2 = tc_[1].tc;
    for (int64_t row = 0; row < op.n_slots; ++row) {
        const int64_t i = rank_ + row * world_;
        const bool last = row >= op.n_slots - nflag;
        for (int dst = 0; dst < world_; ++dst) {
            if (dst == rank_) continue;
            const Header h = header(op, MSG_GATHER, i, static_cast<int>(op.count[row]), last, tc2);
            send(t, op, 2, dst, i, h, reduced_[row]);
        }
    }
    op.p2.begin(t, op.p1.start() + op.p1.timeout());
}

void Engine::end_phase2(Op& op, int64_t t, Reason reason) {
    end_phase(2, op.p2, t, reason);
    std::shared_ptr<OpStats> stats = op.stats;
    OpStats& st = *stats;
    st.phase2_reason = reason;
    st.end_us = t;
    st.phase2_timeout_us = op.p2.timeout();
    st.p2_expected = op.p2.expected();
    st.p2_received = op.p2.received();
    st.p2_missing_from = op.p2.missing_from();
    st.contributor_hist.assign(world_ + 1, 0);
    for (int64_t k = 0; k < op.n_packets; ++k) {
        const int64_t c = op.have[k] ? op.contributors[k] : 0;
        if (c >= static_cast<int64_t>(st.contributor_hist.size()))
            st.contributor_hist.resize(c + 1, 0);
        st.contributor_hist[c] += 1;
    }
    const int P = p_.p;
    for (int64_t k = 0; k < op.n_packets; ++k)  // decode reads missing packets as zeros
        if (!op.have[k]) std::fill(op.z.data() + k * P, op.z.data() + (k + 1) * P, 0);
    OpResult res{op.op_id, {}, stats};
    float* out = op.out;
    if (out == nullptr) {
        res.data.resize(op.n);
        out = res.data.data();
    }
    const DecodeCounts dc = decode(op.z.data(), op.have.data(), op.n, op.exponent,
                                   static_cast<uint32_t>(op.op_id), p_, out);
    st.sat_output = dc.sat_output;
    st.empty_blocks = dc.empty_blocks;
    if (op.nonfinite) {  // never a number: the same quiet NaN on every rank
        std::fill(out, out + op.n, std::numeric_limits<float>::quiet_NaN());
        st.nonfinite_result = 1;
    }
    st.t_c_us[0] = tc_[0].tc;
    st.t_c_us[1] = tc_[1].tc;
    op.done = true;
    counters_[OPS_COMPLETED] += 1;
    results_.push_back(std::move(res));
    // the window slides past every complete op at its base
    while (!ops_.empty()) {
        auto it = std::find_if(ops_.begin(), ops_.end(),
                               [&](const std::unique_ptr<Op>& o) { return o->op_id == base_; });
        if (it == ops_.end() || !(*it)->done) break;
        std::unique_ptr<Op> gone = std::move(*it);
        ops_.erase(it);
        release(std::move(gone));
        base_ += 1;
    }
}

Header Engine::header(const Op& op, uint8_t msg_type, int64_t pkt_index, int contributors,
                      bool last, int64_t t_c) const {
    Header h;
    h.version = UBT_VERSION;
    h.msg_type = msg_type;
    const bool nf = msg_type == MSG_SCATTER ? op.nonfinite_own : op.nonfinite;
    h.flags = static_cast<uint8_t>((last ? FLAG_LAST : 0) | (nf ? FLAG_NONFINITE : 0));
    h.exponent = static_cast<int8_t>(op.exponent);
    h.job_id = static_cast<uint16_t>(p_.job_id);
    h.sender = static_cast<uint16_t>(rank_);
    h.op_id = static_cast<uint32_t>(op.op_id);
    h.pkt_index = static_cast<uint32_t>(pkt_index);
    h.count = static_cast<uint16_t>(p_.p);
    h.contributors = static_cast<uint16_t>(contributors);
    h.t_c_us = static_cast<uint32_t>(t_c);
    h.op_len = static_cast<uint32_t>(op.n);
    h.world = static_cast<uint16_t>(world_);
    h.reserved = op.proposal_word;
    return h;
}

void Engine::send(int64_t now, const Op& op, int phase, int dst, int64_t pkt_index,
                  const Header& h, const int32_t* values) {
    counters_[phase == 1 ? TX_SCATTER : TX_GATHER] += 1;
    const size_t len = frame_len(h.count);
    const size_t off = arena_.size();
    arena_.resize(off + len);
    build_frame(h, values, rank_, dst, static_cast<uint16_t>(p_.udp_port), addr_,
                arena_.data() + off);
    tx_.push_back(Tx{now, dst, phase, op.op_id, pkt_index, off, len});
}

}  // namespace optireduce
