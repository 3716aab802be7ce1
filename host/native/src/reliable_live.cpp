// The native reliable baselines: see reliable_live.hpp.
//
// One turn of the engine loop: run what callers queued, drain the socket (acking each
// receive batch), advance the collective, send again what fell due, release the impairment's
// due copies, then sleep in ppoll until a datagram, a caller, the next release, the next
// retransmission or the collective's step deadline.
#include "reliable_live.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace optireduce {

const char* const RELIABLE_COUNTER_NAMES[N_RELIABLE_COUNTERS] = {
    "fragments_sent", "retransmissions", "duplicates",  "acks_sent",       "foreign",
    "malformed",      "messages_sent",   "messages_delivered", "collectives", "srtt_us",
    "rto_us",         "impairment_lost", "impairment_duplicated", "impairment_reordered",
    "release_queue_max", "loops",        "engine_cpu_us",
};

namespace {

// host/reliable.py's header: "!2sBBIIIIIII" magic kind version src tag msg seq frag nfrags ts.
// src is a 32-bit field whose low 16 bits sit at bytes 6..7, where the transport's admission
// reads a UBT sender: the same check applies.
constexpr size_t HDR = 32;
constexpr uint8_t KIND_DATA = 0, KIND_ACK = 1, VERSION = 1;
constexpr uint32_t TAG_RING = 0x52000000;  // + step
constexpr uint32_t TAG_TAR_SCATTER = 0x54000001;
constexpr uint32_t TAG_TAR_GATHER = 0x54000002;
constexpr size_t RX_BATCHES_PER_TURN = 16;
constexpr size_t RELEASE_BATCH = 256;
constexpr uint32_t MAX_MSGS_AHEAD = 1u << 20;

uint32_t rd32(const uint8_t* p) {
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

void wr32(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    p[1] = static_cast<uint8_t>(v >> 16);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(v);
}

void header(uint8_t* h, uint8_t kind, uint32_t src, uint32_t tag, uint32_t msg, uint32_t seq,
            uint32_t frag, uint32_t nfrags, uint32_t ts) {
    h[0] = 'R';
    h[1] = 'M';
    h[2] = kind;
    h[3] = VERSION;
    wr32(h + 4, src);
    wr32(h + 8, tag);
    wr32(h + 12, msg);
    wr32(h + 16, seq);
    wr32(h + 20, frag);
    wr32(h + 24, nfrags);
    wr32(h + 28, ts);
}

uint64_t key2(uint64_t a, uint32_t b) { return (a << 32) | b; }

std::string seconds(int64_t us) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(us) * 1e-6);
    return buf;
}

// Microseconds of the engine's clock modulo 2^32 (round trips are far shorter).
uint32_t stamp(int64_t us) { return static_cast<uint32_t>(us); }

}  // namespace

void ReliableLiveConfig::check() const {
    auto bad = [](const std::string& m) { throw std::invalid_argument("reliable: " + m); };
    if (world < 1 || world > 65535) bad("world " + std::to_string(world) + " not in 1..65535");
    if (rank < 0 || rank >= world)
        bad("rank " + std::to_string(rank) + " not in 0.." + std::to_string(world - 1));
    if (max_datagram < 64 || max_datagram > 65507)
        bad("max_datagram " + std::to_string(max_datagram) + " not in 64..65507");
    if (window_bytes < max_datagram) bad("window_bytes must hold at least one datagram");
    if (!(0 < rto_min_us && rto_min_us <= rto_init_us && rto_init_us <= rto_max_us))
        bad("need 0 < rto_min <= rto_init <= rto_max");
    if (max_wait_us < 1 || max_wait_us > 1000000) bad("max_wait_us must be in 1..1000000");
    impairment.check();
}

void ReliableLive::Done::add(uint32_t m) {
    if (contains(m)) return;
    above.insert(m);
    while (!above.empty() && *above.begin() == low) {
        above.erase(above.begin());
        low += 1;
    }
}

ReliableLive::ReliableLive(const ReliableLiveConfig& cfg)
    : cfg_((cfg.check(), cfg)),
      payload_(cfg.max_datagram - HDR),
      imp_(cfg.impairment, cfg.seed),
      queue_(cfg.max_datagram),
      rto_(cfg.rto_init_us) {
    tr_ = open_transport(cfg_.adopt_fd, cfg_.bind_ip, cfg_.port, cfg_.buffer_bytes,
                         cfg_.max_datagram, cfg_.key);
    local_ = tr_->local();
    scratch_.resize(cfg_.max_datagram);
    c_[R_SRTT_US] = -1;
    last_rx_ = loop_.now_us();
    loop_.start("reliable-r" + std::to_string(cfg_.rank), [this] { step(); },
                [this] { on_exit(); });
}

