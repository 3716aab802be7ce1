// Co-simulation harness around the Verilated NIC core (top `nic_core`).
//
// One program, two modes (docs/cosim.md):
//   replay IN OUT   feed a record file (config writes, network frames, START commands,
//                   each at its tick) to the core with the idle/tick protocol, write the
//                   output records (network frames, host-port records, counters).
//   live ...        the core on a UDP socket on loopback, its tick from the wall clock,
//                   its host port on stdin/stdout (the Python driver, host/cosim_nic.py).
// The per-cycle loop is here, in C++, never in Python.
//
// Port layouts are those of /hw/nic_core.py (packed structs, first field at bit 0):
//   net_rx/net_tx payload: data[63:0] (byte k at bits 8k+7:8k), keep[71:64], last[72]
//   host_cmd payload:      op_id[31:0], n[63:32], exponent[71:64], inband[72],
//                          proposal[88:73] (START's third word: sim/replay.py cmd_bits)
//   host_i payload:        data[31:0], first[32], last[33]
//   host_o payload:        data[31:0], last[32], head[33] (an op's head words: passed on
//                          with its results and record, sim/replay.py host_record checks)
// Amaranth names a stream member `<port>__valid`; Verilator escapes the double
// underscore in C++ member names as `___05F`.

#include "Vnic_core.h"
#include "verilated.h"
#include "harness.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// cycles a register read may wait for csr_r_valid: far above one round of the bank's
// counters (hw/csr.py, Csr.MAX_READ_CYCLES)
constexpr int kCsrReadBound = 1024;

struct Cmd {
    uint32_t op_id, n;
    int32_t exponent;
    std::vector<uint32_t> words;
};

// ---- the core and its port drivers -------------------------------------------------
class Core {
  public:
    std::function<void(uint64_t, std::vector<uint8_t>&&)> on_tx;
    std::function<void(uint64_t, std::vector<uint32_t>&&)> on_host;
    std::deque<std::vector<uint8_t>> rxq;  // frames waiting for net_rx
    std::deque<Cmd> cmdq;                  // the host port's command FIFO
    uint64_t cycles = 0, ticks = 0, records_out = 0;
    bool tick_req = false;
    uint32_t backpressure = 0;  // 0: outputs always ready; k: ready 1 cycle in k+1 at random

    explicit Core(VerilatedContext* ctx) : top_(new Vnic_core{ctx}) {
        top_->clk = 0;
        top_->rst = 1;
        for (int i = 0; i < 4; i++) edge();
        top_->rst = 0;
        top_->eval();
    }
    ~Core() {
        top_->final();
        delete top_;
    }

