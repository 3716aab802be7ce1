// Runs every TEST of the native self-test; an argument runs only the cases whose name
// contains it. Exit status 0 when all pass; a failed CHECK exits 1 at once.
#include <chrono>
#include <cstdio>
#include <cstring>

#include "selftest.hpp"

int main(int argc, char** argv) {
    const char* filter = argc > 1 ? argv[1] : "";
    int ran = 0;
    for (const selftest::Case& c : selftest::cases()) {
        if (!std::strstr(c.name, filter)) continue;
        std::printf("%-44s", c.name);
        std::fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        c.fn();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf(" ok %.2f s\n", s);
        ++ran;
    }
    std::printf("%d cases passed\n", ran);
    return ran ? 0 : 2;
}