ReliableLive::~ReliableLive() { stop(); }

void ReliableLive::stop() { loop_.stop(); }

// ---- callers' side -----------------------------------------------------------------------

void ReliableLive::connect(const std::vector<PeerAddr>& peers, int64_t timeout_us) {
    if (static_cast<int>(peers.size()) != cfg_.world)
        throw std::invalid_argument("connect: " + std::to_string(peers.size()) +
                                    " addresses for a world of " + std::to_string(cfg_.world));
    loop_.call([this, peers] {
        if (connected_) throw std::invalid_argument("connect: already connected");
        tr_->set_peers(peers, cfg_.rank);
        peers_.assign(peers.size(), Peer{});
        done_.assign(peers.size(), Done{});
        connected_ = true;
    }, timeout_us, "connect");
}

void ReliableLive::set_impairment(const ImpairmentSpec& spec, int64_t timeout_us) {
    spec.check();
    loop_.call([this, spec] { imp_.set_spec(spec); }, timeout_us, "set_impairment");
}

std::vector<int64_t> ReliableLive::counters(int64_t timeout_us) {
    auto out = std::make_shared<std::vector<int64_t>>();
    loop_.call([this, out] {
        c_[R_SRTT_US] = srtt_ ? std::llround(*srtt_) : -1;
        c_[R_RTO_US] = rto_;
        c_[R_IMP_LOST] = imp_.lost;
        c_[R_IMP_DUPLICATED] = imp_.duplicated;
        c_[R_IMP_REORDERED] = imp_.reordered;
        timespec cpu;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
        c_[R_ENGINE_CPU_US] = int64_t{cpu.tv_sec} * 1000000 + cpu.tv_nsec / 1000;
        out->assign(c_, c_ + N_RELIABLE_COUNTERS);
        const int64_t* t = tr_->counters();
        out->insert(out->end(), t, t + N_TRANSPORT_COUNTERS);
    }, timeout_us, "counters");
    return *out;
}

int64_t ReliableLive::pending(int64_t timeout_us) {
    auto n = std::make_shared<int64_t>(0);
    loop_.call([this, n] {
        for (const Peer& p : peers_) *n += static_cast<int64_t>(p.unacked.size() + p.queue.size());
    }, timeout_us, "pending");
    return *n;
}

int64_t ReliableLive::quiet_us(int64_t timeout_us) {
    auto q = std::make_shared<int64_t>(0);
    loop_.call([this, q] { *q = now_us() - last_rx_; }, timeout_us, "quiet_us");
    return *q;
}

std::vector<ReliableLive::Action> ReliableLive::plan(Algo algo, const float* in, float* out,
                                                      size_t n) const {
    const int w = cfg_.world, r = cfg_.rank;
    auto lo = [&](int k) { return n * static_cast<size_t>((k % w + w) % w) / w; };
    auto len = [&](int k) { return n * static_cast<size_t>((k % w + w) % w + 1) / w - lo(k); };
    std::vector<Action> a;
    using K = Action::Kind;
    if (algo == Algo::ring) {
        const int right = (r + 1) % w, left = (r - 1 + w) % w;
        a.push_back({K::copy, -1, 0, in, out, n, "start", -1});
        // reduce-scatter: send chunk r-s, receive chunk r-s-1 and add ours to it
        for (int s = 0; s < w - 1; ++s) {
            const uint32_t tag = TAG_RING + static_cast<uint32_t>(s);
            a.push_back({K::send, right, tag, out + lo(r - s), nullptr, len(r - s),
                         "reduce-scatter step", s});
            a.push_back({K::recv_add, left, tag, nullptr, out + lo(r - s - 1), len(r - s - 1),
                         "reduce-scatter step", s});
        }
        const int own = r + 1;  // complete here now
        a.push_back({K::div, -1, 0, nullptr, out + lo(own), len(own), "mean", -1});
        for (int s = 0; s < w - 1; ++s) {
            const uint32_t tag = TAG_RING + static_cast<uint32_t>(w + s);
            a.push_back({K::send, right, tag, out + lo(own - s), nullptr, len(own - s),
                         "allgather step", s});
            a.push_back({K::recv_copy, left, tag, nullptr, out + lo(own - s - 1),
                         len(own - s - 1), "allgather step", s});
        }
    } else {
        for (int j = 0; j < w; ++j)  // scatter: chunk j to its owner
            if (j != r)
                a.push_back({K::send, j, TAG_TAR_SCATTER, in + lo(j), nullptr, len(j), "scatter",
                             -1});
        float* mine = out + lo(r);
        const float* own_in = in + lo(r);
        for (int j = 0; j < w; ++j) {  // the owner's sum, in rank order
            const K kind = j == 0 ? (j == r ? K::copy : K::recv_copy)
                                  : (j == r ? K::add : K::recv_add);
            a.push_back({kind, j == r ? -1 : j, TAG_TAR_SCATTER, j == r ? own_in : nullptr, mine,
                         len(r), "scatter", -1});
        }
        a.push_back({K::div, -1, 0, nullptr, mine, len(r), "mean", -1});
        for (int j = 0; j < w; ++j)
            if (j != r) a.push_back({K::send, j, TAG_TAR_GATHER, mine, nullptr, len(r), "gather", -1});
        for (int j = 0; j < w; ++j)
            if (j != r)
                a.push_back({K::recv_copy, j, TAG_TAR_GATHER, nullptr, out + lo(j), len(j),
                             "gather", -1});
    }
    return a;
}

