// The native event engine of one NIC: the C++ twin of host/model/nic_model.py (NicModel).
//
// Same events, same outputs, bit for bit: start_op() takes a chunk, receive() Ethernet
// frames (receive_datagram() bare UBT datagrams), advance() fires the timers due, and the
// engine emits the model's Tx frames, results, per-op stats and counters. Time is the
// caller's (microsecond ticks). No Python and no locks here: one engine per thread; the
// binding (bind_engine.cpp) releases the GIL around the calls. Frames and buffers are
// reused, so the per-packet path does not allocate once the engine has warmed up.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "codec.hpp"
#include "engine_deadline.hpp"
#include "wire.hpp"

namespace optireduce {

// The counters after the drop reasons (COUNTERS in optireduce/counters.py).
enum Counter : int {
    RX_SCATTER = N_DROPS,
    RX_GATHER,
    TX_SCATTER,
    TX_GATHER,
    OPS_STARTED,
    OPS_COMPLETED,
    N_COUNTERS,
};
const char* counter_name(int k);

// nic_model.EXP_COUNTERS: how the ops' exponents were chosen (not in the register bank).
enum ExpCounter : int {
    EXP_GIVEN,
    EXP_INBAND,
    EXP_INCOMPLETE,
    EXP_FOLLOWED,
    EXP_MISSING,
    EXP_SATURATED,
    N_EXP_COUNTERS,
};
const char* exp_counter_name(int k);

// NicParams.exp_inband and exp_lead_eff (Params holds the codec's fields only).
struct Inband {
    bool on = false;
    int lead = 0;  // op j carries proposals for op j + lead (>= K)
};

// nic_model.InbandExponent.
struct InbandExponent {
    std::optional<int> exponent;  // max of the proposals; none if a rank gave none
    std::vector<int> missing;     // live peers whose proposal has not arrived
    std::vector<int> unknown;     // ranks that sent "no proposal" (this one too, if so)
};

// An allocator whose resize leaves new elements uninitialised: the frame arena's room for a
// frame is written in full right after it is made (zero-filling it first cost 4 % of the
// engine's CPU in a lossless op).
template <class T>
struct NoInitAllocator : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = NoInitAllocator<U>;
    };
    NoInitAllocator() = default;
    template <class U>
    NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
        ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... A>
    void construct(U* p, A&&... a) {
        ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
    }
};

// optireduce/op_stats.py OpStats, field for field.
struct OpStats {
    int64_t op_id = 0, rank = 0, world = 0, n = 0, exponent = 0;
    int64_t start_us = 0, end_us = 0;
    Reason phase1_reason = Reason::none, phase2_reason = Reason::none;
    int64_t phase1_timeout_us = 0, phase2_timeout_us = 0, phase1_end_us = 0;
    int64_t p1_expected = 0, p1_received = 0, p2_expected = 0, p2_received = 0;
    std::vector<int64_t> contributor_hist;  // [0] = reduced packets missing
    int64_t sat_quantize = 0, sat_transform = 0, sat_output = 0, nonfinite = 0;
    int64_t nonfinite_result = 0;  // 1: the result is NaN (a non-finite input here or at a peer)
    int64_t empty_blocks = 0, late = 0, duplicate = 0;
    int64_t t_c_us[2] = {0, 0};
    std::vector<int64_t> p1_missing_from, p2_missing_from;  // per sender
};

// A frame put on the network port; its bytes are tx_frame(i) until clear_tx().
struct Tx {
    int64_t time_us;
    int32_t dst;
    int32_t phase;  // 1 scatter, 2 gather
    int64_t op_id;
    int64_t pkt_index;
    size_t offset, len;  // in the engine's frame arena
};

struct OpResult {
    int64_t op_id;
    std::vector<float> data;  // the estimated mean (empty if start_op was given out)
    std::shared_ptr<OpStats> stats;  // still counts late frames until the op leaves the window
};

class Engine {
public:
    Engine(const Params& p, int rank, int world, const Addressing& a = Addressing{},
           int64_t first_op = 0, Inband inband = Inband{});
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // ---- host port
    // Throws std::invalid_argument as NicModel.start_op raises ValueError. No exponent:
    // the in-band one (inband_exponent, or that of peers ahead); next_proposal: this rank's
    // proposal for op_id + lead, none for "no proposal". out (n floats, or null): where the
    // result is decoded, so it is not copied out of OpResult.data (left empty then); it must
    // stay valid until the op's result is polled.
    void start_op(int64_t now, int64_t op_id, const float* data, size_t n,
                  std::optional<int> exponent, std::optional<int> next_proposal,
                  float* out = nullptr);
    void start_op(int64_t now, int64_t op_id, const float* data, size_t n, int exponent,
                  float* out = nullptr) {
        start_op(now, op_id, data, n, std::optional<int>(exponent), std::nullopt, out);
    }
    // Forget every out pointer start_op was given: those ops' results go to OpResult.data.
    void detach_outputs();
    InbandExponent inband_exponent(int64_t op_id) const;
    void put_proposal(int64_t op_id, int rank, std::optional<int> proposal);
    std::vector<OpResult> poll_results();