    // One clock cycle: drive inputs, settle, sample handshakes, rising edge.
    // Returns true if the cycle was quiet: the core idle, nothing offered or moving.
    bool cycle() {
        Vnic_core& t = *top_;
        bool offered = false;
        // network in
        t.net_rx___05Fvalid = 0;
        if (!rxq.empty()) {
            const auto& f = rxq.front();
            const size_t left = f.size() - rx_off_;
            const size_t k = left < 8 ? left : 8;
            uint64_t d = 0;
            for (size_t j = 0; j < k; j++) d |= static_cast<uint64_t>(f[rx_off_ + j]) << (8 * j);
            setb(t.net_rx___05Fpayload, 0, 64, d);
            setb(t.net_rx___05Fpayload, 64, 8, (1u << k) - 1);
            setb(t.net_rx___05Fpayload, 72, 1, left <= 8);
            t.net_rx___05Fvalid = 1;
            offered = true;
        }
        // host commands, then their floats
        t.host_cmd___05Fvalid = 0;
        t.host_i___05Fvalid = 0;
        if (hi_ != nullptr && hi_wait_ == 0) {
            setb(t.host_i___05Fpayload, 0, 32, hi_->words[hi_idx_]);
            setb(t.host_i___05Fpayload, 32, 1, hi_idx_ == 0);
            setb(t.host_i___05Fpayload, 33, 1, hi_idx_ + 1 == hi_->words.size());
            t.host_i___05Fvalid = 1;
            offered = true;
        } else if (!cmdq.empty()) {
            const Cmd& c = cmdq.front();
            setb(t.host_cmd___05Fpayload, 0, 32, c.op_id);
            setb(t.host_cmd___05Fpayload, 32, 32, c.n);
            // exponent[7:0], inband[8], proposal[24:9]; a sign-extended exponent alone
            // (bits 31:8 all ones) carries neither
            const uint32_t e = static_cast<uint32_t>(c.exponent);
            setb(t.host_cmd___05Fpayload, 64, 25, (e >> 8) == 0xFFFFFFu ? e & 0xFF : e);
            t.host_cmd___05Fvalid = 1;  // blocked (window full) does not count as work
        }
        const bool rdy = backpressure == 0 || (lfsr() % (backpressure + 1)) == 0;
        t.net_tx___05Fready = rdy;
        t.host_o___05Fready = rdy;
        t.tick = tick_req;
        t.clk = 0;
        t.eval();

        // A tick strobe alone is not activity: the core shows any work it starts.
        bool moved = !txbuf_.empty() || !hobuf_.empty();
        const bool rx_fire = t.net_rx___05Fvalid && t.net_rx___05Fready;
        const bool cmd_fire = t.host_cmd___05Fvalid && t.host_cmd___05Fready;
        const bool hi_fire = t.host_i___05Fvalid && t.host_i___05Fready;
        if (t.net_tx___05Fvalid && t.net_tx___05Fready) {
            moved = true;
            const uint64_t d = getb(t.net_tx___05Fpayload, 0, 64);
            const uint64_t keep = getb(t.net_tx___05Fpayload, 64, 8);
            for (int j = 0; j < 8; j++)
                if ((keep >> j) & 1) txbuf_.push_back(static_cast<uint8_t>(d >> (8 * j)));
            if (getb(t.net_tx___05Fpayload, 72, 1)) {
                records_out++;
                if (on_tx) on_tx(ticks, std::move(txbuf_));
                txbuf_.clear();
            }
        }
        if (t.host_o___05Fvalid && t.host_o___05Fready) {
            moved = true;
            hobuf_.push_back(static_cast<uint32_t>(getb(t.host_o___05Fpayload, 0, 32)));
            if (getb(t.host_o___05Fpayload, 32, 1)) {
                records_out++;
                ops_done++;
                if (on_host) on_host(ticks, std::move(hobuf_));
                hobuf_.clear();
            }
        }
        const bool idle = t.idle, events_idle = t.events_idle;
        edge_high();
        cycles++;
        if (tick_req) {
            ticks++;
            tick_req = false;
        }
        if (rx_fire) {
            rx_off_ += 8;
            if (rx_off_ >= rxq.front().size()) {
                rxq.pop_front();
                rx_off_ = 0;
            }
        }
        if (cmd_fire) {
            ops_started++;
            cmd_ = std::move(cmdq.front());
            cmdq.pop_front();
            hi_ = cmd_.words.empty() ? nullptr : &cmd_;
            hi_idx_ = 0;
        }
        if (hi_wait_ > 0) hi_wait_--;
        if (hi_fire) hi_wait_ = host_gap;
        if (hi_fire && ++hi_idx_ == hi_->words.size()) hi_ = nullptr;
        // the encode, the readouts and the outputs may go on; a command behind the last
        // op's words is not seen by the core yet: it may be one the window takes now
        if (overlap)
            return events_idle && rxq.empty() && !rx_fire && !cmd_fire &&
                   (hi_ == nullptr || cmdq.empty());
        return idle && !offered && !moved && !rx_fire && !cmd_fire && !hi_fire;
    }

