// Python values to the C++ runtimes' types, shared by the live NIC's and the reliable
// baselines' bindings (bind_live.cpp, bind_reliable.cpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>

#include "header_tag.hpp"
#include "impairment.hpp"

namespace optireduce {

// A 1-D float32 array read or written where it is (numpy or a contiguous CPU tensor).
using F32In = nanobind::ndarray<const float, nanobind::ndim<1>, nanobind::c_contig,
                                nanobind::device::cpu>;
using F32Out = nanobind::ndarray<float, nanobind::ndim<1>, nanobind::c_contig,
                                 nanobind::device::cpu>;

// Seconds (0..86400, finite) to whole microseconds; std::invalid_argument naming `what`.
int64_t seconds_to_us(double seconds, const char* what);

// An optireduce ImpairmentSpec (None: no impairment), checked.
ImpairmentSpec impairment_from(nanobind::handle h);

// A keyed job's key: bytes of KEY_LEN (None: an unkeyed job).
JobKey key_from(nanobind::handle h);

}  // namespace optireduce
