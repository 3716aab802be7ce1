// OpStats as a Python dict, shared by the engine's and the live runtime's bindings.
#pragma once

#include <nanobind/nanobind.h>

#include "engine.hpp"

namespace optireduce {

// The fields of optireduce.op_stats.OpStats (OpStats(**d) rebuilds it).
nanobind::dict stats_dict(const OpStats& s);

}  // namespace optireduce
