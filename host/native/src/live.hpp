// The live native NIC of one rank: an engine thread that owns the Engine (engine.hpp), the
// UDP transport (transport.hpp) and the impairment with its release queue (impairment.hpp).
//
// The caller (the Python thread, GIL released around every wait) submits ops: op id, a
// pointer to the chunk, a pointer where its result goes, the agreed exponent. The engine
// thread starts each op when the window (K ops) has room, runs the network and the timers
// on CLOCK_MONOTONIC microsecond ticks, writes each result where it was asked and hands the
// op's stats back under a condition variable. Every wait is bounded; stop() joins.
//
// Memory: the engine's window (2K ops of at most C elements), one receive batch, the
// release queue's copies in flight; nothing grows with the bucket size.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "codec.hpp"
#include "engine.hpp"
#include "engine_loop.hpp"
#include "impairment.hpp"
#include "transport.hpp"

namespace optireduce {

struct LiveConfig {
    Params p;
    int rank = 0, world = 2;
    std::string bind_ip = "127.0.0.1";
    int port = 0;
    int adopt_fd = -1;  // >= 0: use (a dup of) this bound socket instead of binding one
    int buffer_bytes = 64 << 20;
    ImpairmentSpec impairment;
    uint64_t seed = 0;
    int64_t first_op = 0;
    int64_t max_wait_us = 2000;  // longest sleep with nothing due (stop is also woken at once)
    Inband inband;  // NicParams.exp_inband / exp_lead_eff
    JobKey key;     // a keyed job's (transport.hpp)
};

struct LiveDone {
    int64_t op_id;
    OpStats stats;
};

// One datagram in the trace (set_trace): a send (the engine's tick when it left the engine,
// the injected delay of its first copy, -1 if every copy was dropped, and the late link's
// share of it) or an arrival (the tick the engine was given and, in delay_us, its verdict:
// the drop reason's index, -1 when accepted). Loss attribution joins a sender's sends with a
// receiver's arrivals on CLOCK_MONOTONIC (now_us() + origin).
struct TraceEntry {
    int64_t op_id, pkt_index, tick_us;
    int32_t phase, peer;  // peer: the destination of a send, the sender of an arrival
    int64_t delay_us, extra_us;  // sends; an arrival's verdict in delay_us
};

// Live counters beside the engine's and the transport's (LIVE_COUNTER_NAMES, in this order).
enum LiveCounter : int {
    L_IMP_LOST,
    L_IMP_DUPLICATED,
    L_IMP_REORDERED,
    L_QUEUE_MAX,  // most copies the release queue held at once
    L_LOOPS,
    L_ENGINE_CPU_US,  // CPU time of the engine thread so far
    N_LIVE_COUNTERS,
};
extern const char* const LIVE_COUNTER_NAMES[N_LIVE_COUNTERS];

class LiveNic {
public:
    explicit LiveNic(const LiveConfig& cfg);
    ~LiveNic();  // stop() and join
    LiveNic(const LiveNic&) = delete;
    LiveNic& operator=(const LiveNic&) = delete;

    PeerAddr local() const { return local_; }
    int rcvbuf() const { return rcvbuf_; }
    int sndbuf() const { return sndbuf_; }
    int rank() const { return cfg_.rank; }
    int world() const { return cfg_.world; }

    // ---- from any thread; each waits at most timeout_us for the engine thread
    void connect(const std::vector<PeerAddr>& peers, int64_t timeout_us);
    void exclude(int rank, int64_t timeout_us);
    void set_t_b(int64_t t_b_us, int64_t timeout_us);
    void set_impairment(const ImpairmentSpec& spec, int64_t timeout_us);
    std::vector<int> gone(int64_t timeout_us);
    // engine counters, then transport counters, then live counters, then exponent counters
    std::vector<int64_t> counters(int64_t timeout_us);
    // Forget every op not yet started and every result not yet written: after this returns,
    // the engine thread touches none of the submitted pointers again. The ops already started
    // run to their end on the wire. Returns the next op id to submit.
    int64_t cancel(int64_t timeout_us);
    // Keep (on) or stop keeping a trace of every UBT datagram sent and received, at most
    // max_entries of each (later ones are counted, not kept); take_trace moves it out.
    void set_trace(bool on, size_t max_entries, int64_t timeout_us);
    // (sends, arrivals, entries not kept)
    void take_trace(std::vector<TraceEntry>& sent, std::vector<TraceEntry>& arrived,
                    int64_t& dropped, int64_t timeout_us);

    // Queue op `op_id` (the next id: next_op()); in and out hold n floats and must stay valid
    // until its result is handed back or cancel() returns. No exponent: the in-band one
    // (Engine::start_op); next_proposal: this rank's proposal for op_id + lead (in-band only).
    // Throws std::invalid_argument.
    void submit(int64_t op_id, const float* in, float* out, size_t n,
                std::optional<int> exponent, std::optional<int> next_proposal = std::nullopt);
    int64_t next_op() const { return next_submit_; }
    // Waits up to timeout_us until at least `at_least` ops have finished (one wake-up per
    // bucket, not per op), moves what finished into out (appends). False when nothing had
    // finished. Throws std::runtime_error if the engine thread failed.
    bool wait(int64_t timeout_us, size_t at_least, std::vector<LiveDone>& out);

    void stop();  // idempotent

    int64_t now_us() const { return loop_.now_us(); }

private:
    struct Submit {
        int64_t op_id;
        const float* in;
        float* out;
        size_t n;
        std::optional<int> exponent;
        std::optional<int> next_proposal;
    };
    void step();  // one turn of the loop
    void receive();
    int64_t tick(int64_t t);
    void take_inbox();
    void start_ready(int64_t now);
    void send_engine_tx(int64_t now);
    void release_due(int64_t now);
    void collect();
    int64_t wait_until() const;
    void sleep_io(int64_t timeout_us);
    void on_exit();

    EngineLoop loop_{"the engine thread"};  // its mu() guards the shared state below
    LiveConfig cfg_;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<UdpTransport> tr_;
    Impairment imp_;
    ReleaseQueue queue_;
    PeerAddr local_;
    int rcvbuf_ = 0, sndbuf_ = 0;

    // shared with callers, under loop_.mu()
    std::condition_variable done_cv_;
    std::deque<Submit> inbox_;
    std::vector<LiveDone> done_;
    size_t want_ = 1;  // results the waiter waits for
    int64_t next_submit_;  // caller side (submit is called from one thread at a time)

    // engine thread only
    std::deque<Submit> pending_;  // submitted, not yet started
    std::vector<Submit> started_;  // started, result not yet written (by op id)
    bool connected_ = false;
    int64_t last_tick_ = 0;
    std::vector<Datagram> rx_;
    std::vector<OutDatagram> out_;
    int64_t live_[N_LIVE_COUNTERS] = {};
    bool trace_on_ = false;
    size_t trace_max_ = 0;
    std::vector<TraceEntry> trace_tx_, trace_rx_;
    int64_t trace_dropped_ = 0;
    void trace(std::vector<TraceEntry>& log, const TraceEntry& e);

    std::atomic<bool> has_peers_{false};  // connect() has run: submit may queue ops
};

}  // namespace optireduce
