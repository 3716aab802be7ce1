// A minimal test harness for the native self-test (no Python, built with ASan + UBSan):
// TEST(name) { ... CHECK(cond) ... } registers a case; selftest_main.cpp runs them all.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace selftest {

struct Case {
    const char* name;
    void (*fn)();
};

inline std::vector<Case>& cases() {
    static std::vector<Case> all;
    return all;
}

struct Register {
    Register(const char* name, void (*fn)()) { cases().push_back({name, fn}); }
};

[[noreturn]] inline void fail(const char* file, int line, const char* what) {
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what);
    std::exit(1);
}

}  // namespace selftest

#define CHECK(cond) \
    ((cond) ? (void)0 : ::selftest::fail(__FILE__, __LINE__, #cond))

// CHECK_THROWS(expr, Exception): expr must throw Exception.
#define CHECK_THROWS(expr, E)                                                   \
    do {                                                                        \
        bool thrown_ = false;                                                   \
        try {                                                                   \
            expr;                                                               \
        } catch (const E&) {                                                    \
            thrown_ = true;                                                     \
        }                                                                       \
        if (!thrown_) ::selftest::fail(__FILE__, __LINE__, #expr " throws " #E); \
    } while (0)

#define SELFTEST_CAT2(a, b) a##b
#define SELFTEST_CAT(a, b) SELFTEST_CAT2(a, b)
#define TEST(name)                                                                      \
    static void name();                                                                 \
    static ::selftest::Register SELFTEST_CAT(reg_, name)(#name, name);                  \
    static void name()