    // Run until the core has been quiet for two cycles in a row (bounded); with `full`,
    // quiet as without overlap.
    void settle(uint64_t bound, bool full = false) {
        const bool was = overlap;
        overlap = overlap && !full;
        int quiet = 0;
        for (uint64_t k = 0; quiet < 2; k++) {
            if (k >= bound)
                throw Error("the core did not become idle within " + std::to_string(bound) +
                            " cycles (tick " + std::to_string(ticks) + ")");
            quiet = cycle() ? quiet + 1 : 0;
        }
        overlap = was;
    }

    void csr_write(uint32_t addr, uint32_t data) {
        top_->csr_addr = addr;
        top_->csr_w_data = data;
        top_->csr_w_en = 1;
        cycle();
        top_->csr_w_en = 0;
    }
    uint32_t csr_read(uint32_t addr) {
        top_->csr_addr = addr;
        top_->csr_r_en = 1;
        cycle();
        top_->csr_r_en = 0;
        // a register's data comes the cycle after r_en, a counter's when the bank's
        // sequencer visits it (one round of its counters at most: hw/csr.py)
        for (int k = 0; !top_->csr_r_valid; k++) {
            if (k >= kCsrReadBound)
                throw Error("no csr_r_valid for register " + std::to_string(addr) +
                            " within " + std::to_string(kCsrReadBound) + " cycles");
            cycle();
        }
        return top_->csr_r_data;
    }
    uint64_t now() const { return top_->now; }
    bool idle() const { return top_->idle; }
    bool busy_inputs() const { return !rxq.empty() || hi_ != nullptr || !cmdq.empty(); }
    uint64_t ops_started = 0, ops_done = 0;
    // Overlap: an input waits only for the events before it (`events_idle`), not for an
    // op's encode, readouts or outputs.
    bool overlap = false;
    uint32_t host_gap = 0;  // idle cycles after each host_i word (a slower host link)

  private:
    Vnic_core* top_;
    size_t rx_off_ = 0;
    Cmd cmd_;
    const Cmd* hi_ = nullptr;
    size_t hi_idx_ = 0;
    uint32_t hi_wait_ = 0;  // cycles before the next host_i word may be offered
    std::vector<uint8_t> txbuf_;
    std::vector<uint32_t> hobuf_;
    uint32_t lfsr_ = 0xACE1u;

    uint32_t lfsr() {
        lfsr_ ^= lfsr_ << 13;
        lfsr_ ^= lfsr_ >> 17;
        lfsr_ ^= lfsr_ << 5;
        return lfsr_;
    }
    // The rising edge. The falling edge is the next cycle's first eval (with its inputs):
    // two evals a cycle, not three.
    void edge_high() {
        top_->clk = 1;
        top_->eval();
    }
    void edge() {
        edge_high();
        top_->clk = 0;
        top_->eval();
    }
};

// ---- record files (replay) ---------------------------------------------------------
// Little endian. File: magic "ORCR", u32 version 1, then records: u8 type, u64 tick,
// u32 length, length bytes. Types below; docs/cosim.md has the table.
enum : uint8_t {
    REC_CSR_WRITE = 1,  // u32 addr, u32 data
    REC_NET = 2,        // an Ethernet frame (in: to net_rx; out: from net_tx)
    REC_START = 3,      // u32 op_id, u32 n, u32 cmd_bits (or i32 exponent), n x u32 floats
    REC_CSR_READ = 4,   // in: u32 addr (read at the end); out: u32 addr, u32 data
    REC_HOST = 5,       // out: host_o words of one op (results then STATS), u32 each
    REC_LIMITS = 6,     // in: u64 extra ticks after the last record, u64 idle bound cycles,
                        //     u32 output backpressure (0 = none), u32 flags (bit 0: overlap,
                        //     bits 31:8: idle cycles after each host_i word)
    REC_SUMMARY = 7,    // out: u64 cycles, u64 ticks, u64 core now, u64 ops started, u64 done
};
const uint32_t MAGIC = 0x5243524F;  // "ORCR"