CollectiveResult ReliableLive::allreduce(Algo algo, const float* in, float* out, size_t n,
                                         int64_t step_timeout_us) {
    const char* name = algo == Algo::ring ? "ring allreduce" : "tar allreduce";
    if (n < 1) throw std::invalid_argument(std::string(name) + ": empty input");
    if (step_timeout_us < 1 || step_timeout_us > int64_t{86400} * 1000000)
        throw std::invalid_argument(std::string(name) + ": timeout must be in (0, 86400] s");
    if (in < out + n && out < in + n)
        throw std::invalid_argument(std::string(name) + ": out must not overlap the input");
    if (4 * (n / static_cast<size_t>(cfg_.world) + 1) > max_frags() * payload_)
        throw std::invalid_argument(std::string(name) + ": " + std::to_string(n) +
                                    " elements make chunks too large for one message");
    std::lock_guard<std::mutex> one(call_mu_);
    if (cfg_.world == 1) {
        std::memcpy(out, in, n * sizeof(float));
        return CollectiveResult{};
    }
    auto c = std::make_shared<Collective>();
    c->actions = plan(algo, in, out, n);
    c->step_timeout_us = step_timeout_us;
    c->name = name;
    size_t recvs = 0;
    for (const Action& a : c->actions)
        recvs += a.kind == Action::recv_add || a.kind == Action::recv_copy;
    {
        std::lock_guard<std::mutex> lk(loop_.mu());
        result_.reset();
    }
    loop_.call([this, c] {
        if (!connected_) throw std::invalid_argument("allreduce: no peers yet: connect() first");
        const int64_t now = now_us();
        c->started = c->waiting_since = now;
        c->retx0 = c_[R_RETRANSMISSIONS];
        coll_ = std::move(*c);
    }, 5000000, name);
    // The engine thread ends the collective after one step timeout without progress; this
    // bound only guards against the thread itself being stuck.
    const auto bound = std::chrono::microseconds(static_cast<int64_t>(recvs + 1) * step_timeout_us +
                                                 5000000);
    std::unique_lock<std::mutex> lk(loop_.mu());
    done_cv_.wait_for(lk, bound, [&] { return result_.has_value() || loop_.exited(); });
    if (result_) return *result_;
    if (loop_.failed()) throw std::runtime_error("reliable engine failed: " + loop_.error());
    if (loop_.exited()) throw std::runtime_error("reliable engine stopped");
    lk.unlock();
    loop_.call([this] {
        if (coll_) finish(CollectiveResult::cancelled, "", now_us());
    }, 5000000, "cancel");
    lk.lock();
    CollectiveResult r = result_.value_or(CollectiveResult{});
    r.status = CollectiveResult::timeout;
    r.error = std::string(name) + ": rank " + std::to_string(cfg_.rank) +
              ": the engine thread did not finish within the bound";
    return r;
}

// ---- engine thread -----------------------------------------------------------------------

void ReliableLive::on_exit() {
    std::lock_guard<std::mutex> lk(loop_.mu());
    done_cv_.notify_all();  // a waiter sees exited() and says why
}

