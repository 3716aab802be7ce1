// nanobind face of the live runtime (live.hpp) and of the C++ impairment (impairment.hpp),
// added to the _engine module by module.cpp. host/native/nic.py (NativeNic) is its one user
// besides the tests.
//
// Every wait runs with the GIL released. submit() takes the chunk and the place of its
// result as array views (no copies); the caller keeps both alive until the op's result is
// handed back by wait() or cancel() has returned.
#include "bind_live.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <stdexcept>

#include "bind_convert.hpp"
#include "bind_stats.hpp"
#include "engine.hpp"
#include "frame_batch.hpp"
#include "impairment.hpp"
#include "live.hpp"
#include "py_params.hpp"
#include "transport.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace optireduce {

namespace {

int64_t to_us(double seconds) { return seconds_to_us(seconds, "timeout_s"); }

std::vector<std::string> live_counter_names() {
    std::vector<std::string> out;
    for (int k = 0; k < N_COUNTERS; ++k) out.emplace_back(counter_name(k));
    for (int k = 0; k < N_TRANSPORT_COUNTERS; ++k) out.emplace_back(TRANSPORT_COUNTER_NAMES[k]);
    for (int k = 0; k < N_LIVE_COUNTERS; ++k) out.emplace_back(LIVE_COUNTER_NAMES[k]);
    for (int k = 0; k < N_EXP_COUNTERS; ++k) out.emplace_back(exp_counter_name(k));
    return out;
}

}  // namespace

}  // namespace optireduce

