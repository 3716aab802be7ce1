// The engine's bindings (bind_engine.cpp), added to the _engine module by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

void bind_engine(nanobind::module_& m);