void ReliableLive::step() {
    c_[R_LOOPS] += 1;
    loop_.run_calls();
    if (connected_) {
        receive(now_us());
        const int64_t now = now_us();
        advance(now);
        retransmit_due(now);
        release_due(now);
        c_[R_QUEUE_MAX] = std::max<int64_t>(c_[R_QUEUE_MAX], static_cast<int64_t>(queue_.size()));
    }
    const int64_t now = now_us();
    sleep_io(wait_until(now) - now);
}

void ReliableLive::receive(int64_t now) {
    for (size_t b = 0; b < RX_BATCHES_PER_TURN; ++b) {
        if (tr_->recv_batch(rx_) == 0) break;
        now = now_us();
        for (const Datagram& d : rx_) {
            if (d.len < HDR || d.data[0] != 'R' || d.data[1] != 'M' || d.data[3] != VERSION) {
                c_[R_FOREIGN] += 1;
                continue;
            }
            last_rx_ = now;
            if (d.data[2] == KIND_DATA)
                on_data(d.rank, d.data, d.len);
            else if (d.data[2] == KIND_ACK)
                on_ack(d.rank, d.data, d.len, now);
            else
                c_[R_FOREIGN] += 1;
        }
        send_acks(now);
        release_due(now);  // the acks go out before the next batch is read
    }
}

// ---- sending -----------------------------------------------------------------------------

void ReliableLive::send_message(int dst, uint32_t tag, const uint8_t* data, size_t len,
                                int64_t now) {
    Peer& peer = peers_[dst];
    const uint32_t msg = peer.next_msg++;
    uint32_t& seq = send_seq_[key2(static_cast<uint64_t>(dst), tag)];
    OutMsg m;
    m.data = std::make_shared<std::vector<uint8_t>>(data, data + len);
    m.tag = tag;
    m.seq = seq++;
    m.nfrags = static_cast<uint32_t>(std::max<size_t>(1, (len + payload_ - 1) / payload_));
    m.outstanding = m.nfrags;
    for (uint32_t i = 0; i < m.nfrags; ++i) peer.queue.push_back(Frag{msg, i, 0, 0, false});
    peer.msgs.emplace(msg, std::move(m));
    c_[R_MESSAGES_SENT] += 1;
    fill_window(dst, peer, now);
}

void ReliableLive::fill_window(int dst, Peer& peer, int64_t now) {
    auto size_of = [&](const Frag& f) {
        const OutMsg& m = peer.msgs.at(f.msg);
        const size_t a = size_t{f.frag} * payload_;
        return std::min(m.data->size(), a + payload_) - std::min(m.data->size(), a);
    };
    while (!peer.queue.empty() &&
           (peer.unacked.empty() ||
            peer.inflight + size_of(peer.queue.front()) <= cfg_.window_bytes)) {
        Frag f = peer.queue.front();
        peer.queue.pop_front();
        peer.inflight += size_of(f);
        Frag& slot = peer.unacked[key2(f.msg, f.frag)] = f;
        transmit(dst, peer, slot, now);
        c_[R_FRAGMENTS_SENT] += 1;
    }
}

void ReliableLive::transmit(int dst, Peer& peer, Frag& f, int64_t now) {
    const OutMsg& m = peer.msgs.at(f.msg);
    f.tries += 1;
    f.held = false;
    f.due = now + backoff(f.tries);
    const size_t a = std::min(m.data->size(), size_t{f.frag} * payload_);
    const size_t b = std::min(m.data->size(), a + payload_);
    header(scratch_.data(), KIND_DATA, static_cast<uint32_t>(cfg_.rank), m.tag, f.msg, m.seq,
           f.frag, m.nfrags, stamp(now));
    if (b > a) std::memcpy(scratch_.data() + HDR, m.data->data() + a, b - a);
    emit(dst, scratch_.data(), HDR + (b - a), now);
}

void ReliableLive::emit(int dst, const uint8_t* data, size_t len, int64_t now) {
    double delays[2];
    const int k = imp_.fates(delays);
    for (int j = 0; j < k; ++j) queue_.push(now + std::llround(delays[j]), dst, data, len);
}

int64_t ReliableLive::backoff(int tries) const {
    int64_t d = rto_;
    for (int i = 1; i < tries && d < cfg_.rto_max_us; ++i) d *= 2;
    return std::min(d, cfg_.rto_max_us);
}

