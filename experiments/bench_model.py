"""`optireduce bench model`: software-model figures, each against its baseline in the same run."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

import numpy as np

from optireduce.host.model.fwht import bench_fwht
from optireduce.host.model.quantize import propose_exponent, quantize
from optireduce.host.model.virtual_cluster import calibrate_t_b, simulate_allreduce
from optireduce.params import NicParams


def _best_of(
    fns: list[Callable[[], object]], repeats: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Best time of each fn over `repeats` rounds, the fns interleaved within a round so that
    a busy machine slows them alike (one warm-up call each first); `before` runs untimed
    before every timed call."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def bench_native(b: int = 4096, n: int = 1 << 22, repeats: int = 7) -> dict:
    """The native codec against a copy of the same buffer, one core, in one run.

    GB/s count the op's input bytes (n * 4); every output buffer is allocated once outside
    the timing. native_fwht: the encoder's transform (int32 quantized gradient in, blockwise
    H_b, saturated to the wire, int32 out: the same bytes as the copy). native_fwht_exact: the
    decoder's (full-range int32 in, exact int64 out). encode: float32 -> wire; decode: wire ->
    float32 with every packet present. memcpy: numpy's copy (np.copyto) of the int32 buffer;
    libc_memcpy the C library's memmove of it, for reference.

    Every figure is measured twice, under the same cache state for all: cold (256 MiB written
    before each timed call, so the buffers come from DRAM, as a gradient fresh from a large
    backward pass does) and warm (back-to-back calls: what fits the last-level cache stays).
    """
    from optireduce.host.native import _engine, why

    if _engine is None:
        return {"native_error": why}
    p = NicParams(b=b)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    e = propose_exponent(x, p)
    q = quantize(x, e, p).q.astype(np.int32)  # the encoder's FWHT input
    wire = rng.integers(-p.wire_max, p.wire_max + 1, size=n).astype(np.int32)
    copy = np.empty_like(q)
    y32 = np.empty(n, dtype=np.int32)
    y64 = np.empty(n, dtype=np.int64)
    enc = np.empty(p.padded_len(n), dtype=np.int32)
    have = np.ones(p.packets_for(n), dtype=bool)
    out = np.empty(n, dtype=np.float32)
    _engine.encode(x, e, 1, p, enc)
    names = ["native_fwht", "memcpy", "libc_memcpy", "native_fwht_exact"]
    names += ["native_encode", "native_decode"]
    fns = [
        lambda: _engine.fwht_saturate(q, b, p.wire_max, y32),
        lambda: np.copyto(copy, q),
        lambda: ctypes.memmove(copy.ctypes.data, q.ctypes.data, q.nbytes),
        lambda: _engine.fwht_blocks(wire, b, y64),
        lambda: _engine.encode(x, e, 1, p, enc),
        lambda: _engine.decode(enc, have, n, e, 1, p, out),
    ]
    junk = np.zeros(1 << 25, dtype=np.int64)  # 256 MiB

    def evict() -> None:
        np.add(junk, 1, out=junk)

    res: dict = {}
    for suffix, before, runs in (("", evict, (fns,)), ("_warm", None, tuple([f] for f in fns))):
        # warm: each fn's calls back to back, so each finds its own buffers cached
        secs = [s for group in runs for s in _best_of(group, repeats, before)]
        for k, s in zip(names, secs, strict=True):
            res[f"{k}{suffix}_gbps"] = n * 4 / s / 1e9
        res[f"native_fwht_vs_memcpy{suffix}"] = (
            res[f"native_fwht{suffix}_gbps"] / res[f"memcpy{suffix}_gbps"]
        )
        res[f"native_fwht_vs_libc_memcpy{suffix}"] = (
            res[f"native_fwht{suffix}_gbps"] / res[f"libc_memcpy{suffix}_gbps"]
        )
    return res


def bench_model(quick: bool = False) -> dict:
    out = dict(bench_fwht(b=4096, n=1 << (20 if quick else 22), repeats=3 if quick else 5))
    out["fwht_speedup_vs_numpy"] = out["fwht_gbps"] / out["numpy_fwht_gbps"]
    out.update(bench_native(b=4096, n=1 << (20 if quick else 22), repeats=3 if quick else 11))
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