struct Rec {
    uint8_t type;
    uint64_t tick;
    std::vector<uint8_t> data;
};

uint32_t rd32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t rd64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

std::vector<Rec> read_records(const char* path) {
    FILE* f = std::fopen(path, "rb");
    if (!f) throw Error(std::string("cannot open ") + path);
    std::vector<Rec> out;
    uint32_t head[2];
    if (std::fread(head, 4, 2, f) != 2 || head[0] != MAGIC || head[1] != 1) {
        std::fclose(f);
        throw Error(std::string(path) + ": not a record file (magic ORCR, version 1)");
    }
    for (;;) {
        uint8_t h[13];
        const size_t got = std::fread(h, 1, 13, f);
        if (got == 0) break;
        if (got != 13) throw Error("truncated record header");
        Rec r{h[0], rd64(h + 1), std::vector<uint8_t>(rd32(h + 9))};
        if (!r.data.empty() && std::fread(r.data.data(), 1, r.data.size(), f) != r.data.size())
            throw Error("truncated record");
        out.push_back(std::move(r));
    }
    std::fclose(f);
    return out;
}

void write_rec(FILE* f, uint8_t type, uint64_t tick, const void* data, uint32_t len) {
    std::fwrite(&type, 1, 1, f);
    std::fwrite(&tick, 8, 1, f);
    std::fwrite(&len, 4, 1, f);
    if (len) std::fwrite(data, 1, len, f);
}

int run_replay(const char* in_path, const char* out_path) {
    const std::vector<Rec> recs = read_records(in_path);
    uint64_t extra_ticks = 1000000, bound = 10000000;
    uint32_t bp = 0, flags = 0;
    for (const Rec& r : recs)
        if (r.type == REC_LIMITS && r.data.size() >= 20) {
            extra_ticks = rd64(r.data.data());
            bound = rd64(r.data.data() + 8);
            bp = rd32(r.data.data() + 16);
            if (r.data.size() >= 24) flags = rd32(r.data.data() + 20);
        }
    FILE* out = std::fopen(out_path, "wb");
    if (!out) throw Error(std::string("cannot write ") + out_path);
    const uint32_t head[2] = {MAGIC, 1};
    std::fwrite(head, 4, 2, out);

    VerilatedContext ctx;
    Core core(&ctx);
    core.backpressure = bp;
    core.overlap = (flags & 1) != 0;
    core.host_gap = flags >> 8;
    core.on_tx = [&](uint64_t t, std::vector<uint8_t>&& f) {
        write_rec(out, REC_NET, t, f.data(), static_cast<uint32_t>(f.size()));
    };
    core.on_host = [&](uint64_t t, std::vector<uint32_t>&& w) {
        write_rec(out, REC_HOST, t, w.data(), static_cast<uint32_t>(4 * w.size()));
    };
    // Present an input at tick T: every tick before it is strobed with the core idle,
    // so each event sees exactly the model's tick. With overlap, "idle" is events_idle:
    // a START's encode runs on while the next ticks and frames come (the model has them
    // after the START); a START waits for the core's full idle at its tick (the one
    // before has encoded: the core takes one command at a time).
    auto advance_to = [&](uint64_t tick) {
        while (core.ticks < tick) {
            core.settle(bound);
            core.tick_req = true;
            core.cycle();
        }
        core.settle(bound);
    };
    uint64_t started = 0, last_tick = 0;
    std::vector<uint32_t> reads;
    for (const Rec& r : recs) {
        switch (r.type) {
            case REC_CSR_WRITE:
                core.csr_write(rd32(r.data.data()), rd32(r.data.data() + 4));
                break;
            case REC_NET:
                advance_to(r.tick);
                core.rxq.push_back(r.data);
                core.settle(bound);
                break;
            case REC_START: {
                advance_to(r.tick);
                core.settle(bound, true);
                Cmd c{rd32(r.data.data()), rd32(r.data.data() + 4),
                      static_cast<int32_t>(rd32(r.data.data() + 8)), {}};
                if (r.data.size() != 12 + 4ULL * c.n) throw Error("START record: bad length");
                c.words.resize(c.n);
                std::memcpy(c.words.data(), r.data.data() + 12, 4ULL * c.n);
                core.cmdq.push_back(std::move(c));
                started++;
                core.settle(bound);
                break;
            }
            case REC_CSR_READ:
                reads.push_back(rd32(r.data.data()));
                break;
            default:
                break;
        }
        if (r.type == REC_NET || r.type == REC_START) last_tick = r.tick;
    }
    // Every phase ends by its deadline: run the clock until every started op is out.
    while (core.ops_done < started) {
        if (core.ticks > last_tick + extra_ticks)
            throw Error("only " + std::to_string(core.ops_done) + " of " +
                        std::to_string(started) + " ops completed by tick " +
                        std::to_string(core.ticks));
        advance_to(core.ticks + 1);
    }
    for (uint32_t a : reads) {
        const uint32_t v[2] = {a, core.csr_read(a)};
        write_rec(out, REC_CSR_READ, core.ticks, v, 8);
    }
    const uint64_t sum[5] = {core.cycles, core.ticks, core.now(), started, core.ops_done};
    write_rec(out, REC_SUMMARY, core.ticks, sum, sizeof sum);
    std::fclose(out);
    return 0;
}