void ReliableLive::retransmit_due(int64_t now) {
    // Per message only its first due fragment goes again (a probe); its other due ones are
    // held until the probe's ACK says which are missing (on_ack): a lost ACK at the end of a
    // message costs one datagram, not a window of them.
    for (size_t dst = 0; dst < peers_.size(); ++dst) {
        Peer& peer = peers_[dst];
        bool probed = false;
        uint32_t last = 0;
        for (auto& [k, f] : peer.unacked) {
            if (f.due > now) continue;
            if (probed && f.msg == last) {
                f.held = true;
                f.due = now + backoff(f.tries);
                continue;
            }
            probed = true;
            last = f.msg;
            transmit(static_cast<int>(dst), peer, f, now);
            c_[R_RETRANSMISSIONS] += 1;
        }
    }
}

void ReliableLive::ack_frag(Peer& peer, uint64_t key) {
    auto it = peer.unacked.find(key);
    if (it == peer.unacked.end()) return;  // acked before (or still queued)
    OutMsg& m = peer.msgs.at(it->second.msg);
    const size_t a = std::min(m.data->size(), size_t{it->second.frag} * payload_);
    peer.inflight -= std::min(m.data->size(), a + payload_) - a;
    m.outstanding -= 1;
    peer.unacked.erase(it);
}

void ReliableLive::on_ack(int src, const uint8_t* d, size_t len, int64_t now) {
    // the whole body first: a malformed ACK changes nothing, not even the RTO
    size_t off = HDR;
    uint32_t entries = 0;
    for (; off + 8 <= len; ++entries) off += 8 + (size_t{rd32(d + off + 4)} + 7) / 8;
    if (off != len || entries == 0 || entries != rd32(d + 24) ||
        rd32(d + 4) != static_cast<uint32_t>(src)) {
        c_[R_MALFORMED] += 1;
        return;
    }
    Peer& peer = peers_[src];
    rtt_sample(static_cast<double>(static_cast<uint32_t>(stamp(now) - rd32(d + 28))));
    off = HDR;
    while (off + 8 <= len) {
        const uint32_t msg = rd32(d + off), nbits = rd32(d + off + 4);
        off += 8;
        const size_t nbytes = (size_t{nbits} + 7) / 8;
        const uint8_t* bits = d + off;
        off += nbytes;
        auto it = peer.msgs.find(msg);
        if (it == peer.msgs.end()) continue;  // every fragment of it acked already
        const uint32_t n = it->second.nfrags;
        for (uint32_t i = 0; i < n; ++i)
            if (nbits == 0 || (i < nbits && (bits[i / 8] >> (7 - i % 8) & 1)))
                ack_frag(peer, key2(msg, i));
        if (nbits != 0) {  // what is still missing of a probed message goes again now
            for (uint32_t i = 0; i < n; ++i) {
                auto f = peer.unacked.find(key2(msg, i));
                if (f != peer.unacked.end() && f->second.held) {
                    transmit(src, peer, f->second, now);
                    c_[R_RETRANSMISSIONS] += 1;
                }
            }
        }
        if (it->second.outstanding == 0) peer.msgs.erase(it);
    }
    fill_window(src, peer, now);
}

void ReliableLive::rtt_sample(double r) {
    if (!srtt_) {
        srtt_ = r;
        rttvar_ = r / 2;
    } else {
        rttvar_ = 0.75 * rttvar_ + 0.25 * std::abs(*srtt_ - r);
        srtt_ = 0.875 * *srtt_ + 0.125 * r;
    }
    const double rto = *srtt_ + 4 * rttvar_;
    rto_ = std::llround(std::min<double>(cfg_.rto_max_us, std::max<double>(cfg_.rto_min_us, rto)));
}

// ---- receiving ---------------------------------------------------------------------------

