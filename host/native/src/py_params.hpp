// NicParams (Python) -> Params (C++): one conversion for every binding (module.cpp defines it).
#pragma once

#include <nanobind/nanobind.h>

#include "codec.hpp"

namespace optireduce {

// Reads the fields of an optireduce.params.NicParams (its effective headroom_bits_eff and
// t_c_init); throws std::invalid_argument if Params::check fails.
Params params_from_py(nanobind::handle nic_params);

}  // namespace optireduce
