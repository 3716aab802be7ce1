// OR_CLONES: a hot loop compiled three times, picked at load time.
//
// The wheel is built for x86-64-v2 (SSE4.2: every x86 CI machine of this project's kind and
// much older ones). The hot loops are also compiled for x86-64-v3 (AVX2) and v4 (AVX-512) and
// chosen at load time by the CPU's features (GCC function multiversioning), so one build runs
// everywhere and still uses the wide vectors where they exist; -march=native would not run on
// an older machine. The machines here report AVX-512 (/proc/cpuinfo), so the v4 version runs.
// Sanitizer builds keep one version (simpler stacks).
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12 && \
    !defined(OPTIREDUCE_NO_CLONES)
#define OR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OR_CLONES
#endif
