// The live runtime's bindings (bind_live.cpp), added to the _engine module by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

void bind_live(nanobind::module_& m);
