// nanobind face of the native engine (engine.hpp) and its wire layer (wire.hpp).
//
// The event calls (start_op, receive, receive_datagram, advance, exclude) run without the
// GIL: their inputs are immutable bytes or a float32 array the call holds; a lock per engine
// keeps calls from several Python threads apart. Outputs come back
// as bytes, numpy arrays and plain dicts; host/native/engine.py wraps them in the model's
// types (Tx, OpResult, OpStats).
#include "bind_engine.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "bind_stats.hpp"
#include "engine.hpp"
#include "py_params.hpp"
#include "wire.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using optireduce::Addressing;
using optireduce::Engine;
using optireduce::Header;

namespace {

using F32In = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32In = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

Addressing addressing(uint64_t mac_base, uint32_t ip_base) {
    Addressing a;
    a.mac_base = mac_base;
    a.ip_base = ip_base;
    return a;
}

const uint8_t* bytes_ptr(const nb::bytes& b) { return reinterpret_cast<const uint8_t*>(b.c_str()); }

nb::tuple header_tuple(const Header& h) {
    return nb::make_tuple(h.version, h.msg_type, h.flags, int{h.exponent}, h.job_id, h.sender,
                          h.op_id, h.pkt_index, h.count, h.contributors, h.t_c_us, h.op_len,
                          h.world, h.reserved);
}

Header header_from(nb::handle t) {
    nb::sequence s = nb::borrow<nb::sequence>(t);
    if (nb::len(s) != 14) throw std::invalid_argument("a UBT header has 14 fields");
    auto u = [&](size_t k, uint64_t max) {
        const int64_t v = nb::cast<int64_t>(s[k]);
        if (v < 0 || static_cast<uint64_t>(v) > max)
            throw std::invalid_argument("UBT header field " + std::to_string(k) + " out of range");
        return static_cast<uint64_t>(v);
    };
    Header h;
    h.version = static_cast<uint8_t>(u(0, 0xFF));
    h.msg_type = static_cast<uint8_t>(u(1, 0xFF));
    h.flags = static_cast<uint8_t>(u(2, 0xFF));
    const int64_t e = nb::cast<int64_t>(s[3]);
    if (e < -128 || e > 127) throw std::invalid_argument("UBT exponent outside int8");
    h.exponent = static_cast<int8_t>(e);
    h.job_id = static_cast<uint16_t>(u(4, 0xFFFF));
    h.sender = static_cast<uint16_t>(u(5, 0xFFFF));
    h.op_id = static_cast<uint32_t>(u(6, 0xFFFFFFFF));
    h.pkt_index = static_cast<uint32_t>(u(7, 0xFFFFFFFF));
    h.count = static_cast<uint16_t>(u(8, 0xFFFF));
    h.contributors = static_cast<uint16_t>(u(9, 0xFFFF));
    h.t_c_us = static_cast<uint32_t>(u(10, 0xFFFFFFFF));
    h.op_len = static_cast<uint32_t>(u(11, 0xFFFFFFFF));
    h.world = static_cast<uint16_t>(u(12, 0xFFFF));
    h.reserved = static_cast<uint16_t>(u(13, 0xFFFF));
    return h;
}

// A parse result as ubt.py gives it: the reason's name, or (header tuple, payload bytes).
nb::object parsed(int code, const optireduce::Parsed& r) {
    if (code != optireduce::OK) return nb::str(optireduce::DROP_NAMES[code]);
    return nb::make_tuple(header_tuple(r.h),
                          nb::bytes(reinterpret_cast<const char*>(r.payload), 4 * size_t{r.h.count}));
}


nb::ndarray<nb::numpy, float, nb::ndim<1>> float_array(std::vector<float>&& v) {
    auto* owned = new std::vector<float>(std::move(v));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    return nb::ndarray<nb::numpy, float, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

// One engine and the lock that serialises calls from several Python threads (the event
// calls run without the GIL, so the GIL alone does not).
struct PyEngine {
    Engine e;
    std::mutex mu;
    PyEngine(const optireduce::Params& p, int rank, int world, const Addressing& a,
             int64_t first_op, optireduce::Inband inband)
        : e(p, rank, world, a, first_op, inband) {}
};
using Lock = std::lock_guard<std::mutex>;

// NicParams.exp_inband / exp_lead_eff (a C++ Params has neither: in-band off).
optireduce::Inband inband_from(nb::handle params) {
    optireduce::Inband ib;
    if (nb::hasattr(params, "exp_inband")) {
        ib.on = nb::cast<bool>(params.attr("exp_inband"));
        ib.lead = nb::cast<int>(params.attr("exp_lead_eff"));
    }
    return ib;
}

void check_phase(int phase) {
    if (phase != 1 && phase != 2) throw std::invalid_argument("phase must be 1 or 2");
}

}  // namespace

namespace optireduce {
nb::dict stats_dict(const OpStats& s) {
    nb::dict d;
    d["op_id"] = s.op_id;
    d["rank"] = s.rank;
    d["world"] = s.world;
    d["n"] = s.n;
    d["exponent"] = s.exponent;
    d["start_us"] = s.start_us;
    d["end_us"] = s.end_us;
    d["phase1_reason"] = reason_name(s.phase1_reason);
    d["phase2_reason"] = reason_name(s.phase2_reason);
    d["phase1_timeout_us"] = s.phase1_timeout_us;
    d["phase2_timeout_us"] = s.phase2_timeout_us;
    d["phase1_end_us"] = s.phase1_end_us;
    d["p1_expected"] = s.p1_expected;
    d["p1_received"] = s.p1_received;
    d["p2_expected"] = s.p2_expected;
    d["p2_received"] = s.p2_received;
    d["contributor_hist"] = s.contributor_hist;
    d["sat_quantize"] = s.sat_quantize;
    d["sat_transform"] = s.sat_transform;
    d["sat_output"] = s.sat_output;
    d["nonfinite"] = s.nonfinite;
    d["nonfinite_result"] = s.nonfinite_result;
    d["empty_blocks"] = s.empty_blocks;
    d["late"] = s.late;
    d["duplicate"] = s.duplicate;
    d["t_c_us"] = nb::make_tuple(s.t_c_us[0], s.t_c_us[1]);
    d["p1_missing_from"] = s.p1_missing_from;
    d["p2_missing_from"] = s.p2_missing_from;
    return d;
}

}  // namespace optireduce

void bind_engine(nb::module_& m) {
    nb::class_<PyEngine>(m, "Engine", "The native event engine of one NIC (NicModel's twin).")
        .def(
            "__init__",
            [](PyEngine* self, nb::handle params, int rank, int world, uint64_t mac_base,
               uint32_t ip_base, int64_t first_op) {
                new (self) PyEngine(optireduce::params_from_py(params), rank, world,
                                    addressing(mac_base, ip_base), first_op,
                                    inband_from(params));
            },
            "params"_a, "rank"_a, "world"_a, "mac_base"_a, "ip_base"_a, "first_op"_a = 0)
        .def(
            "start_op",
            [](PyEngine& s, int64_t now, int64_t op_id, F32In data, std::optional<int> exponent,
               std::optional<int> next_proposal) {
                nb::gil_scoped_release unlocked;
                Lock lock(s.mu);
                s.e.start_op(now, op_id, data.data(), data.shape(0), exponent, next_proposal);
            },
            "now"_a, "op_id"_a, "data"_a, "exponent"_a.none(), "next_proposal"_a.none() = nb::none())
        .def(
            "inband_exponent",
            [](PyEngine& s, int64_t op_id) {
                // (exponent or None, missing ranks, ranks with no proposal)
                Lock lock(s.mu);
                const optireduce::InbandExponent r = s.e.inband_exponent(op_id);
                return nb::make_tuple(r.exponent, r.missing, r.unknown);
            },
            "op_id"_a)
        .def(
            "put_proposal",
            [](PyEngine& s, int64_t op_id, int rank, std::optional<int> proposal) {
                Lock lock(s.mu);
                s.e.put_proposal(op_id, rank, proposal);
            },
            "op_id"_a, "rank"_a, "proposal"_a.none())
        .def("exp_counters",
             [](PyEngine& s) {
                 Lock lock(s.mu);
                 nb::dict d;
                 for (int k = 0; k < optireduce::N_EXP_COUNTERS; ++k)
                     d[optireduce::exp_counter_name(k)] = s.e.exp_counters()[k];
                 return d;
             })
        .def(
            "receive",
            [](PyEngine& s, int64_t now, nb::bytes frame) {
                const uint8_t* d = bytes_ptr(frame);
                const size_t n = frame.size();
                nb::gil_scoped_release unlocked;
                Lock lock(s.mu);
                s.e.receive(now, d, n);
            },
            "now"_a, "frame"_a)
        .def(
            "receive_datagram",
            [](PyEngine& s, int64_t now, nb::bytes datagram) {
                const uint8_t* d = bytes_ptr(datagram);
                const size_t n = datagram.size();
                nb::gil_scoped_release unlocked;
                Lock lock(s.mu);
                s.e.receive_datagram(now, d, n);
            },
            "now"_a, "datagram"_a)
        .def(
            "advance",
            [](PyEngine& s, int64_t now) {
                nb::gil_scoped_release unlocked;
                Lock lock(s.mu);
                s.e.advance(now);
            },
            "now"_a)
        .def(
            "exclude",
            [](PyEngine& s, int64_t now, int rank) {
                nb::gil_scoped_release unlocked;
                Lock lock(s.mu);
                s.e.exclude(now, rank);
            },
            "now"_a, "rank"_a)
        .def("next_timer",
             [](PyEngine& s) {
                 Lock lock(s.mu);
                 return s.e.next_timer();
             })
        .def(
            "set_t_b",
            [](PyEngine& s, int64_t t_b_us) {
                Lock lock(s.mu);
                s.e.set_t_b(t_b_us);
            },
            "t_b_us"_a)
        .def(
            "poll_tx",
            [](PyEngine& s) {
                // (time_us, dst, frame, phase, op_id, pkt_index) per frame, in send order
                Lock lock(s.mu);
                nb::list out;
                for (const optireduce::Tx& t : s.e.tx()) {
                    nb::bytes f(reinterpret_cast<const char*>(s.e.tx_frame(t)), t.len);
                    out.append(nb::make_tuple(t.time_us, t.dst, f, t.phase, t.op_id, t.pkt_index));
                }
                s.e.clear_tx();
                return out;
            })
        .def(
            "poll_results",
            [](PyEngine& s) {
                // (op_id, float32 array, stats dict) per completed op, in completion order
                Lock lock(s.mu);
                nb::list out;
                for (optireduce::OpResult& r : s.e.poll_results())
                    out.append(nb::make_tuple(r.op_id, float_array(std::move(r.data)),
                                              optireduce::stats_dict(*r.stats)));
                return out;
            })
        .def("counters",
             [](PyEngine& s) {
                 Lock lock(s.mu);
                 nb::dict d;
                 for (int k = 0; k < optireduce::N_COUNTERS; ++k)
                     d[optireduce::counter_name(k)] = s.e.counters()[k];
                 return d;
             })
        .def(
            "tc",
            [](PyEngine& s, int phase) {
                check_phase(phase);
                Lock lock(s.mu);
                return s.e.tc(phase);
            },
            "phase"_a)
        .def(
            "tc_table",
            [](PyEngine& s, int phase, int rank) {
                check_phase(phase);
                if (rank < 0 || rank >= s.e.world())
                    throw std::invalid_argument("rank outside 0..world-1");
                Lock lock(s.mu);
                return s.e.tc_table(phase, rank);
            },
            "phase"_a, "rank"_a)
        .def("gone",
             [](PyEngine& s) {
                 Lock lock(s.mu);
                 return s.e.gone();
             })
        .def_prop_ro("base",
                     [](PyEngine& s) {
                         Lock lock(s.mu);
                         return s.e.base();
                     })
        .def_prop_ro("last_started",
                     [](PyEngine& s) {
                         Lock lock(s.mu);
                         return s.e.last_started();
                     })
        .def_prop_ro("rank", [](PyEngine& s) { return s.e.rank(); })
        .def_prop_ro("world", [](PyEngine& s) { return s.e.world(); })
        .def_prop_ro("ops_in_window", [](PyEngine& s) {
            Lock lock(s.mu);
            return s.e.ops_in_window();
        });

    m.def("counter_names", [] {
        std::vector<std::string> out;
        for (int k = 0; k < optireduce::N_COUNTERS; ++k) out.emplace_back(optireduce::counter_name(k));
        return out;
    });

    // The wire layer alone, for tests against optireduce/ubt.py and frame_checks.py.
    m.def(
        "wire_parse_frame",
        [](nb::bytes frame, int port, int rank, uint64_t mac_base, uint32_t ip_base, bool inband) {
            optireduce::Parsed r;
            const int code = optireduce::parse_frame(bytes_ptr(frame), frame.size(),
                                                     static_cast<uint16_t>(port), rank,
                                                     addressing(mac_base, ip_base), r, inband);
            return parsed(code, r);
        },
        "frame"_a, "port"_a, "rank"_a, "mac_base"_a, "ip_base"_a, "inband"_a = false);
    m.def(
        "wire_parse_ubt",
        [](nb::bytes datagram, bool inband) {
            optireduce::Parsed r;
            return parsed(
                optireduce::parse_ubt(bytes_ptr(datagram), datagram.size(), r, inband), r);
        },
        "datagram"_a, "inband"_a = false);
    m.def(
        "wire_build_frame",
        [](nb::handle header, I32In values, int src, int dst, int port, uint64_t mac_base,
           uint32_t ip_base) {
            const Header h = header_from(header);
            if (values.shape(0) != h.count)
                throw std::invalid_argument("wire_build_frame: values must hold count elements");
            std::vector<uint8_t> out(optireduce::frame_len(h.count));
            optireduce::build_frame(h, values.data(), src, dst, static_cast<uint16_t>(port),
                                    addressing(mac_base, ip_base), out.data());
            return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size());
        },
        "header"_a, "values"_a, "src"_a, "dst"_a, "port"_a, "mac_base"_a, "ip_base"_a);
    m.def(
        "wire_check",
        [](nb::handle header, nb::handle params, int rank, int world, int64_t base) {
            // check_peer, then check_op: None or the drop reason's name
            const optireduce::Params p = optireduce::params_from_py(params);
            const Header h = header_from(header);
            int code = optireduce::check_peer(h, p.job_id, rank, world);
            if (code == optireduce::OK)
                code = optireduce::check_op(h, p.p, p.c, p.b, rank, world, base,
                                            2 * int64_t{p.ops_in_flight});
            return code == optireduce::OK ? nb::none() : nb::object(nb::str(optireduce::DROP_NAMES[code]));
        },
        "header"_a, "params"_a, "rank"_a, "world"_a, "base"_a);
}
