// Python values to the C++ runtimes' types: see bind_convert.hpp.
#include "bind_convert.hpp"

#include <cmath>
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

}  // namespace optireduce
