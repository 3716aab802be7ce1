// The virtual board: the Verilated shell of a board (top `virtual_board`,
// hw/virtual_board.py) on two Linux interfaces (docs/boards.md, "The virtual board").
//
//   board_harness --host IF --net IF [--core-div D] [--tick-gap G] [--stats FILE]
//                 [--pcap PREFIX]
//
// Every frame that arrives on IF (an AF_PACKET socket, promiscuous, outgoing frames
// skipped) goes into the matching port a byte per `sync` cycle, as a board's MAC hands
// it over without its FCS; every frame the shell sends leaves on that interface. Frames
// under Ethernet's 60 bytes are padded both ways, as a wire and the MAC pad them. The
// core's clock is `sync` / D (2: 62.5 MHz against the board's 125). The tick follows the
// wall clock while an op is in flight (a START taken, its STATS not yet sent), at most
// one every G cycles (8 D with the core idle), so a simulation slower than the board runs
// its time slower; with no op in flight time stands still. SIGTERM or SIGINT end it (and its parent's death:
// PR_SET_PDEATHSIG), writing the run's figures as JSON to FILE. With --pcap, every frame
// each port takes or sends is written to PREFIX-host.pcap and PREFIX-net.pcap, as a
// capture on the board's two cables would show them.
//
// Port layouts (hw/streams.py frame_layout(1)): payload data[7:0], keep[8], last[9]. On a
// byte stream every beat is a byte: keep is set going in and ignored coming out, as the
// MAC's transmitter (hw/rgmii_tx.py) ignores it.
// Amaranth names a stream member `<port>__valid`; Verilator escapes the double
// underscore in C++ member names as `___05F`.

#include "Vvirtual_board.h"
#include "harness.hpp"
#include "verilated.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

const size_t MAX_FRAME = 2048;  // a board MAC's receive FIFO (hw/rgmii_rx.py)
const size_t MIN_FRAME = 60;    // Ethernet's least frame without its FCS: shorter is padded
const uint16_t HOST_ETHERTYPE = 0x88B5;
const uint8_t KIND_START = 1, KIND_STATS = 4;  // optireduce/host_port.py

bool host_kind(const std::vector<uint8_t>& f, uint8_t kind) {
    return f.size() >= 16 && ((f[12] << 8) | f[13]) == HOST_ETHERTYPE && f[15] == kind;
}

// One side of the board: an interface, the frames waiting to go in, the frame coming out.
struct Port {
    std::string name;
    int fd = -1;
    std::deque<std::vector<uint8_t>> rxq;
    size_t off = 0;
    std::vector<uint8_t> txbuf;
    uint64_t rx = 0, tx = 0, too_long = 0, send_failed = 0;
    FILE* pcap = nullptr;

    explicit Port(const std::string& ifname) : name(ifname) {
        const unsigned idx = if_nametoindex(ifname.c_str());
        if (idx == 0) throw Error("no interface " + ifname);
        fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
        if (fd < 0)
            throw Error("AF_PACKET socket: " + std::string(std::strerror(errno)) +
                        " (needs CAP_NET_RAW: run as root)");
        sockaddr_ll a{};
        a.sll_family = AF_PACKET;
        a.sll_protocol = htons(ETH_P_ALL);
        a.sll_ifindex = static_cast<int>(idx);
        if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
            throw Error("bind to " + ifname + ": " + std::strerror(errno));
        packet_mreq mr{};
        mr.mr_ifindex = static_cast<int>(idx);
        mr.mr_type = PACKET_MR_PROMISC;  // a board's port takes every frame on its cable
        ::setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr);
        const int buf = 16 << 20;  // the simulation is slower than the wire: room to queue
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf);
    }
    ~Port() {
        if (fd >= 0) ::close(fd);
        if (pcap) std::fclose(pcap);
    }

    void capture(const std::string& path) {
        pcap = std::fopen(path.c_str(), "wb");
        if (!pcap) throw Error("cannot write " + path);
        // pcap: magic, version 2.4, zone 0, sigfigs 0, snaplen, linktype 1 (Ethernet)
        const uint32_t head[6] = {0xA1B2C3D4u, 0x00040002u, 0, 0, 65535, 1};
        std::fwrite(head, 4, 6, pcap);
    }
    void record(const uint8_t* f, size_t n) {
        if (!pcap) return;
        timespec ts{};
        clock_gettime(CLOCK_REALTIME, &ts);
        const uint32_t rec[4] = {static_cast<uint32_t>(ts.tv_sec),
                                 static_cast<uint32_t>(ts.tv_nsec / 1000),
                                 static_cast<uint32_t>(n), static_cast<uint32_t>(n)};
        std::fwrite(rec, 4, 4, pcap);
        std::fwrite(f, 1, n, pcap);
    }

    void recv_all(uint64_t& starts) {
        uint8_t buf[65536];
        for (;;) {
            sockaddr_ll a{};
            socklen_t al = sizeof a;
            const ssize_t k = ::recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT,
                                         reinterpret_cast<sockaddr*>(&a), &al);
            if (k < 0) return;
            if (a.sll_pkttype == PACKET_OUTGOING) continue;  // our own sends
            if (k < 14) continue;                             // no Ethernet header: not a frame
            if (static_cast<size_t>(k) > MAX_FRAME) {
                too_long++;  // a MAC's FIFO drops it
                continue;
            }
            rx++;
            // a sender's NIC pads a short frame on the wire; a veth does not
            const size_t n = std::max(static_cast<size_t>(k), MIN_FRAME);
            std::fill(buf + k, buf + n, 0);
            record(buf, n);
            rxq.emplace_back(buf, buf + n);
            if (host_kind(rxq.back(), KIND_START)) starts++;
        }
    }

    void send(std::vector<uint8_t>& f) {
        if (f.size() < MIN_FRAME) f.resize(MIN_FRAME, 0);  // as the MAC's transmitter pads
        record(f.data(), f.size());
        if (::send(fd, f.data(), f.size(), MSG_DONTWAIT) >= 0)
            tx++;
        else {
            send_failed++;  // a full queue loses the frame, as a congested link would
            if (send_failed == 1)
                std::fprintf(stderr, "virtual board: %s: a send failed (%s; %zu bytes)\n",
                             name.c_str(), std::strerror(errno), f.size());
        }
    }
};