// ---- live: UDP on loopback, wall-clock ticks, host port on stdin/stdout -----------------
enum : uint32_t {
    MSG_CSR_WRITE = 1,  // in: addr, data
    MSG_START = 2,      // in: op_id, n, exponent, n words
    MSG_CSR_READ = 3,   // in: addr; out: addr, data
    MSG_INFO = 4,       // in: -; out: u64 cycles, ticks, busy_ns, wall_ns, rx, tx, dropped,
                        //   frames queued for net_rx, commands queued, core idle, CPU ns
    MSG_QUIT = 5,       // in: -
    MSG_HOST = 6,       // out: u64 tick, u32 count, count words (one op's host_o record)
};

struct Live {
    int rank = 0, world = 0, sock = -1;
    uint64_t tick_gap = 125;  // fewest cycles between two tick strobes while busy
    uint64_t mac_base = 0;
    uint32_t ip_base = 0, udp_port = 0;
    std::vector<sockaddr_in> peers;
    uint64_t rx = 0, tx = 0, dropped = 0;
    std::vector<uint8_t> inbuf;
    std::vector<uint8_t> outbuf;

    void flush_out() {
        size_t off = 0;
        while (off < outbuf.size()) {
            const ssize_t k = ::write(1, outbuf.data() + off, outbuf.size() - off);
            if (k < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                throw Error("host pipe closed");
            }
            off += static_cast<size_t>(k);
        }
        outbuf.clear();
    }
    template <typename T>
    void put(const T& v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        outbuf.insert(outbuf.end(), p, p + sizeof v);
    }

    int rank_of(const sockaddr_in& a) const {
        for (int r = 0; r < world; r++)
            if (peers[r].sin_port == a.sin_port && peers[r].sin_addr.s_addr == a.sin_addr.s_addr)
                return r;
        return -1;
    }

