// The engine's C++ as one translation unit. Each file includes libtorch's headers, 5-10 s of
// parsing apiece; compiled together they are parsed once (docs/benchmarks.md, "Cold `make demo`").
// The files keep their own anonymous namespaces, so a helper's name must be unique across them.
#include "autocast.cpp"
#include "c10d_shim.cpp"
#include "device.cpp"
#include "grad_hooks.cpp"
#include "graph.cpp"
#include "optim.cpp"
#include "profiler.cpp"
#include "recompute.cpp"
#include "units.cpp"
