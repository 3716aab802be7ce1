// The live engine thread of one rank: see live.hpp.
//
// One turn of the loop: take what callers queued (commands, ops), fire the engine's timers,
// start the ops the window has room for, send (through the impairment and its release
// queue), hand finished results back, then sleep in ppoll until a datagram, a caller's
// wake-up, the engine's next timer or the queue's next release, whichever is first (at most
// max_wait_us), and drain the socket in batches.
#include "live.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <tuple>

namespace optireduce {

const char* const LIVE_COUNTER_NAMES[N_LIVE_COUNTERS] = {
    "impairment_lost", "impairment_duplicated", "impairment_reordered", "release_queue_max",
    "loops", "engine_cpu_us",
};

namespace {

int64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

constexpr size_t RX_BATCHES_PER_TURN = 16;  // then send and fire timers before reading more
constexpr size_t RELEASE_BATCH = 256;

}  // namespace

LiveNic::LiveNic(const LiveConfig& cfg)
    : cfg_(cfg),
      imp_((cfg.impairment.check(), cfg.impairment), cfg.seed),
      queue_(HEADER_LEN + 4 * static_cast<size_t>(cfg.p.p)),
      next_submit_(cfg.first_op) {
    if (cfg.max_wait_us < 1 || cfg.max_wait_us > 1000000)
        throw std::invalid_argument("max_wait_us must be in 1..1000000");
    engine_ = std::make_unique<Engine>(cfg.p, cfg.rank, cfg.world, Addressing{}, cfg.first_op,
                                       cfg.inband);
    tr_ = open_transport(cfg.adopt_fd, cfg.bind_ip, cfg.port, cfg.buffer_bytes,
                         HEADER_LEN + 4 * static_cast<size_t>(cfg.p.p), cfg.key);
    local_ = tr_->local();
    rcvbuf_ = tr_->rcvbuf();
    sndbuf_ = tr_->sndbuf();
    started_.reserve(2 * static_cast<size_t>(cfg.p.ops_in_flight));
    loop_.start("optireduce-r" + std::to_string(cfg.rank), [this] { step(); },
                [this] { on_exit(); });
}

LiveNic::~LiveNic() { stop(); }

void LiveNic::stop() { loop_.stop(); }

// ---- callers' side -----------------------------------------------------------------------

void LiveNic::connect(const std::vector<PeerAddr>& peers, int64_t timeout_us) {
    if (static_cast<int>(peers.size()) != cfg_.world)
        throw std::invalid_argument("connect: " + std::to_string(peers.size()) +
                                    " addresses for a world of " + std::to_string(cfg_.world));
    loop_.call([this, peers] {
        tr_->set_peers(peers, cfg_.rank);
        connected_ = true;
        has_peers_.store(true);
    }, timeout_us, "connect");
}

void LiveNic::exclude(int rank, int64_t timeout_us) {
    loop_.call([this, rank] { engine_->exclude(tick(now_us()), rank); }, timeout_us, "exclude");
}

void LiveNic::set_t_b(int64_t t_b_us, int64_t timeout_us) {
    loop_.call([this, t_b_us] { engine_->set_t_b(t_b_us); }, timeout_us, "set_t_b");
}

void LiveNic::set_impairment(const ImpairmentSpec& spec, int64_t timeout_us) {
    spec.check();
    loop_.call([this, spec] { imp_.set_spec(spec); }, timeout_us, "set_impairment");
}

std::vector<int> LiveNic::gone(int64_t timeout_us) {
    auto out = std::make_shared<std::vector<int>>();
    loop_.call([this, out] { *out = engine_->gone(); }, timeout_us, "gone");
    return *out;
}

std::vector<int64_t> LiveNic::counters(int64_t timeout_us) {
    auto out = std::make_shared<std::vector<int64_t>>();
    loop_.call([this, out] {
        const int64_t* e = engine_->counters();
        const int64_t* t = tr_->counters();
        out->assign(e, e + N_COUNTERS);
        out->insert(out->end(), t, t + N_TRANSPORT_COUNTERS);
        live_[L_IMP_LOST] = imp_.lost;
        live_[L_IMP_DUPLICATED] = imp_.duplicated;
        live_[L_IMP_REORDERED] = imp_.reordered;
        timespec cpu;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
        live_[L_ENGINE_CPU_US] = int64_t{cpu.tv_sec} * 1000000 + cpu.tv_nsec / 1000;
        out->insert(out->end(), live_, live_ + N_LIVE_COUNTERS);
        const int64_t* x = engine_->exp_counters();
        out->insert(out->end(), x, x + N_EXP_COUNTERS);
    }, timeout_us, "counters");
    return *out;
}

int64_t LiveNic::cancel(int64_t timeout_us) {
    auto next = std::make_shared<int64_t>(0);
    loop_.call([this, next] {
        pending_.clear();
        started_.clear();  // their results, when they come, are dropped
        engine_->detach_outputs();  // and decoded into the engine's own vectors
        {
            std::lock_guard<std::mutex> lk(loop_.mu());
            done_.clear();
        }
        *next = engine_->last_started() + 1;
    }, timeout_us, "cancel");
    next_submit_ = *next;
    return *next;
}

void LiveNic::set_trace(bool on, size_t max_entries, int64_t timeout_us) {
    loop_.call([this, on, max_entries] {
        trace_on_ = on;
        trace_max_ = max_entries;
    }, timeout_us, "set_trace");
}

void LiveNic::take_trace(std::vector<TraceEntry>& sent, std::vector<TraceEntry>& arrived,
                         int64_t& dropped, int64_t timeout_us) {
    auto out = std::make_shared<std::tuple<std::vector<TraceEntry>, std::vector<TraceEntry>,
                                           int64_t>>();
    loop_.call([this, out] {
        std::get<0>(*out).swap(trace_tx_);
        std::get<1>(*out).swap(trace_rx_);
        std::get<2>(*out) = trace_dropped_;
        trace_dropped_ = 0;
    }, timeout_us, "take_trace");
    sent = std::move(std::get<0>(*out));
    arrived = std::move(std::get<1>(*out));
    dropped = std::get<2>(*out);
}

void LiveNic::trace(std::vector<TraceEntry>& log, const TraceEntry& e) {
    if (log.size() < trace_max_)
        log.push_back(e);
    else
        trace_dropped_ += 1;
}

void LiveNic::submit(int64_t op_id, const float* in, float* out, size_t n,
                     std::optional<int> exponent, std::optional<int> next_proposal) {
    if (!has_peers_.load())
        throw std::invalid_argument("submit: no peers yet: connect() first");
    if (op_id != next_submit_)
        throw std::invalid_argument("submit: op " + std::to_string(op_id) +
                                    " is not the next op (" + std::to_string(next_submit_) + ")");
    if (n < 1 || static_cast<int64_t>(n) > cfg_.p.c)
        throw std::invalid_argument("submit: " + std::to_string(n) +
                                    " elements; an op holds 1..c=" + std::to_string(cfg_.p.c));
    for (const auto& [e, what] : {std::make_pair(exponent, "exponent"),
                                  std::make_pair(next_proposal, "next_proposal")})
        if (e && (*e < EXP_MIN || *e > EXP_MAX))
            throw std::invalid_argument(std::string("submit: ") + what + " " +
                                        std::to_string(*e) + " outside int8");
    if ((!exponent || next_proposal) && !cfg_.inband.on)
        throw std::invalid_argument("submit: in-band exponents need NicParams.exp_inband");
    {
        std::lock_guard<std::mutex> lk(loop_.mu());
        loop_.check_running("submit");
        inbox_.push_back(Submit{op_id, in, out, n, exponent, next_proposal});
    }
    next_submit_ += 1;
    loop_.wake();
}

bool LiveNic::wait(int64_t timeout_us, size_t at_least, std::vector<LiveDone>& out) {
    std::unique_lock<std::mutex> lk(loop_.mu());
    at_least = std::max<size_t>(at_least, 1);
    want_ = at_least;
    done_cv_.wait_for(lk, std::chrono::microseconds(std::max<int64_t>(0, timeout_us)),
                      [&] { return done_.size() >= at_least || loop_.exited(); });
    want_ = 1;
    if (!done_.empty()) {
        for (LiveDone& d : done_) out.push_back(std::move(d));
        done_.clear();
        return true;
    }
    if (loop_.failed()) throw std::runtime_error("live engine failed: " + loop_.error());
    if (loop_.exited()) throw std::runtime_error("live engine stopped");
    return false;
}

// ---- engine thread -----------------------------------------------------------------------

void LiveNic::on_exit() {
    std::lock_guard<std::mutex> lk(loop_.mu());
    done_cv_.notify_all();  // a waiter sees exited() and says why
}

void LiveNic::step() {
    live_[L_LOOPS] += 1;
    take_inbox();
    receive();
    const int64_t now = tick(now_us());
    engine_->advance(now);
    start_ready(now);
    send_engine_tx(now);
    release_due(now);
    collect();
    sleep_io(wait_until() - now_us());
}

int64_t LiveNic::tick(int64_t t) {
    // The engine's time never goes back (a datagram read late keeps its arrival tick only
    // while no later tick was given).
    last_tick_ = std::max(last_tick_, t);
    return last_tick_;
}

void LiveNic::receive() {
    for (size_t b = 0; b < RX_BATCHES_PER_TURN; ++b) {
        if (tr_->recv_batch(rx_) == 0) break;
        timespec real;
        clock_gettime(CLOCK_REALTIME, &real);
        const int64_t now_ns = mono_ns();
        const int64_t to_mono = now_ns - (int64_t{real.tv_sec} * 1000000000 + real.tv_nsec);
        const int64_t now = now_us();
        for (const Datagram& d : rx_) {
            // the kernel's arrival time on our clock, within [last tick, now]
            int64_t t = now;
            if (d.arrival_ns != 0) t = std::min(now, (d.arrival_ns + to_mono - loop_.t0_ns()) / 1000);
            if (!trace_on_ || d.len < HEADER_LEN) {
                engine_->receive_datagram(tick(t), d.data, d.len);
                continue;
            }
            int64_t before[N_DROPS];  // the engine's verdict: which drop counter moved
            std::copy(engine_->counters(), engine_->counters() + N_DROPS, before);
            engine_->receive_datagram(tick(t), d.data, d.len);
            int64_t verdict = -1;
            for (int k = 0; k < N_DROPS && verdict < 0; ++k)
                if (engine_->counters()[k] != before[k]) verdict = k;
            const Header h = unpack_header(d.data);
            trace(trace_rx_, TraceEntry{h.op_id, h.pkt_index, tick(t), h.msg_type, d.rank,
                                        verdict, 0});
        }
        send_engine_tx(tick(now));
    }
}

void LiveNic::take_inbox() {
    {
        std::lock_guard<std::mutex> lk(loop_.mu());
        for (const Submit& s : inbox_) pending_.push_back(s);
        inbox_.clear();
    }
    loop_.run_calls();
}

void LiveNic::start_ready(int64_t now) {
    // Before connect() there is nowhere to send: ops wait.
    while (connected_ && !pending_.empty() &&
           pending_.front().op_id < engine_->base() + cfg_.p.ops_in_flight) {
        const Submit s = pending_.front();
        pending_.pop_front();
        engine_->start_op(now, s.op_id, s.in, s.n, s.exponent, s.next_proposal,
                          s.out);  // decoded in place
        started_.push_back(s);
    }
}

void LiveNic::send_engine_tx(int64_t now) {
    const std::vector<Tx>& tx = engine_->tx();
    if (tx.empty()) return;
    const bool direct = !imp_.spec().active() && queue_.size() == 0;
    if (direct) {
        out_.clear();
        for (const Tx& t : tx)
            out_.push_back(OutDatagram{t.dst, engine_->tx_frame(t) + L2_L4_LEN, t.len - L2_L4_LEN});
        if (trace_on_)
            for (const Tx& t : tx)
                trace(trace_tx_, TraceEntry{t.op_id, t.pkt_index, now, t.phase, t.dst, 0, 0});
        const size_t sent = tr_->send_batch(out_.data(), out_.size());
        for (size_t i = sent; i < out_.size(); ++i)  // a full send buffer: retried in order
            queue_.push(now, out_[i].dst, out_[i].data, out_[i].len);
    } else {
        double delays[2];
        for (const Tx& t : tx) {
            const int k = imp_.fates(delays);
            if (trace_on_)
                trace(trace_tx_, TraceEntry{t.op_id, t.pkt_index, now, t.phase, t.dst,
                                            k ? std::llround(delays[0]) : -1,
                                            std::llround(imp_.spec().extra_us)});
            for (int j = 0; j < k; ++j)
                queue_.push(now + std::llround(delays[j]), t.dst, engine_->tx_frame(t) + L2_L4_LEN,
                            t.len - L2_L4_LEN);
        }
    }
    live_[L_QUEUE_MAX] = std::max<int64_t>(live_[L_QUEUE_MAX], static_cast<int64_t>(queue_.size()));
    engine_->clear_tx();
    release_due(now);
}

void LiveNic::release_due(int64_t now) {
    while (queue_.next() && *queue_.next() <= now) {
        const size_t k = queue_.pop_due(now, RELEASE_BATCH, out_);
        const size_t sent = tr_->send_batch(out_.data(), k);
        queue_.done(sent);
        if (sent < k) break;  // the send buffer is full: sleep_io waits for room
    }
}

void LiveNic::collect() {
    std::vector<OpResult> res = engine_->poll_results();
    if (res.empty()) return;
    std::vector<LiveDone> ready;
    for (OpResult& r : res) {
        auto it = std::find_if(started_.begin(), started_.end(),
                               [&](const Submit& s) { return s.op_id == r.op_id; });
        if (it == started_.end()) continue;  // cancelled
        started_.erase(it);
        ready.push_back(LiveDone{r.op_id, *r.stats});
    }
    if (ready.empty()) return;
    bool enough;
    {
        std::lock_guard<std::mutex> lk(loop_.mu());
        for (LiveDone& d : ready) done_.push_back(std::move(d));
        enough = done_.size() >= want_;
    }
    if (enough) done_cv_.notify_all();  // the waiter sleeps on until its count is reached
}

int64_t LiveNic::wait_until() const {
    const int64_t now = now_us();
    int64_t t = now + cfg_.max_wait_us;
    if (const auto nt = engine_->next_timer()) t = std::min(t, *nt);
    if (const auto q = queue_.next()) t = std::min(t, *q);
    if (connected_ && !pending_.empty() &&
        pending_.front().op_id < engine_->base() + cfg_.p.ops_in_flight)
        t = now;
    return t;
}

void LiveNic::sleep_io(int64_t timeout_us) {
    const auto q = queue_.next();
    const bool refused = q && *q <= now_us();  // sends were refused: wake when there is room
    loop_.sleep_io(tr_->fd(), refused ? std::min<int64_t>(timeout_us, 1000) : timeout_us, refused);
}

}  // namespace optireduce