    // A datagram from rank `src` as the Ethernet/IPv4/UDP frame the wire would carry.
    std::vector<uint8_t> wrap(int src, const uint8_t* d, size_t n) const {
        std::vector<uint8_t> f(42 + n);
        auto mac = [&](uint8_t* p, int r) {
            const uint64_t m = mac_base + static_cast<uint64_t>(r);
            for (int j = 0; j < 6; j++) p[j] = static_cast<uint8_t>(m >> (8 * (5 - j)));
        };
        mac(&f[0], rank);
        mac(&f[6], src);
        f[12] = 0x08;
        f[13] = 0x00;
        uint8_t* ip = &f[14];
        const uint32_t ip_len = 28 + static_cast<uint32_t>(n);
        const uint32_t s_ip = ip_base + static_cast<uint32_t>(src) + 1;
        const uint32_t d_ip = ip_base + static_cast<uint32_t>(rank) + 1;
        const uint8_t hdr[20] = {0x45, 0, static_cast<uint8_t>(ip_len >> 8),
                                 static_cast<uint8_t>(ip_len), 0, 0, 0x40, 0, 64, 17, 0, 0,
                                 static_cast<uint8_t>(s_ip >> 24), static_cast<uint8_t>(s_ip >> 16),
                                 static_cast<uint8_t>(s_ip >> 8), static_cast<uint8_t>(s_ip),
                                 static_cast<uint8_t>(d_ip >> 24), static_cast<uint8_t>(d_ip >> 16),
                                 static_cast<uint8_t>(d_ip >> 8), static_cast<uint8_t>(d_ip)};
        std::memcpy(ip, hdr, 20);
        uint32_t s = 0;
        for (int j = 0; j < 20; j += 2) s += (ip[j] << 8) | ip[j + 1];
        while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
        ip[10] = static_cast<uint8_t>(~s >> 8);
        ip[11] = static_cast<uint8_t>(~s);
        uint8_t* udp = &f[34];
        const uint32_t udp_len = 8 + static_cast<uint32_t>(n);
        const uint8_t u[8] = {static_cast<uint8_t>(udp_port >> 8), static_cast<uint8_t>(udp_port),
                              static_cast<uint8_t>(udp_port >> 8), static_cast<uint8_t>(udp_port),
                              static_cast<uint8_t>(udp_len >> 8), static_cast<uint8_t>(udp_len),
                              0, 0};
        std::memcpy(udp, u, 8);
        std::memcpy(&f[42], d, n);
        return f;
    }

    void send_frame(const std::vector<uint8_t>& f) {
        if (f.size() < 42) {
            dropped++;
            return;
        }
        uint64_t m = 0;
        for (int j = 0; j < 6; j++) m = (m << 8) | f[j];
        const int64_t dst = static_cast<int64_t>(m - mac_base);
        const size_t l2l4 = 14 + 4 * static_cast<size_t>(f[14] & 0x0F) + 8;
        if (dst < 0 || dst >= world || dst == rank || f.size() < l2l4) {
            dropped++;
            return;
        }
        const sockaddr_in& a = peers[static_cast<size_t>(dst)];
        // A full send buffer loses the datagram, as a congested link would.
        if (::sendto(sock, f.data() + l2l4, f.size() - l2l4, 0,
                     reinterpret_cast<const sockaddr*>(&a), sizeof a) >= 0)
            tx++;
        else
            dropped++;
    }

    void recv_all(Core& core) {
        uint8_t buf[65536];
        for (;;) {
            sockaddr_in a{};
            socklen_t al = sizeof a;
            const ssize_t k = ::recvfrom(sock, buf, sizeof buf, MSG_DONTWAIT,
                                         reinterpret_cast<sockaddr*>(&a), &al);
            if (k < 0) return;
            const int src = rank_of(a);
            if (src < 0) {
                dropped++;
                continue;
            }
            rx++;
            core.rxq.push_back(wrap(src, buf, static_cast<size_t>(k)));
        }
    }