void ReliableLive::on_data(int src, const uint8_t* d, size_t len) {
    const uint32_t tag = rd32(d + 8), msg = rd32(d + 12), seq = rd32(d + 16);
    const uint32_t frag = rd32(d + 20), nfrags = rd32(d + 24), ts = rd32(d + 28);
    const size_t body = len - HDR;
    if (rd32(d + 4) != static_cast<uint32_t>(src) || nfrags < 1 || nfrags > max_frags() ||
        frag >= nfrags || body > payload_ || (frag + 1 < nfrags && body != payload_)) {
        c_[R_MALFORMED] += 1;
        return;
    }
    const uint64_t pk = key2(static_cast<uint64_t>(src), msg);
    auto pit = partial_.find(pk);
    if (pit != partial_.end() &&
        (pit->second.tag != tag || pit->second.seq != seq || pit->second.nfrags != nfrags)) {
        c_[R_MALFORMED] += 1;
        return;
    }
    Done& done = done_[src];
    // message ids of a source count up from 0: one far ahead of what is complete is not
    // a real one (and would hold memory for ever)
    if (!done.contains(msg) && msg - done.low >= MAX_MSGS_AHEAD) {
        c_[R_MALFORMED] += 1;
        return;
    }
    Touched& t = touched_[src];
    t.echo = ts;  // the newest: datagrams are handled in arrival order
    t.msgs.push_back(msg);
    if (done.contains(msg)) {
        c_[R_DUPLICATES] += 1;
        return;
    }
    if (pit == partial_.end()) {
        Partial p{tag, seq, nfrags, 0, std::vector<bool>(nfrags), {}};
        pit = partial_.emplace(pk, std::move(p)).first;
    }
    Partial& p = pit->second;
    if (p.got[frag]) {
        c_[R_DUPLICATES] += 1;
        return;
    }
    p.got[frag] = true;
    p.frags[frag].assign(d + HDR, d + len);
    p.have += 1;
    if (p.have < p.nfrags) return;
    std::vector<uint8_t> all;
    size_t total = 0;
    for (const auto& [i, f] : p.frags) total += f.size();
    all.reserve(total);
    for (const auto& [i, f] : p.frags) all.insert(all.end(), f.begin(), f.end());
    ready_[key2(static_cast<uint64_t>(src), p.tag)][p.seq] = std::move(all);
    partial_.erase(pit);
    done.add(msg);
}

void ReliableLive::send_acks(int64_t now) {
    for (auto& [src, t] : touched_) {
        std::sort(t.msgs.begin(), t.msgs.end());
        t.msgs.erase(std::unique(t.msgs.begin(), t.msgs.end()), t.msgs.end());
        size_t off = HDR;
        uint32_t entries = 0;
        auto flush = [&] {
            header(scratch_.data(), KIND_ACK, static_cast<uint32_t>(cfg_.rank), 0, 0, 0, 0,
                   entries, t.echo);
            emit(src, scratch_.data(), off, now);
            c_[R_ACKS_SENT] += 1;
            off = HDR;
            entries = 0;
        };
        for (uint32_t msg : t.msgs) {
            auto pit = partial_.find(key2(static_cast<uint64_t>(src), msg));
            const uint32_t nbits = pit == partial_.end() ? 0 : pit->second.nfrags;
            const size_t size = 8 + (size_t{nbits} + 7) / 8;
            if (entries && off + size > cfg_.max_datagram) flush();
            uint8_t* e = scratch_.data() + off;
            wr32(e, msg);
            wr32(e + 4, nbits);
            if (nbits) {
                std::memset(e + 8, 0, size - 8);
                const std::vector<bool>& got = pit->second.got;
                for (uint32_t i = 0; i < nbits; ++i)
                    if (got[i]) e[8 + i / 8] |= static_cast<uint8_t>(0x80 >> (i % 8));
            }
            off += size;
            entries += 1;
        }
        if (entries) flush();
    }
    touched_.clear();
}

bool ReliableLive::take(int src, uint32_t tag, std::vector<uint8_t>& out) {
    const uint64_t k = key2(static_cast<uint64_t>(src), tag);
    auto rit = ready_.find(k);
    if (rit == ready_.end()) return false;
    uint32_t& seq = next_seq_[k];
    auto it = rit->second.find(seq);
    if (it == rit->second.end()) return false;
    out = std::move(it->second);
    rit->second.erase(it);
    if (rit->second.empty()) ready_.erase(rit);
    seq += 1;
    c_[R_MESSAGES_DELIVERED] += 1;
    return true;
}

void ReliableLive::release_due(int64_t now) {
    while (queue_.next() && *queue_.next() <= now) {
        const size_t k = queue_.pop_due(now, RELEASE_BATCH, out_);
        const size_t sent = tr_->send_batch(out_.data(), k);
        queue_.done(sent);
        if (sent < k) break;  // the send buffer is full: sleep_io waits for room
    }
}

// ---- collectives -------------------------------------------------------------------------