    // ---- network port
    void receive(int64_t now, const uint8_t* frame, size_t n);
    void receive_datagram(int64_t now, const uint8_t* datagram, size_t n);
    const std::vector<Tx>& tx() const { return tx_; }
    const uint8_t* tx_frame(const Tx& t) const { return arena_.data() + t.offset; }
    void clear_tx();

    // ---- time
    std::optional<int64_t> next_timer() const;
    void advance(int64_t now);
    void exclude(int64_t now, int rank);  // throws std::invalid_argument outside 0..world-1
    void set_t_b(int64_t t_b_us);         // a recalibrated hard bound (driver's set_t_b)

    // ---- state, as NicModel exposes it
    const Params& params() const { return p_; }
    int rank() const { return rank_; }
    int world() const { return world_; }
    int64_t base() const { return base_; }
    int64_t last_started() const { return last_started_; }
    const int64_t* counters() const { return counters_; }
    const int64_t* exp_counters() const { return exp_counters_; }
    int64_t tc(int phase) const { return tc_[phase - 1].tc; }
    int64_t tc_table(int phase, int rank) const { return tc_table_[phase - 1][rank]; }
    std::vector<int> gone() const;  // in the order the engine learnt of them
    size_t ops_in_window() const { return ops_.size(); }

private:
    struct Op;
    Op* find(int64_t op_id) const;
    Op* new_op(int64_t op_id, int64_t n, int exponent, int64_t now);
    std::unique_ptr<Op> make_op(int64_t op_id, int64_t n, int exponent, int64_t now);
    void release(std::unique_ptr<Op> op);
    int phase(const Op& op) const;
    void drop(int reason, OpStats* stats = nullptr);
    int64_t timeout(int phase) const;  // the agreed T of a phase, cached until a t_C changes
    void set_tc(int phase, int rank, int64_t tc, int64_t now);
    bool op_timer(const Op& op, int64_t& t) const;
    void accept(int64_t now, int code, const Parsed& r);
    void peer_progress(int64_t now, int sender, int64_t op_id);
    void note_proposal(const Header& h);
    std::vector<int16_t>& proposal_row(int64_t op_id);
    void progress(Op& op, int64_t now);
    void end_phase(int phase, PhaseTracker& ph, int64_t t, Reason reason);
    void end_phase1(Op& op, int64_t t, Reason reason);
    void end_phase2(Op& op, int64_t t, Reason reason);
    void send(int64_t now, const Op& op, int phase, int dst, int64_t pkt_index,
              const Header& h, const int32_t* values);
    Header header(const Op& op, uint8_t msg_type, int64_t pkt_index, int contributors,
                  bool last, int64_t t_c) const;

    Params p_;
    int rank_, world_;
    Addressing addr_;
    int64_t counters_[N_COUNTERS] = {};
    Inband inband_;
    int64_t exp_counters_[N_EXP_COUNTERS] = {};
    // target op -> per rank: NO_RECORD, NO_PROPOSAL or the proposal (the model's dict)
    std::map<int64_t, std::vector<int16_t>> proposals_;
    TcEstimator tc_[2];
    std::vector<int64_t> tc_table_[2];
    int64_t t_change_[2] = {0, 0};
    mutable int64_t t_cached_[2] = {0, 0};
    mutable bool t_valid_[2] = {false, false};
    int64_t base_, last_started_;
    std::vector<std::unique_ptr<Op>> ops_;  // in the model's dict order
    std::vector<std::unique_ptr<Op>> pool_;  // finished ops whose buffers are reused
    std::vector<uint8_t> is_gone_;
    std::vector<int> gone_order_;
    std::vector<int64_t> peer_done_;  // per peer, the last op it is known to be done with
    std::vector<Tx> tx_;
    std::vector<uint8_t, NoInitAllocator<uint8_t>> arena_;
    std::vector<OpResult> results_;
    // scratch, reused
    std::vector<int32_t> enc_;
    std::vector<int32_t> means_;
    std::vector<const int32_t*> reduced_;  // per slot: where end_phase1 put its mean
    mutable std::vector<int64_t> median_;
    std::vector<int64_t> ids_;
};

}  // namespace optireduce