    // Read stdin (non-blocking) and act on every whole message. False on QUIT/EOF.
    bool host_in(Core& core) {
        uint8_t buf[65536];
        for (;;) {
            const ssize_t k = ::read(0, buf, sizeof buf);
            if (k == 0) return false;
            if (k < 0) break;
            inbuf.insert(inbuf.end(), buf, buf + k);
        }
        size_t off = 0;
        bool go = true;
        while (go && inbuf.size() - off >= 4) {
            const uint8_t* p = inbuf.data() + off;
            const size_t avail = inbuf.size() - off;
            const uint32_t type = rd32(p);
            if (type == MSG_CSR_WRITE) {
                if (avail < 12) break;
                core.csr_write(rd32(p + 4), rd32(p + 8));
                off += 12;
            } else if (type == MSG_CSR_READ) {
                if (avail < 8) break;
                const uint32_t a = rd32(p + 4);
                const uint32_t v = core.csr_read(a);
                put(MSG_CSR_READ);
                put(a);
                put(v);
                flush_out();
                off += 8;
            } else if (type == MSG_START) {
                if (avail < 16) break;
                const uint32_t n = rd32(p + 8);
                if (avail < 16 + 4ULL * n) break;
                Cmd c{rd32(p + 4), n, static_cast<int32_t>(rd32(p + 12)),
                      std::vector<uint32_t>(n)};
                std::memcpy(c.words.data(), p + 16, 4ULL * n);
                core.cmdq.push_back(std::move(c));
                off += 16 + 4ULL * n;
            } else if (type == MSG_INFO) {
                put(MSG_INFO);
                put(core.cycles);
                put(core.ticks);
                put(busy_ns + static_cast<uint64_t>(
                                  std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now() - busy_from)
                                      .count()));
                put(wall_ns());
                put(rx);
                put(tx);
                put(dropped);
                put(static_cast<uint64_t>(core.rxq.size()));
                put(static_cast<uint64_t>(core.cmdq.size() + (core.busy_inputs() ? 1 : 0)));
                put(static_cast<uint64_t>(core.idle()));
                put(cpu_ns());
                flush_out();
                off += 4;
            } else if (type == MSG_QUIT) {
                go = false;
                off += 4;
            } else {
                throw Error("host pipe: unknown message type " + std::to_string(type));
            }
        }
        inbuf.erase(inbuf.begin(), inbuf.begin() + static_cast<long>(off));
        return go;
    }

    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    uint64_t busy_ns = 0;  // time not asleep in poll, up to busy_from
    std::chrono::steady_clock::time_point busy_from = std::chrono::steady_clock::now();
    uint64_t wall_ns() const {
        return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
    }
};