void ReliableLive::advance(int64_t now) {
    while (coll_ && coll_->cur < coll_->actions.size()) {
        Collective& c = *coll_;
        const Action& a = c.actions[c.cur];
        const float wf = static_cast<float>(cfg_.world);
        switch (a.kind) {
            case Action::send:
                send_message(a.peer, a.tag, reinterpret_cast<const uint8_t*>(a.src),
                             a.n * sizeof(float), now);
                break;
            case Action::copy:
                if (a.n) std::memcpy(a.dst, a.src, a.n * sizeof(float));
                break;
            case Action::add:  // float32, the running sum first
                for (size_t i = 0; i < a.n; ++i) a.dst[i] = a.dst[i] + a.src[i];
                break;
            case Action::div:
                for (size_t i = 0; i < a.n; ++i) a.dst[i] = a.dst[i] / wf;
                break;
            case Action::recv_add:
            case Action::recv_copy: {
                if (!take(a.peer, a.tag, got_)) {
                    if (now - c.waiting_since < c.step_timeout_us) return;
                    const uint64_t pk_lo = key2(static_cast<uint64_t>(a.peer), 0);
                    std::string got = "no fragment of it arrived";
                    for (auto it = partial_.lower_bound(pk_lo);
                         it != partial_.end() && (it->first >> 32) == uint64_t(a.peer); ++it)
                        if (it->second.tag == a.tag) {
                            got = std::to_string(it->second.have) + "/" +
                                  std::to_string(it->second.nfrags) + " fragments of it arrived";
                            break;
                        }
                    finish(CollectiveResult::timeout,
                           std::string(c.name) + ": rank " + std::to_string(cfg_.rank) +
                               " waited " + seconds(c.step_timeout_us) + " s at " +
                               a.step +
                               (a.index >= 0 ? " " + std::to_string(a.index) : std::string()) +
                               " for message tag " + std::to_string(a.tag) + " from rank " +
                               std::to_string(a.peer) + " and " + got + "; is rank " +
                               std::to_string(a.peer) + " alive and sending it?",
                           now);
                    return;
                }
                if (got_.size() != a.n * sizeof(float)) {
                    finish(CollectiveResult::bad_size,
                           std::string(c.name) + ": rank " + std::to_string(cfg_.rank) + " got " +
                               std::to_string(got_.size() / 4) + " elements from rank " +
                               std::to_string(a.peer) + " at " + a.step + " where " +
                               std::to_string(a.n) +
                               " were expected; is every rank reducing an input of the same "
                               "length?",
                           now);
                    return;
                }
                const uint8_t* g = got_.data();
                if (a.kind == Action::recv_copy) {
                    if (a.n) std::memcpy(a.dst, g, a.n * sizeof(float));
                } else {
                    for (size_t i = 0; i < a.n; ++i) {  // the sum so far, then ours
                        float v;
                        std::memcpy(&v, g + 4 * i, 4);
                        a.dst[i] = v + a.dst[i];
                    }
                }
                break;
            }
        }
        c.cur += 1;
        c.waiting_since = now;
    }
    if (coll_) finish(CollectiveResult::ok, "", now);
}

void ReliableLive::finish(CollectiveResult::Status st, const std::string& error, int64_t now) {
    CollectiveResult r;
    r.status = st;
    r.error = error;
    r.elapsed_us = now - coll_->started;
    r.retransmissions = c_[R_RETRANSMISSIONS] - coll_->retx0;
    coll_.reset();
    c_[R_COLLECTIVES] += 1;
    {
        std::lock_guard<std::mutex> lk(loop_.mu());
        result_ = r;
    }
    done_cv_.notify_all();
}

int64_t ReliableLive::wait_until(int64_t now) {
    int64_t t = now + cfg_.max_wait_us;
    if (const auto q = queue_.next()) t = std::min(t, *q);
    for (const Peer& p : peers_)
        for (const auto& [k, f] : p.unacked) t = std::min(t, f.due);
    if (coll_ && coll_->cur < coll_->actions.size())
        t = std::min(t, coll_->waiting_since + coll_->step_timeout_us);
    return t;
}

void ReliableLive::sleep_io(int64_t timeout_us) {
    const auto q = queue_.next();
    const bool refused = q && *q <= now_us();  // sends were refused: wake when there is room
    loop_.sleep_io(tr_->fd(), refused ? std::min<int64_t>(timeout_us, 1000) : timeout_us, refused);
}

}  // namespace optireduce
