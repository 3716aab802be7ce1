// The native reliable baselines' bindings (bind_reliable.cpp), added to the _engine module by
// module.cpp.
#pragma once

#include <nanobind/nanobind.h>

void bind_reliable(nanobind::module_& m);