int run_live(int argc, char** argv) {
    Live L;
    std::string peers;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--rank") L.rank = std::stoi(v);
        else if (k == "--world") L.world = std::stoi(v);
        else if (k == "--sock-fd") L.sock = std::stoi(v);
        else if (k == "--mac-base") L.mac_base = std::stoull(v, nullptr, 0);
        else if (k == "--ip-base") L.ip_base = static_cast<uint32_t>(std::stoul(v, nullptr, 0));
        else if (k == "--udp-port") L.udp_port = static_cast<uint32_t>(std::stoul(v));
        else if (k == "--peers") peers = v;
        else if (k == "--tick-gap") L.tick_gap = std::stoull(v);
        else throw Error("live: unknown option " + k);
    }
    // peers: "ip:port,ip:port,..." (index = rank)
    size_t pos = 0;
    while (pos < peers.size()) {
        size_t end = peers.find(',', pos);
        if (end == std::string::npos) end = peers.size();
        const std::string hp = peers.substr(pos, end - pos);
        const size_t c = hp.rfind(':');
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(std::stoi(hp.substr(c + 1))));
        if (inet_pton(AF_INET, hp.substr(0, c).c_str(), &a.sin_addr) != 1)
            throw Error("live: bad peer address " + hp);
        L.peers.push_back(a);
        pos = end + 1;
    }
    if (L.sock < 0 || L.world < 2 || static_cast<int>(L.peers.size()) != L.world ||
        L.rank < 0 || L.rank >= L.world)
        throw Error("live: need --rank, --world, --sock-fd and --peers (one per rank)");
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);

    VerilatedContext ctx;
    Core core(&ctx);
    core.on_tx = [&](uint64_t, std::vector<uint8_t>&& f) { L.send_frame(f); };
    core.on_host = [&](uint64_t t, std::vector<uint32_t>&& w) {
        L.put(MSG_HOST);
        L.put(t);
        L.put(static_cast<uint32_t>(w.size()));
        const auto* p = reinterpret_cast<const uint8_t*>(w.data());
        L.outbuf.insert(L.outbuf.end(), p, p + 4 * w.size());
        L.flush_out();
    };
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    L.t0 = t0;
    auto wall_us = [&] {
        return static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count());
    };
    int quiet = 0;
    L.busy_from = clock::now();
    uint64_t wall = 0, last_strobe = 0, offset = 0;
    for (uint64_t k = 0;; k++) {
        // Time: one tick per microsecond of wall clock while an op is in flight, at most
        // one a cycle: as soon as the core is idle, else at least tick_gap cycles apart
        // (a board at 125 MHz has 125; the core needs some cycles to apply a tick). A
        // simulation slower than that runs its time slower than the wall clock, so every
        // deadline is longer in seconds. With no op in flight no timer is live and time
        // stands still (the core's `now` lags the wall clock by `offset`).
        if ((k & 15) == 0) wall = wall_us();
        const bool in_flight = core.ops_started > core.ops_done || core.busy_inputs();
        if (!in_flight) {
            offset = wall - core.ticks;
        } else if (core.ticks + offset < wall &&
                   (core.idle() || core.cycles >= last_strobe + L.tick_gap)) {
            core.tick_req = true;
            last_strobe = core.cycles;
        }
        quiet = core.cycle() ? quiet + 1 : 0;
        if ((k & 255) == 0 && !(L.recv_all(core), L.host_in(core))) break;
        if (quiet > 64 && !core.busy_inputs() && (!in_flight || core.ticks + offset + 1 >= wall)) {
            // Nothing to do until a datagram, a command or the next tick: sleep instead of
            // spinning (the cores of this machine are shared).
            L.busy_ns += static_cast<uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - L.busy_from)
                    .count());
            pollfd fds[2] = {{L.sock, POLLIN, 0}, {0, POLLIN, 0}};
            ::poll(fds, 2, in_flight ? 1 : 20);  // a datagram or a command wakes it at once
            L.busy_from = clock::now();
            quiet = 0;
            L.recv_all(core);
            if (!L.host_in(core)) break;
        }
    }
    return 0;
}

}  // namespace

// The core idle, a tick every 125 cycles, for N cycles: the evaluation's own cost (an
// idle cycle costs what a busy one does: every eval computes the whole design).
int run_speed(uint64_t n) {
    VerilatedContext ctx;
    Core core(&ctx);
    const uint64_t t0 = cpu_ns();
    for (uint64_t k = 0; k < n; k++) {
        core.tick_req = k % 125 == 0;
        core.cycle();
    }
    const double s = static_cast<double>(cpu_ns() - t0) * 1e-9;
    std::printf("{\"cycles\": %llu, \"cpu_s\": %.6f, \"cycles_per_second\": %.1f}\n",
                static_cast<unsigned long long>(n), s, static_cast<double>(n) / s);
    return 0;
}

int main(int argc, char** argv) {
    Verilated::commandArgs(1, argv);
    try {
        if (argc == 4 && std::string(argv[1]) == "replay") return run_replay(argv[2], argv[3]);
        if (argc == 3 && std::string(argv[1]) == "speed") return run_speed(std::stoull(argv[2]));
        if (argc >= 2 && std::string(argv[1]) == "live") return run_live(argc, argv);
        std::fprintf(stderr, "usage: %s replay IN OUT | live --rank R --world W --sock-fd FD "
                             "--peers ip:port,... --mac-base M --ip-base I --udp-port P\n",
                     argv[0]);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "nic_harness: %s\n", e.what());
        return 1;
    }
}