void bind_live(nb::module_& m) {
    using namespace optireduce;

    m.def(
        "header_tag",
        [](nb::handle key, nb::bytes datagram) {
            const JobKey k = key_from(key);
            if (!k) throw std::invalid_argument("header_tag: key is None");
            uint8_t tag[TAG_LEN];
            header_tag(tag_key(k->data()), reinterpret_cast<const uint8_t*>(datagram.c_str()),
                       datagram.size(), tag);
            return nb::bytes(reinterpret_cast<const char*>(tag), TAG_LEN);
        },
        "key"_a, "datagram"_a, "ubt.header_tag, as the native transport computes it.");

    m.def(
        "send_frames",
        [](int fd, const std::vector<nb::bytes>& frames, double timeout_s) {
            std::vector<std::string> fs;
            fs.reserve(frames.size());
            for (const nb::bytes& f : frames) fs.emplace_back(f.c_str(), f.size());
            nb::gil_scoped_release unlocked;
            return send_frames(fd, fs, static_cast<int>(to_us(timeout_s) / 1000));
        },
        "fd"_a, "frames"_a, "timeout_s"_a,
        "Ethernet frames out on a packet socket, FRAME_BATCH per sendmmsg; the number sent "
        "(fewer only when the queue stayed full for timeout_s).");
    m.def(
        "recv_frames",
        [](int fd, size_t max, double timeout_s) {
            std::vector<std::string> got;
            uint64_t calls = 0;
            {
                nb::gil_scoped_release unlocked;
                got = recv_frames(fd, max, static_cast<int>(to_us(timeout_s) / 1000), &calls);
            }
            nb::list out;
            for (const std::string& f : got) out.append(nb::bytes(f.data(), f.size()));
            return nb::make_tuple(out, calls);
        },
        "fd"_a, "max"_a, "timeout_s"_a,
        "(frames, recvmmsg calls): up to max frames from a packet socket, waiting up to "
        "timeout_s for the first; its own sends (PACKET_OUTGOING) skipped.");

    nb::class_<Impairment>(m, "Impairment",
                           "The C++ impairment (ImpairmentSpec semantics), for tests.")
        .def(
            "__init__",
            [](Impairment* self, nb::handle spec, uint64_t seed) {
                new (self) Impairment(impairment_from(spec), seed);
            },
            "spec"_a, "seed"_a = 0)
        .def("delay_us", &Impairment::delay_us)
        .def("fates",
             [](Impairment& imp) {
                 double d[2];
                 const int k = imp.fates(d);
                 std::vector<double> out(d, d + k);
                 return out;
             })
        .def(
            "sample_delays",
            [](Impairment& imp, size_t n) {
                auto* v = new std::vector<double>(n);
                {
                    nb::gil_scoped_release unlocked;
                    for (double& x : *v) x = imp.delay_us();
                }
                nb::capsule owner(v, [](void* p) noexcept {
                    delete static_cast<std::vector<double>*>(p);
                });
                return nb::ndarray<nb::numpy, double, nb::ndim<1>>(v->data(), {n}, owner);
            },
            "n"_a, "n draws of delay_us() as a float64 array.")
        .def(
            "sample_copies",
            [](Impairment& imp, size_t n) {
                // fates() n times: how many copies of each datagram got through
                auto* v = new std::vector<int8_t>(n);
                {
                    nb::gil_scoped_release unlocked;
                    double d[2];
                    for (int8_t& x : *v) x = static_cast<int8_t>(imp.fates(d));
                }
                nb::capsule owner(v, [](void* p) noexcept {
                    delete static_cast<std::vector<int8_t>*>(p);
                });
                return nb::ndarray<nb::numpy, int8_t, nb::ndim<1>>(v->data(), {n}, owner);
            },
            "n"_a, "n calls of fates(): the number of copies that got through, per datagram.")
        .def_ro("lost", &Impairment::lost)
        .def_ro("duplicated", &Impairment::duplicated)
        .def_ro("reordered", &Impairment::reordered);

    nb::class_<ReleaseQueue>(m, "ReleaseQueue", "The release-time queue, for tests.")
        .def(nb::init<size_t>(), "max_datagram"_a)
        .def(
            "push",
            [](ReleaseQueue& q, int64_t due, int dst, nb::bytes b) {
                q.push(due, dst, reinterpret_cast<const uint8_t*>(b.c_str()), b.size());
            },
            "due_us"_a, "dst"_a, "datagram"_a)
        .def("next", &ReleaseQueue::next)
        .def("__len__", &ReleaseQueue::size)
        .def(
            "pop_due",
            [](ReleaseQueue& q, int64_t now, size_t max, size_t sent) {
                // pop up to max due datagrams, say the first `sent` went out: [(dst, bytes)]
                std::vector<OutDatagram> out;
                q.pop_due(now, max, out);
                nb::list res;
                for (const OutDatagram& o : out)
                    res.append(nb::make_tuple(
                        o.dst, nb::bytes(reinterpret_cast<const char*>(o.data), o.len)));
                q.done(std::min(sent, out.size()));
                return res;
            },
            "now_us"_a, "max"_a, "sent"_a);

    nb::class_<LiveNic>(m, "LiveNic",
                        "One rank's live native NIC: engine thread, UDP socket, impairment.")
        .def(
            "__init__",
            [](LiveNic* self, nb::handle params, int rank, int world, const std::string& bind_ip,
               int port, int fd, int buffer_bytes, nb::handle impairment, uint64_t seed,
               int64_t first_op, int64_t max_wait_us, int exp_lead, nb::handle key) {
                LiveConfig c;
                c.p = params_from_py(params);
                c.rank = rank;
                c.world = world;
                c.bind_ip = bind_ip;
                c.port = port;
                c.adopt_fd = fd;
                c.buffer_bytes = buffer_bytes;
                c.impairment = impairment_from(impairment);
                c.seed = seed;
                c.first_op = first_op;
                c.max_wait_us = max_wait_us;
                c.inband.on = exp_lead > 0;
                c.inband.lead = exp_lead;
                c.key = key_from(key);
                new (self) LiveNic(c);
            },
            "params"_a, "rank"_a, "world"_a, "bind_ip"_a = "127.0.0.1", "port"_a = 0,
            "fd"_a = -1, "buffer_bytes"_a = 64 << 20, "impairment"_a = nb::none(), "seed"_a = 0,
            "first_op"_a = 0, "max_wait_us"_a = 2000, "exp_lead"_a = 0, "key"_a = nb::none())
        .def_prop_ro("address",
                     [](const LiveNic& n) {
                         return std::make_pair(ip_string(n.local().ip), int{n.local().port});
                     })
        .def_prop_ro("rcvbuf", &LiveNic::rcvbuf, "SO_RCVBUF as granted (the kernel doubles it)")
        .def_prop_ro("sndbuf", &LiveNic::sndbuf)
        .def_prop_ro("next_op", &LiveNic::next_op)
        .def(
            "connect",
            [](LiveNic& n, const std::vector<std::pair<std::string, int>>& peers,
               double timeout_s) {
                std::vector<PeerAddr> a;
                for (const auto& [ip, port] : peers) a.push_back(parse_peer(ip, port));
                nb::gil_scoped_release unlocked;
                n.connect(a, to_us(timeout_s));
            },
            "peers"_a, "timeout_s"_a = 5.0)
        .def(
            "submit",
            [](LiveNic& n, int64_t op_id, F32In x, F32Out out, std::optional<int> exponent,
               std::optional<int> next_proposal) {
                // exponent None: in-band (exp_lead > 0); next_proposal None: "no proposal"
                if (x.shape(0) != out.shape(0))
                    throw std::invalid_argument("submit: x and out differ in length");
                n.submit(op_id, x.data(), out.data(), x.shape(0), exponent, next_proposal);
            },
            "op_id"_a, "x"_a, "out"_a, "exponent"_a.none(), "next_proposal"_a.none() = nb::none())
        .def(
            "wait",
            [](LiveNic& n, double timeout_s, size_t at_least) {
                // [(op_id, stats dict)] of the ops finished by the time `at_least` have
                // (or the timeout; [] if none)
                std::vector<LiveDone> done;
                {
                    nb::gil_scoped_release unlocked;
                    n.wait(to_us(timeout_s), at_least, done);
                }
                nb::list out;
                for (const LiveDone& d : done)
                    out.append(nb::make_tuple(d.op_id, stats_dict(d.stats)));
                return out;
            },
            "timeout_s"_a, "at_least"_a = 1)
        .def(
            "cancel",
            [](LiveNic& n, double timeout_s) {
                nb::gil_scoped_release unlocked;
                return n.cancel(to_us(timeout_s));
            },
            "timeout_s"_a = 5.0)
        .def(
            "exclude",
            [](LiveNic& n, int rank, double timeout_s) {
                nb::gil_scoped_release unlocked;
                n.exclude(rank, to_us(timeout_s));
            },
            "rank"_a, "timeout_s"_a = 5.0)
        .def(
            "set_t_b",
            [](LiveNic& n, int64_t t_b_us, double timeout_s) {
                nb::gil_scoped_release unlocked;
                n.set_t_b(t_b_us, to_us(timeout_s));
            },
            "t_b_us"_a, "timeout_s"_a = 5.0)
        .def(
            "set_impairment",
            [](LiveNic& n, nb::handle spec, double timeout_s) {
                const ImpairmentSpec s = impairment_from(spec);
                nb::gil_scoped_release unlocked;
                n.set_impairment(s, to_us(timeout_s));
            },
            "spec"_a, "timeout_s"_a = 5.0)
        .def(
            "gone",
            [](LiveNic& n, double timeout_s) {
                nb::gil_scoped_release unlocked;
                return n.gone(to_us(timeout_s));
            },
            "timeout_s"_a = 5.0)
        .def(
            "counters",
            [](LiveNic& n, double timeout_s) {
                std::vector<int64_t> v;
                {
                    nb::gil_scoped_release unlocked;
                    v = n.counters(to_us(timeout_s));
                }
                const std::vector<std::string> names = live_counter_names();
                nb::dict d;
                for (size_t k = 0; k < names.size(); ++k) d[names[k].c_str()] = v[k];
                return d;
            },
            "timeout_s"_a = 5.0)
        .def(
            "set_trace",
            [](LiveNic& n, bool on, size_t max_entries, double timeout_s) {
                nb::gil_scoped_release unlocked;
                n.set_trace(on, max_entries, to_us(timeout_s));
            },
            "on"_a, "max_entries"_a = 1 << 20, "timeout_s"_a = 5.0)
        .def(
            "take_trace",
            [](LiveNic& n, double timeout_s) {
                // (sends, arrivals, entries not kept); each entry (op_id, phase, peer,
                // pkt_index, tick_us, delay_us, extra_us): delay -1 = every copy dropped
                std::vector<TraceEntry> sent, arrived;
                int64_t dropped = 0;
                {
                    nb::gil_scoped_release unlocked;
                    n.take_trace(sent, arrived, dropped, to_us(timeout_s));
                }
                using Row = std::tuple<int64_t, int, int, int64_t, int64_t, int64_t, int64_t>;
                auto rows = [](const std::vector<TraceEntry>& v) {
                    std::vector<Row> out;
                    out.reserve(v.size());
                    for (const TraceEntry& e : v)
                        out.emplace_back(e.op_id, e.phase, e.peer, e.pkt_index, e.tick_us,
                                         e.delay_us, e.extra_us);
                    return out;
                };
                return std::make_tuple(rows(sent), rows(arrived), dropped);
            },
            "timeout_s"_a = 5.0)
        .def("now_us", &LiveNic::now_us)
        .def(
            "stop",
            [](LiveNic& n) {
                nb::gil_scoped_release unlocked;
                n.stop();
            });
}
