"""The engine under AddressSanitizer and UBSan: random lossy clusters of native engines
(loss, duplicates, bit flips, truncation, garbage, bare datagrams, a dead rank excluded)
built from the C++ sources alone with g++ and run. Every bad frame must be a counted drop,
never a bad read or write, and every live rank must finish every op."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "host" / "native" / "src"

SOAK = r"""
#include "engine.hpp"
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <queue>
#include <random>
#include <tuple>
using namespace optireduce;

int main(int argc, char** argv) {
    std::mt19937_64 rng(std::atoi(argv[1]));
    auto U = [&](int64_t a, int64_t b) {
        return std::uniform_int_distribution<int64_t>(a, b)(rng);
    };
    const int runs = std::atoi(argv[2]);
    long frames = 0, drops = 0;
    for (int run = 0; run < runs; ++run) {
        Params p;
        p.p = 1 << U(1, 4);
        p.b = std::max(2, p.p << U(0, 4));
        p.c = int64_t{p.b} << U(0, 3);
        p.n_max = 8;
        p.ops_in_flight = U(1, 3);
        p.t_b_us = p.t_c_init_us = U(20, 2000);
        p.t_c_min_us = U(1, p.t_b_us);
        p.alpha_q8 = U(1, 256);
        p.last_percent = U(1, 100);
        const int lb = p.log2_b();
        p.headroom_bits = std::min(lb, (lb + 1) / 2 + 3);
        p.rht = U(0, 3) != 0;
        p.estimator = U(0, 1) ? Estimator::plain : Estimator::unbiased;
        const int world = U(2, 8), ops = U(1, 4);
        std::vector<std::unique_ptr<Engine>> e;
        for (int r = 0; r < world; ++r) e.emplace_back(new Engine(p, r, world));
        std::vector<int64_t> lens(ops);
        for (auto& l : lens) l = U(1, p.c);
        std::vector<int> next(world, 0), done(world, 0);
        using Ev = std::tuple<int64_t, uint64_t, int, std::vector<uint8_t>>;
        std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> q;
        uint64_t seq = 0;
        const int dead = U(0, 3) == 0 ? int(U(0, world - 1)) : -1;
        const int64_t dead_at = U(0, 2000);
        const int loss = U(0, 3) * 100, dup = U(0, 2) * 100, bad = U(0, 3) * 100;  // per mille
        auto deliver = [&](int r) {
            for (const Tx& t : e[r]->tx()) {
                if (U(0, 999) < loss) continue;
                std::vector<uint8_t> f(e[r]->tx_frame(t), e[r]->tx_frame(t) + t.len);
                for (int k = U(0, 999) < dup ? 2 : 1; k > 0; --k)
                    q.emplace(t.time_us + U(1, 300), seq++, t.dst, f);
                if (U(0, 999) < bad) {
                    std::vector<uint8_t> g = f;
                    const int kind = U(0, 2);
                    if (kind == 0)
                        for (int b = 0; b < 3; ++b) g[U(0, g.size() - 1)] ^= 1 << U(0, 7);
                    else if (kind == 1)
                        g.resize(U(0, g.size()));
                    else {
                        g.resize(U(1, 200));
                        for (auto& x : g) x = U(0, 255);
                    }
                    q.emplace(t.time_us + U(1, 300), seq++, t.dst, g);
                }
            }
            e[r]->clear_tx();
            done[r] += e[r]->poll_results().size();
        };
        // outputs out, then queued ops in while the window has room (a start may end ops)
        auto flush = [&](int r, int64_t now) {
            deliver(r);
            while (next[r] < ops && next[r] < e[r]->base() + p.ops_in_flight) {
                std::vector<float> x(lens[next[r]]);
                for (auto& v : x) v = float(U(-1000000, 1000000)) / 1000.f;
                e[r]->start_op(now, next[r], x.data(), x.size(), -8);
                ++next[r];
                deliver(r);
            }
        };
        for (int r = 0; r < world; ++r) flush(r, 0);
        for (long steps = 0;; ++steps) {
            if (steps > 5000000) { std::puts("did not settle"); return 3; }
            int64_t tt = INT64_MAX;
            int rt = -1;
            for (int r = 0; r < world; ++r) {
                const auto t = e[r]->next_timer();
                if (t && *t < tt && !(r == dead && *t >= dead_at)) { tt = *t; rt = r; }
            }
            if (!q.empty() && std::get<0>(q.top()) < tt) {
                auto [t, s, d, f] = q.top();
                q.pop();
                if (d == dead && t >= dead_at) continue;
                if (dead >= 0 && d != dead && t >= dead_at + 100) e[d]->exclude(t, dead);
                if (U(0, 1) || f.size() < L2_L4_LEN)
                    e[d]->receive(t, f.data(), f.size());
                else
                    e[d]->receive_datagram(t, f.data() + L2_L4_LEN, f.size() - L2_L4_LEN);
                ++frames;
                flush(d, t);
            } else if (rt >= 0) {
                e[rt]->advance(tt);
                flush(rt, tt);
            } else {
                break;
            }
        }
        for (int r = 0; r < world; ++r) {
            for (int k = 0; k < N_DROPS; ++k) drops += e[r]->counters()[k];
            if (r != dead && done[r] != ops) {
                std::printf("run %d: rank %d finished %d of %d ops\n", run, r, done[r], ops);
                return 4;
            }
        }
    }
    std::printf("soak ok: %d runs, %ld frames, %ld dropped\n", runs, frames, drops);
    return 0;
}
"""


def test_engine_soak_under_asan_and_ubsan(tmp_path):
    cxx = shutil.which("g++")
    assert cxx, "g++ is needed to build the native engine"
    (tmp_path / "soak.cpp").write_text(SOAK)
    sources = [SRC / f for f in ("engine.cpp", "engine_deadline.cpp", "wire.cpp", "codec.cpp")]
    flags = ["-std=c++17", "-O1", "-g", "-march=x86-64-v2", "-fno-omit-frame-pointer",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-DOPTIREDUCE_NO_CLONES", f"-I{SRC}"]  # fmt: skip
    exe = tmp_path / "soak"
    build = subprocess.run([cxx, *flags, str(tmp_path / "soak.cpp"), *map(str, sources),
                            "-o", str(exe), "-lpthread"],
                           capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    for seed in (1, 2):
        r = subprocess.run([str(exe), str(seed), "400"], capture_output=True, text=True,
                           timeout=300, env=env, check=False)  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
        assert "soak ok" in r.stdout and "runtime error" not in r.stderr, r.stdout + r.stderr
        assert " 0 dropped" not in r.stdout  # the bad frames did reach the parser
