// Python values to the C++ runtimes' types: see bind_convert.hpp.
#include "bind_convert.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace nb = nanobind;

namespace optireduce {

int64_t seconds_to_us(double seconds, const char* what) {
    if (!(seconds >= 0) || !std::isfinite(seconds) || seconds > 86400.0)
        throw std::invalid_argument(std::string(what) + " must be in [0, 86400] s");
    return static_cast<int64_t>(std::llround(seconds * 1e6));
}

ImpairmentSpec impairment_from(nb::handle h) {
    ImpairmentSpec s;
    if (h.is_none()) return s;
    s.median_us = nb::cast<double>(h.attr("median_us"));
    s.p99_ratio = nb::cast<double>(h.attr("p99_ratio"));
    s.loss = nb::cast<double>(h.attr("loss"));
    s.duplicate = nb::cast<double>(h.attr("duplicate"));
    s.reorder = nb::cast<double>(h.attr("reorder"));
    s.extra_us = nb::cast<double>(h.attr("extra_us"));
    s.check();
    return s;
}

JobKey key_from(nb::handle h) {
    if (h.is_none()) return std::nullopt;
    const nb::bytes b = nb::cast<nb::bytes>(h);
    if (b.size() != KEY_LEN)
        throw std::invalid_argument("a job key is " + std::to_string(KEY_LEN) + " bytes, not " +
                                    std::to_string(b.size()));
    std::array<uint8_t, KEY_LEN> k;
    std::memcpy(k.data(), b.c_str(), KEY_LEN);
    return k;
}

}  // namespace optireduce