class Board {
  public:
    uint64_t cycles = 0, ticks = 0, ops_started = 0, ops_done = 0;
    bool tick_req = false;
    unsigned core_div = 2;

    explicit Board(VerilatedContext* ctx) : t_(new Vvirtual_board{ctx}) {
        t_->clk = 0;
        t_->core_clk = 0;
        t_->rst = 1;
        t_->core_rst = 1;
        for (int i = 0; i < 8; i++) {
            t_->clk = t_->core_clk = 1;
            t_->eval();
            t_->clk = t_->core_clk = 0;
            t_->eval();
        }
        t_->rst = 0;
        t_->core_rst = 0;
        t_->eval();
    }
    ~Board() {
        t_->final();
        delete t_;
    }
    bool idle() const { return t_->idle; }

    // One `sync` cycle; the core's clock rises on every core_div-th. True if the cycle
    // was quiet: the core idle, nothing offered or moving on any port.
    bool cycle(Port& host, Port& net) {
        Vvirtual_board& t = *t_;
        const bool core_edge = cycles % core_div == 0;
        bool offered = offer(host, t.host_rx___05Fvalid, t.host_rx___05Fpayload);
        offered |= offer(net, t.net_rx___05Fvalid, t.net_rx___05Fpayload);
        t.host_tx___05Fready = 1;
        t.net_tx___05Fready = 1;
        t.tick = tick_req;
        t.clk = 0;
        if (core_edge) t.core_clk = 0;
        t.eval();

        const bool h_in = t.host_rx___05Fvalid && t.host_rx___05Fready;
        const bool n_in = t.net_rx___05Fvalid && t.net_rx___05Fready;
        bool moved = !host.txbuf.empty() || !net.txbuf.empty();
        if (t.host_tx___05Fvalid) {
            moved = true;
            if (take(host, t.host_tx___05Fpayload) && host_kind(last_, KIND_STATS)) ops_done++;
        }
        if (t.net_tx___05Fvalid) {
            moved = true;
            take(net, t.net_tx___05Fpayload);
        }
        const bool idle = t.idle;
        t.clk = 1;
        if (core_edge) t.core_clk = 1;
        t.eval();
        cycles++;
        if (tick_req) {
            ticks++;
            tick_req = false;
        }
        if (h_in) advance(host);
        if (n_in) advance(net);
        return idle && !offered && !moved;
    }

  private:
    Vvirtual_board* t_;
    std::vector<uint8_t> last_;

    template <typename P>
    static bool offer(Port& port, CData& valid, P& payload) {
        valid = 0;
        if (port.rxq.empty()) return false;
        const auto& f = port.rxq.front();
        setb(payload, 0, 8, f[port.off]);
        setb(payload, 8, 1, 1);
        setb(payload, 9, 1, port.off + 1 == f.size());
        valid = 1;
        return true;
    }
    static void advance(Port& port) {
        if (++port.off == port.rxq.front().size()) {
            port.rxq.pop_front();
            port.off = 0;
        }
    }
    // A byte out; true when it ended a frame, which then went out on the interface.
    template <typename P>
    bool take(Port& port, const P& payload) {
        port.txbuf.push_back(static_cast<uint8_t>(getb(payload, 0, 8)));  // keep: unused on bytes
        if (!getb(payload, 9, 1)) return false;
        port.send(port.txbuf);
        last_.swap(port.txbuf);
        port.txbuf.clear();
        return true;
    }
};

