// optireduce.host.native._engine: the codec's Python face (and the engine's, bind_engine).
//
// Arrays come in as nb::ndarray views: numpy arrays and contiguous CPU torch tensors are read
// and written where they are. Inputs of another dtype are converted (as the model's
// np.asarray does); an `out` array must already have the right dtype and length, and is
// written in place and returned. The work runs with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "codec.hpp"
#include "py_params.hpp"
#ifdef OPTIREDUCE_WITH_ENGINE
#include "bind_engine.hpp"
#include "bind_live.hpp"
#include "bind_reliable.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace optireduce {

namespace {

template <class T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using NewArray = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A fresh numpy array of n elements (made with the GIL held, filled without it).
template <class T>
NewArray<T> new_array(size_t n) {
    T* data = new T[n ? n : 1];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    return NewArray<T>(data, {n}, owner);
}

// The caller's `out` (no conversion: writing into a converted copy would be lost), or a new
// array; returns the pointer to write and the Python object to return.
template <class T>
constexpr const char* dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "float32";
    if constexpr (std::is_same_v<T, int32_t>) return "int32";
    if constexpr (std::is_same_v<T, int64_t>) return "int64";
    return "?";
}

template <class T>
std::pair<T*, nb::object> output(nb::handle out, size_t n, const char* what) {
    if (out.is_none()) {
        NewArray<T> a = new_array<T>(n);
        return {a.data(), nb::cast(a)};
    }
    Out<T> o;
    if (!nb::try_cast<Out<T>>(out, o, false))
        throw std::invalid_argument(std::string(what) + ": out must be a writable contiguous 1-D " +
                                    "CPU array of dtype " + dtype_name<T>() +
                                    " (no conversion)");
    if (o.shape(0) != n)
        throw std::invalid_argument(std::string(what) + ": out has " +
                                    std::to_string(o.shape(0)) + " elements, needs " +
                                    std::to_string(n));
    return {o.data(), nb::borrow(out)};
}

uint32_t u32(long long v, const char* name) {
    if (v < 0 || v > 0xFFFFFFFFLL)
        throw std::invalid_argument(std::string(name) + " must fit 32 bits, got " +
                                    std::to_string(v));
    return static_cast<uint32_t>(v);
}

}  // namespace

Params params_from_py(nb::handle p) {
    if (nb::isinstance<Params>(p)) return nb::cast<Params>(p);
    auto i64 = [&](const char* name) { return nb::cast<long long>(p.attr(name)); };
    Params r;
    r.n_max = static_cast<int32_t>(i64("n_max"));
    r.p = static_cast<int32_t>(i64("p"));
    r.b = static_cast<int32_t>(i64("b"));
    r.c = i64("c");
    r.lanes = static_cast<int32_t>(i64("lanes"));
    r.ops_in_flight = static_cast<int32_t>(i64("ops_in_flight"));
    r.w_wire = static_cast<int32_t>(i64("w_wire"));
    r.headroom_bits = static_cast<int32_t>(i64("headroom_bits_eff"));
    r.seed = u32(i64("seed"), "NicParams.seed");
    r.rht = nb::cast<bool>(p.attr("rht"));
    const std::string est = nb::cast<std::string>(p.attr("estimator"));
    if (est == "unbiased")
        r.estimator = Estimator::unbiased;
    else if (est == "plain")
        r.estimator = Estimator::plain;
    else
        throw std::invalid_argument("NicParams.estimator=" + est + ": unknown estimator");
    r.t_b_us = i64("t_b_us");
    r.t_c_init_us = i64("t_c_init");
    r.t_c_min_us = i64("t_c_min_us");
    r.t_c_max_us = i64("t_c_max_us");
    r.alpha_q8 = static_cast<int32_t>(i64("alpha_q8"));
    r.last_percent = static_cast<int32_t>(i64("last_percent"));
    r.tc_gain_shift = static_cast<int32_t>(i64("tc_gain_shift"));
    r.tc_dev_shift = static_cast<int32_t>(i64("tc_dev_shift"));
    r.tc_dev_mult = static_cast<int32_t>(i64("tc_dev_mult"));
    const std::string tcs = nb::cast<std::string>(p.attr("tc_sample"));
    if (tcs == "duration")
        r.tc_sample = TcSample::duration;
    else if (tcs == "last_arrival")
        r.tc_sample = TcSample::last_arrival;
    else
        throw std::invalid_argument("NicParams.tc_sample=" + tcs + ": unknown t_C sample");
    r.progress_ahead = nb::cast<bool>(p.attr("progress_ahead"));
    r.udp_port = static_cast<int32_t>(i64("udp_port"));
    r.job_id = static_cast<int32_t>(i64("job_id"));
    r.check();
    return r;
}

