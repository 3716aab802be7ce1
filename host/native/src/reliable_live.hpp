// The reliable baselines, native: one engine thread per rank that owns a UdpTransport
// (transport.hpp), an Impairment and its ReleaseQueue (impairment.hpp), exactly as LiveNic
// does, and runs on them
//
// - a reliable message layer with host/reliable.py's wire format and rules: messages cut into
//   datagrams of at most max_datagram bytes behind a 32-byte header; selective ACKs (one per
//   source per receive batch, a bitmap of what is held or "complete"); an RTO of
//   srtt + 4 rttvar from timestamp echoes, clamped, doubled per retransmission; a probe per
//   message when its fragments fall due; a window of unacked bytes per destination;
//   duplicates counted and dropped; messages of one (src, tag) delivered in send order;
// - the collectives of experiments/baselines.py on it, as a list of actions (send, receive
//   and add, receive and copy, divide) run in order by the engine thread: ring allreduce
//   (reduce-scatter then allgather, 2(N-1) steps) and TAR (scatter to owners, owners sum in
//   rank order, gather). Same chunk bounds, same summation order, same float32 operations,
//   so the same bits as the Python baselines.
//
// Every datagram, ACKs included, goes through the impairment. The caller (GIL released)
// starts one collective and waits for it; the engine thread ends a collective whose current
// receive waited longer than its step timeout, and never touches the caller's arrays after
// the collective has been handed back or cancelled.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine_loop.hpp"
#include "impairment.hpp"
#include "transport.hpp"

namespace optireduce {

struct ReliableLiveConfig {
    int rank = 0, world = 2;
    std::string bind_ip = "127.0.0.1";
    int port = 0;
    int adopt_fd = -1;  // >= 0: use (a dup of) this bound socket
    int buffer_bytes = 64 << 20;
    ImpairmentSpec impairment;
    uint64_t seed = 0;
    // host/reliable.py's ReliableConfig
    size_t max_datagram = 32 * 1024;
    size_t window_bytes = 1 << 20;
    int64_t rto_init_us = 100000, rto_min_us = 10000, rto_max_us = 1000000;
    // Longest sleep with nothing due. Every event wakes the thread anyway (a datagram, a
    // caller, a timer: the next release, retransmission or step deadline), so an idle rank
    // sleeps long and leaves the shared cores to the ranks that work.
    int64_t max_wait_us = 100000;
    JobKey key;  // a keyed job's (transport.hpp)
    void check() const;          // throws std::invalid_argument
};

enum class Algo { ring, tar };

// Counters (RELIABLE_COUNTER_NAMES, in this order), then the transport's.
enum ReliableCounter : int {
    R_FRAGMENTS_SENT,  // first transmissions of data fragments
    R_RETRANSMISSIONS,
    R_DUPLICATES,      // data fragments received again
    R_ACKS_SENT,       // ACK datagrams
    R_FOREIGN,         // admitted datagrams without our magic or version
    R_MALFORMED,       // ours, but inconsistent (fragment index, sizes, ACK entries)
    R_MESSAGES_SENT,
    R_MESSAGES_DELIVERED,
    R_COLLECTIVES,
    R_SRTT_US,         // -1 before the first sample
    R_RTO_US,
    R_IMP_LOST,
    R_IMP_DUPLICATED,
    R_IMP_REORDERED,
    R_QUEUE_MAX,
    R_LOOPS,
    R_ENGINE_CPU_US,
    N_RELIABLE_COUNTERS,
};
extern const char* const RELIABLE_COUNTER_NAMES[N_RELIABLE_COUNTERS];

struct CollectiveResult {
    enum Status { ok, timeout, bad_size, cancelled } status = ok;
    std::string error;            // what went wrong, naming the rank and the step
    int64_t elapsed_us = 0;       // start to result, on the engine thread
    int64_t retransmissions = 0;  // during the collective (this rank's)
};

class ReliableLive {
public:
    explicit ReliableLive(const ReliableLiveConfig& cfg);
    ~ReliableLive();  // stop() and join
    ReliableLive(const ReliableLive&) = delete;
    ReliableLive& operator=(const ReliableLive&) = delete;

    PeerAddr local() const { return local_; }
    int rank() const { return cfg_.rank; }
    int world() const { return cfg_.world; }
    size_t payload() const { return payload_; }
    // fragments of one message at most: its ACK bitmap fits one datagram
    size_t max_frags() const { return std::min<size_t>(size_t{1} << 20, 8 * (payload_ - 8)); }

    // ---- from any thread; each waits at most timeout_us for the engine thread
    void connect(const std::vector<PeerAddr>& peers, int64_t timeout_us);
    void set_impairment(const ImpairmentSpec& spec, int64_t timeout_us);
    std::vector<int64_t> counters(int64_t timeout_us);  // reliable, then transport counters
    int64_t pending(int64_t timeout_us);  // fragments sent or queued, not acked yet
    int64_t quiet_us(int64_t timeout_us);  // since the last datagram of ours arrived