std::string json_figures(const Board& b, const Port& h, const Port& n, uint64_t wall_ns,
                         uint64_t busy_ns) {
    char s[1024];
    std::snprintf(s, sizeof s,
                  "{\"cycles\": %llu, \"ticks\": %llu, \"wall_ns\": %llu, \"busy_ns\": %llu, "
                  "\"cpu_ns\": %llu, \"ops_started\": %llu, \"ops_done\": %llu, "
                  "\"host_rx\": %llu, \"host_tx\": %llu, \"net_rx\": %llu, \"net_tx\": %llu, "
                  "\"too_long\": %llu, \"send_failed\": %llu}\n",
                  (unsigned long long)b.cycles, (unsigned long long)b.ticks,
                  (unsigned long long)wall_ns, (unsigned long long)busy_ns,
                  (unsigned long long)cpu_ns(), (unsigned long long)b.ops_started,
                  (unsigned long long)b.ops_done, (unsigned long long)h.rx,
                  (unsigned long long)h.tx, (unsigned long long)n.rx, (unsigned long long)n.tx,
                  (unsigned long long)(h.too_long + n.too_long),
                  (unsigned long long)(h.send_failed + n.send_failed));
    return s;
}

int run(int argc, char** argv) {
    std::string host_if, net_if, stats, pcap;
    unsigned core_div = 2;
    uint64_t tick_gap = 125;  // a board at 125 MHz strobes one tick in 125 cycles
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--host") host_if = v;
        else if (k == "--net") net_if = v;
        else if (k == "--core-div") core_div = static_cast<unsigned>(std::stoul(v));
        else if (k == "--tick-gap") tick_gap = std::stoull(v);
        else if (k == "--stats") stats = v;
        else if (k == "--pcap") pcap = v;
        else throw Error("unknown option " + k);
    }
    if (host_if.empty() || net_if.empty() || core_div == 0 || argc % 2 == 0)
        throw Error("usage: board_harness --host IF --net IF [--core-div D] [--tick-gap G] "
                    "[--stats FILE] [--pcap PREFIX]");
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    Port host(host_if), net(net_if);
    if (!pcap.empty()) {
        host.capture(pcap + "-host.pcap");
        net.capture(pcap + "-net.pcap");
    }
    VerilatedContext ctx;
    Board b(&ctx);
    b.core_div = core_div;
    std::fprintf(stderr, "virtual board: host port on %s, network port on %s\n", host_if.c_str(),
                 net_if.c_str());

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto since = [&](clock::time_point a) {
        return static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - a).count());
    };
    // Even with the core idle, ticks are spaced: the tick crosses to the core's clock
    // through a toggle synchronizer, where two pulses inside one core cycle cancel, and
    // the core shows the work a tick starts only a few of its cycles later.
    const uint64_t idle_gap = 8 * core_div;
    uint64_t wall = 0, last_strobe = 0, offset = 0, busy_ns = 0;
    auto busy_from = clock::now();
    int quiet = 0;
    for (uint64_t k = 0; !g_stop; k++) {
        if ((k & 15) == 0) wall = since(t0) / 1000;
        const bool queued = !host.rxq.empty() || !net.rxq.empty();
        const bool in_flight = b.ops_started > b.ops_done;
        if (!in_flight) {
            offset = wall - b.ticks;  // no timer is live: time stands still
        } else if (b.ticks + offset < wall &&
                   b.cycles >= last_strobe + (b.idle() ? idle_gap : tick_gap)) {
            b.tick_req = true;
            last_strobe = b.cycles;
        }
        quiet = b.cycle(host, net) ? quiet + 1 : 0;
        if ((k & 255) == 0) {
            host.recv_all(b.ops_started);
            net.recv_all(b.ops_started);
        }
        if (quiet > 256 && !queued && (!in_flight || b.ticks + offset + 1 >= wall)) {
            // nothing to do until a frame or the next tick: sleep, do not spin
            busy_ns += since(busy_from);
            pollfd fds[2] = {{host.fd, POLLIN, 0}, {net.fd, POLLIN, 0}};
            ::poll(fds, 2, in_flight ? 1 : 20);
            busy_from = clock::now();
            quiet = 0;
            host.recv_all(b.ops_started);
            net.recv_all(b.ops_started);
        }
    }
    busy_ns += since(busy_from);
    const std::string fig = json_figures(b, host, net, since(t0), busy_ns);
    if (!stats.empty()) {
        FILE* f = std::fopen(stats.c_str(), "w");
        if (f) {
            std::fputs(fig.c_str(), f);
            std::fclose(f);
        }
    }
    std::fprintf(stderr, "virtual board: %s", fig.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Verilated::commandArgs(1, argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "board_harness: %s\n", e.what());
        return 1;
    }
}