namespace {

void bind_codec(nb::module_& m) {
    nb::enum_<Estimator>(m, "Estimator")
        .value("unbiased", Estimator::unbiased)
        .value("plain", Estimator::plain);

    nb::class_<Params>(m, "Params",
                       "NicParams as the native engine holds it (from_nicparams converts once, "
                       "so per-call conversions are skipped).")
        .def_static("from_nicparams", &params_from_py, "p"_a)
        .def_ro("n_max", &Params::n_max)
        .def_ro("p", &Params::p)
        .def_ro("b", &Params::b)
        .def_ro("c", &Params::c)
        .def_ro("w_wire", &Params::w_wire)
        .def_ro("headroom_bits", &Params::headroom_bits)
        .def_ro("seed", &Params::seed)
        .def_ro("rht", &Params::rht)
        .def_ro("estimator", &Params::estimator)
        .def_prop_ro("w_in", &Params::w_in)
        .def_prop_ro("q_max", &Params::q_max)
        .def_prop_ro("wire_max", &Params::wire_max)
        .def("padded_len", &Params::padded_len, "n"_a);

    m.def(
        "propose_exponent",
        [](In<float> x, nb::handle p) {
            const Params pp = params_from_py(p);
            nb::gil_scoped_release nogil;
            return propose_exponent(x.data(), x.shape(0), pp);
        },
        "x"_a, "p"_a, "quantize.propose_exponent: the op exponent this worker proposes.");

    m.def(
        "quantize",
        [](In<float> x, int exponent, long long q_max, nb::handle out) {
            const size_t n = x.shape(0);
            auto [q, obj] = output<int64_t>(out, n, "quantize");
            QuantizeCounts c;
            {
                nb::gil_scoped_release nogil;
                c = quantize(x.data(), n, exponent, q_max, q);
            }
            return std::make_tuple(obj, c.saturated, c.nonfinite);
        },
        "x"_a, "exponent"_a, "q_max"_a, "out"_a = nb::none(),
        "quantize.quantize -> (q int64, saturated, nonfinite).");

    m.def(
        "dequantize",
        [](In<int64_t> v, int exponent, nb::handle out) {
            const size_t n = v.shape(0);
            auto [x, obj] = output<float>(out, n, "dequantize");
            int64_t sat;
            {
                nb::gil_scoped_release nogil;
                sat = dequantize(v.data(), n, exponent, x);
            }
            return std::make_pair(obj, sat);
        },
        "v"_a, "exponent"_a, "out"_a = nb::none(),
        "quantize.dequantize -> (x float32, saturated).");

    m.def(
        "speck_encrypt",
        [](std::tuple<int, int, int, int> key, int x, int y) {
            auto w16 = [](int v) {
                if (v < 0 || v > 0xFFFF) throw std::invalid_argument("Speck words are 16-bit");
                return static_cast<uint16_t>(v);
            };
            const SignKey k = speck_key_schedule(w16(std::get<0>(key)), w16(std::get<1>(key)),
                                                 w16(std::get<2>(key)), w16(std::get<3>(key)));
            uint16_t a = w16(x), b = w16(y);
            speck_encrypt(k, a, b);
            return std::make_pair(int{a}, int{b});
        },
        "key"_a, "x"_a, "y"_a, "One Speck32/64 block, key = (l2, l1, l0, k0).");

    m.def(
        "sign_bits",
        [](long long seed, long long op_id, long long start, long long n) {
            if (start < 0 || n < 0) throw std::invalid_argument("sign_bits: start, n >= 0");
            const SignKey k = sign_key(u32(seed, "seed"), static_cast<uint32_t>(op_id));
            NewArray<uint8_t> a = new_array<uint8_t>(static_cast<size_t>(n));
            {
                nb::gil_scoped_release nogil;
                sign_bits(k, static_cast<uint64_t>(start), static_cast<size_t>(n), a.data());
            }
            return a;
        },
        "seed"_a, "op_id"_a, "start"_a, "n"_a,
        "signs.sign_bits (op_id modulo 2^32, as the model's key).");

    m.def(
        "apply_signs",
        [](In<int64_t> v, long long seed, long long op_id, long long start, nb::handle out) {
            if (start < 0) throw std::invalid_argument("apply_signs: start >= 0");
            const size_t n = v.shape(0);
            const SignKey k = sign_key(u32(seed, "seed"), static_cast<uint32_t>(op_id));
            auto [o, obj] = output<int64_t>(out, n, "apply_signs");
            {
                nb::gil_scoped_release nogil;
                apply_signs(k, static_cast<uint64_t>(start), v.data(), n, o);
            }
            return obj;
        },
        "v"_a, "seed"_a, "op_id"_a, "start"_a = 0, "out"_a = nb::none(),
        "signs.apply_signs for elements start.. (int64; out may be v itself).");

    m.def(
        "fwht_blocks",
        [](In<int32_t> x, int b, nb::handle out) {
            const size_t n = x.shape(0);
            auto [y, obj] = output<int64_t>(out, n, "fwht_blocks");
            {
                nb::gil_scoped_release nogil;
                fwht_blocks(x.data(), n, b, y);
            }
            return obj;
        },
        "x"_a.noconvert(), "b"_a, "out"_a = nb::none());
    m.def(
        "fwht_blocks",
        [](In<int64_t> x, int b, nb::handle out) {
            const size_t n = x.shape(0);
            auto [y, obj] = output<int64_t>(out, n, "fwht_blocks");
            {
                nb::gil_scoped_release nogil;
                fwht_blocks(x.data(), n, b, y);
            }
            return obj;
        },
        "x"_a, "b"_a, "out"_a = nb::none(),
        "fwht.fwht_blocks: H_b per block, exact int64 (int32 or int64 input; out may be x).");

    m.def(
        "fwht_saturate",
        [](In<int32_t> x, int b, long long limit, nb::handle out) {
            const size_t n = x.shape(0);
            auto [y, obj] = output<int32_t>(out, n, "fwht_saturate");
            int64_t over;
            {
                nb::gil_scoped_release nogil;
                over = fwht_saturate(x.data(), n, b, limit, y);
            }
            return std::make_pair(obj, over);
        },
        "x"_a, "b"_a, "limit"_a, "out"_a = nb::none(),
        "H_b per block clamped to +-limit -> (y int32, clamped count).");

    m.def(
        "div_round",
        [](In<int64_t> t, long long d, nb::handle out) {
            const size_t n = t.shape(0);
            auto [o, obj] = output<int64_t>(out, n, "div_round");
            {
                nb::gil_scoped_release nogil;
                div_round_n(t.data(), n, d, o);
            }
            return obj;
        },
        "t"_a, "d"_a, "out"_a = nb::none(),
        "codec.div_round with one divisor: t / d rounded half away from zero (int64).");

    m.def(
        "encode",
        [](In<float> x, int exponent, long long op_id, nb::handle p, nb::handle out) {
            const Params pp = params_from_py(p);
            const size_t n = x.shape(0);
            auto [y, obj] = output<int32_t>(out, pp.padded_len(n), "encode");
            if (static_cast<const void*>(y) == static_cast<const void*>(x.data()))
                throw std::invalid_argument("encode: out must not be x");
            EncodeCounts c;
            {
                nb::gil_scoped_release nogil;
                c = encode(x.data(), n, exponent, static_cast<uint32_t>(op_id), pp, y);
            }
            return std::make_tuple(obj, c.sat_quantize, c.sat_transform, c.nonfinite);
        },
        "x"_a, "exponent"_a, "op_id"_a, "p"_a, "out"_a = nb::none(),
        "codec.encode -> (y int32 of p.padded_len(n), sat_quantize, sat_transform, "
        "nonfinite).");

    m.def(
        "decode",
        [](In<int32_t> z, In<bool> have, long long n, int exponent, long long op_id,
           nb::handle p, nb::handle out) {
            const Params pp = params_from_py(p);
            if (n < 0) throw std::invalid_argument("decode: n must be >= 0");
            const size_t nn = static_cast<size_t>(n);
            if (z.shape(0) != pp.padded_len(nn))
                throw std::invalid_argument("decode: z has " + std::to_string(z.shape(0)) +
                                            " elements, needs padded_len(n) = " +
                                            std::to_string(pp.padded_len(nn)));
            if (have.shape(0) != pp.packets_for(nn))
                throw std::invalid_argument("decode: have has " +
                                            std::to_string(have.shape(0)) +
                                            " flags, needs packets_for(n) = " +
                                            std::to_string(pp.packets_for(nn)));
            auto [x, obj] = output<float>(out, nn, "decode");
            static_assert(sizeof(bool) == 1, "have is read as bytes");
            DecodeCounts c;
            {
                nb::gil_scoped_release nogil;
                c = decode(z.data(), reinterpret_cast<const uint8_t*>(have.data()), nn, exponent,
                           static_cast<uint32_t>(op_id), pp, x);
            }
            return std::make_tuple(obj, c.sat_output, c.empty_blocks);
        },
        "z"_a, "have"_a, "n"_a, "exponent"_a, "op_id"_a, "p"_a, "out"_a = nb::none(),
        "codec.decode -> (x float32 of n, sat_output, empty_blocks).");
}

}  // namespace

}  // namespace optireduce

NB_MODULE(_engine, m) {
    m.doc() = "optireduce native host engine: the codec (and the engine when built with it)";
    optireduce::bind_codec(m);
#ifdef OPTIREDUCE_WITH_ENGINE
    m.attr("with_engine") = true;
    bind_engine(m);
    bind_live(m);
    bind_reliable(m);
#else
    m.attr("with_engine") = false;
#endif
}
