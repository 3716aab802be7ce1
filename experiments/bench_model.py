"""`optireduce bench model`: software-model figures, each against its baseline in the same run."""

from __future__ import annotations

import time

import numpy as np

from optireduce.host.model.fwht import bench_fwht
from optireduce.host.model.virtual_cluster import calibrate_t_b, simulate_allreduce
from optireduce.params import NicParams


def bench_model(quick: bool = False) -> dict:
    out = dict(bench_fwht(b=4096, n=1 << (20 if quick else 22), repeats=3 if quick else 5))
    out["fwht_speedup_vs_numpy"] = out["fwht_gbps"] / out["numpy_fwht_gbps"]
    workers, n = 8, (1 << 16) if quick else (1 << 20)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(workers)]
    p = NicParams()
    p = p.replace(t_b_us=calibrate_t_b(xs, p))  # warm-up outside the timed op
    t0 = time.perf_counter()
    _outs, st = simulate_allreduce(xs, params=p, calibrate=False)
    secs = time.perf_counter() - t0
    out["op_seconds_8x1M" if not quick else "op_seconds_8x64K"] = secs
    out["op_elements_per_second"] = workers * n / secs
    out["op_virtual_us"] = st.elapsed_us
    return out