    // The mean over the ranks of in[0..n) into out[0..n) (must not overlap in), by `algo`.
    // Each receive waits at most step_timeout_us (then status timeout). Blocks until the
    // result, bounded; one collective at a time. Throws std::invalid_argument on bad
    // arguments, std::runtime_error if the engine thread failed.
    CollectiveResult allreduce(Algo algo, const float* in, float* out, size_t n,
                               int64_t step_timeout_us);

    void stop();  // idempotent

    int64_t now_us() const { return loop_.now_us(); }

private:
    // ---- message layer (engine thread only)
    struct OutMsg {
        std::shared_ptr<std::vector<uint8_t>> data;
        uint32_t tag = 0, seq = 0, nfrags = 0;
        uint32_t outstanding = 0;  // fragments not acked yet (queued or in flight)
    };
    struct Frag {
        uint32_t msg = 0, frag = 0;
        int64_t due = 0;
        int tries = 0;
        bool held = false;
    };
    struct Peer {
        std::deque<Frag> queue;  // waiting for the window
        std::map<uint64_t, Frag> unacked;  // (msg << 32 | frag), in message order
        std::map<uint32_t, OutMsg> msgs;  // msg -> message, until every fragment is acked
        size_t inflight = 0;
        uint32_t next_msg = 0;
    };
    struct Partial {
        uint32_t tag, seq, nfrags, have = 0;
        std::vector<bool> got;  // by fragment
        std::map<uint32_t, std::vector<uint8_t>> frags;  // only those held: memory follows data
    };
    struct Done {  // complete message ids of one source: all < low, plus a sparse set
        uint32_t low = 0;
        std::set<uint32_t> above;
        bool contains(uint32_t m) const { return m < low || above.count(m) != 0; }
        void add(uint32_t m);
    };
    struct Touched {
        uint32_t echo = 0;
        std::vector<uint32_t> msgs;
    };

    // ---- collectives
    struct Action {
        enum Kind { send, recv_add, recv_copy, copy, add, div } kind;
        int peer = -1;
        uint32_t tag = 0;
        const float* src = nullptr;
        float* dst = nullptr;
        size_t n = 0;
        const char* step = "";
        int index = -1;  // the step number within its phase (-1: none)
    };
    struct Collective {
        std::vector<Action> actions;
        size_t cur = 0;
        int64_t waiting_since = 0, step_timeout_us = 0, started = 0, retx0 = 0;
        const char* name = "";
    };
    void step();
    void receive(int64_t now);
    int64_t wait_until(int64_t now);
    void sleep_io(int64_t timeout_us);
    void on_exit();

    void send_message(int dst, uint32_t tag, const uint8_t* data, size_t len, int64_t now);
    void fill_window(int dst, Peer& peer, int64_t now);
    void transmit(int dst, Peer& peer, Frag& f, int64_t now);
    void emit(int dst, const uint8_t* data, size_t len, int64_t now);  // through the impairment
    void retransmit_due(int64_t now);
    int64_t backoff(int tries) const;
    void on_data(int src, const uint8_t* d, size_t len);
    void on_ack(int src, const uint8_t* d, size_t len, int64_t now);
    void ack_frag(Peer& peer, uint64_t key);
    void rtt_sample(double r_us);
    void send_acks(int64_t now);
    bool take(int src, uint32_t tag, std::vector<uint8_t>& out);
    void release_due(int64_t now);
    void advance(int64_t now);
    void finish(CollectiveResult::Status st, const std::string& error, int64_t now);
    std::vector<Action> plan(Algo algo, const float* in, float* out, size_t n) const;

    EngineLoop loop_{"the reliable engine thread"};  // its mu() guards the shared state below
    ReliableLiveConfig cfg_;
    size_t payload_;
    std::unique_ptr<UdpTransport> tr_;
    Impairment imp_;
    ReleaseQueue queue_;
    PeerAddr local_;

    // shared with callers, under loop_.mu()
    std::condition_variable done_cv_;
    std::optional<CollectiveResult> result_;
    std::mutex call_mu_;  // one allreduce at a time

    // engine thread only
    bool connected_ = false;
    std::vector<Peer> peers_;
    std::map<uint64_t, Partial> partial_;  // (src << 32 | msg)
    std::vector<Done> done_;               // by source
    std::map<uint64_t, std::map<uint32_t, std::vector<uint8_t>>> ready_;  // (src, tag) -> seq
    std::map<uint64_t, uint32_t> next_seq_;  // (src, tag) -> next seq to deliver
    std::map<uint64_t, uint32_t> send_seq_;  // (dst, tag) -> next seq
    std::map<int, Touched> touched_;
    std::optional<Collective> coll_;
    std::vector<uint8_t> scratch_, got_;
    std::vector<Datagram> rx_;
    std::vector<OutDatagram> out_;
    std::optional<double> srtt_;  // microseconds
    double rttvar_ = 0;
    int64_t rto_;
    int64_t last_rx_ = 0;
    int64_t c_[N_RELIABLE_COUNTERS] = {};

};

}  // namespace optireduce
