// nanobind face of the native reliable baselines (reliable_live.hpp). host/native/reliable.py
// (NativeReliable) is its one user besides the tests.
//
// allreduce() reads x and writes out where they are (no copies at the boundary) with the GIL
// released; it returns (status, message, elapsed_us, retransmissions) and leaves raising the
// right Python exception to the caller. Bad arguments raise ValueError.
#include "bind_reliable.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "bind_convert.hpp"
#include "impairment.hpp"
#include "reliable_live.hpp"
#include "transport.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace optireduce {

namespace {

const char* status_name(CollectiveResult::Status s) {
    switch (s) {
        case CollectiveResult::ok: return "ok";
        case CollectiveResult::timeout: return "timeout";
        case CollectiveResult::bad_size: return "bad_size";
        case CollectiveResult::cancelled: return "cancelled";
    }
    return "?";
}

}  // namespace

}  // namespace optireduce

void bind_reliable(nb::module_& m) {
    using namespace optireduce;

    nb::class_<ReliableLive>(
        m, "ReliableLive",
        "One rank's native reliable baselines: engine thread, UDP socket, impairment, reliable "
        "messages, ring and TAR allreduce.")
        .def(
            "__init__",
            [](ReliableLive* self, int rank, int world, const std::string& bind_ip, int port,
               int fd, int buffer_bytes, nb::handle impairment, uint64_t seed,
               long long max_datagram, long long window_bytes, double rto_init_s,
               double rto_min_s, double rto_max_s, long long max_wait_us, nb::handle key) {
                ReliableLiveConfig c;
                c.rank = rank;
                c.world = world;
                c.bind_ip = bind_ip;
                c.port = port;
                c.adopt_fd = fd;
                c.buffer_bytes = buffer_bytes;
                c.impairment = impairment_from(impairment);
                c.seed = seed;
                if (max_datagram < 0 || window_bytes < 0)
                    throw std::invalid_argument("reliable: sizes must be >= 0");
                c.max_datagram = static_cast<size_t>(max_datagram);
                c.window_bytes = static_cast<size_t>(window_bytes);
                c.rto_init_us = seconds_to_us(rto_init_s, "rto_init_s");
                c.rto_min_us = seconds_to_us(rto_min_s, "rto_min_s");
                c.rto_max_us = seconds_to_us(rto_max_s, "rto_max_s");
                c.max_wait_us = max_wait_us;
                c.key = key_from(key);
                new (self) ReliableLive(c);
            },
            "rank"_a, "world"_a, "bind_ip"_a = "127.0.0.1", "port"_a = 0, "fd"_a = -1,
            "buffer_bytes"_a = 64 << 20, "impairment"_a = nb::none(), "seed"_a = 0,
            "max_datagram"_a = 32 * 1024, "window_bytes"_a = 1 << 20, "rto_init_s"_a = 0.1,
            "rto_min_s"_a = 0.01, "rto_max_s"_a = 1.0, "max_wait_us"_a = 100000,
            "key"_a = nb::none())
        .def_prop_ro("address",
                     [](const ReliableLive& r) {
                         return std::make_pair(ip_string(r.local().ip), int{r.local().port});
                     })
        .def_prop_ro("payload", &ReliableLive::payload, "payload bytes per datagram")
        .def(
            "connect",
            [](ReliableLive& r, const std::vector<std::pair<std::string, int>>& peers,
               double timeout_s) {
                std::vector<PeerAddr> a;
                for (const auto& [ip, port] : peers) a.push_back(parse_peer(ip, port));
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                nb::gil_scoped_release unlocked;
                r.connect(a, t);
            },
            "peers"_a, "timeout_s"_a = 5.0)
        .def(
            "set_impairment",
            [](ReliableLive& r, nb::handle spec, double timeout_s) {
                const ImpairmentSpec s = impairment_from(spec);
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                nb::gil_scoped_release unlocked;
                r.set_impairment(s, t);
            },
            "spec"_a, "timeout_s"_a = 5.0)
        .def(
            "allreduce",
            [](ReliableLive& r, const std::string& algo, F32In x, F32Out out, double timeout_s) {
                Algo a;
                if (algo == "ring")
                    a = Algo::ring;
                else if (algo == "tar")
                    a = Algo::tar;
                else
                    throw std::invalid_argument("allreduce: algo '" + algo +
                                                "' is neither 'ring' nor 'tar'");
                if (x.shape(0) != out.shape(0))
                    throw std::invalid_argument("allreduce: x and out differ in length");
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                CollectiveResult res;
                {
                    nb::gil_scoped_release unlocked;
                    res = r.allreduce(a, x.data(), out.data(), x.shape(0), t);
                }
                return std::make_tuple(std::string(status_name(res.status)), res.error,
                                       res.elapsed_us, res.retransmissions);
            },
            "algo"_a, "x"_a, "out"_a, "timeout_s"_a = 60.0,
            "The mean of x over the ranks into out (not overlapping x): (status, message, "
            "elapsed_us, retransmissions); status 'ok', 'timeout', 'bad_size' or 'cancelled'.")
        .def(
            "counters",
            [](ReliableLive& r, double timeout_s) {
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                std::vector<int64_t> v;
                {
                    nb::gil_scoped_release unlocked;
                    v = r.counters(t);
                }
                nb::dict d;
                for (int k = 0; k < N_RELIABLE_COUNTERS; ++k) d[RELIABLE_COUNTER_NAMES[k]] = v[k];
                for (int k = 0; k < N_TRANSPORT_COUNTERS; ++k)
                    d[TRANSPORT_COUNTER_NAMES[k]] = v[N_RELIABLE_COUNTERS + k];
                return d;
            },
            "timeout_s"_a = 5.0)
        .def(
            "pending",
            [](ReliableLive& r, double timeout_s) {
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                nb::gil_scoped_release unlocked;
                return r.pending(t);
            },
            "timeout_s"_a = 5.0, "Fragments sent or queued and not acked yet.")
        .def(
            "quiet_s",
            [](ReliableLive& r, double timeout_s) {
                const int64_t t = seconds_to_us(timeout_s, "timeout_s");
                nb::gil_scoped_release unlocked;
                return r.quiet_us(t) * 1e-6;
            },
            "timeout_s"_a = 5.0, "Seconds since the last datagram of the layer arrived.")
        .def("stop", [](ReliableLive& r) {
            nb::gil_scoped_release unlocked;
            r.stop();
        });
}
