"""Run a cocotb bench on an Amaranth component under Verilator, from pytest.

One build directory per configuration (keyed by the Verilog text), reused across
tests and pytest-xdist workers (a file lock serializes the first build). A
failing cocotb test makes this raise, so the pytest test fails.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from amaranth.lib import wiring
from filelock import FileLock

from optireduce.sim import verilog
from optireduce.sim.toolchain import use_verilator

ENV_CONFIG = "OPTIREDUCE_TB"


def build(
    component: wiring.Component,
    name: str,
    sources: tuple[Path, ...] = (),
    log_file: Path | None = None,
) -> Path:
    """Verilate `component` (once per configuration) with the Verilog files of the modules
    it instantiates, `sources`; returns the build directory."""
    use_verilator()
    from cocotb_tools.runner import get_runner

    vpath = verilog.write(component, name, kind="cocotb")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    build_dir = vpath.parent / (f"verilator-{digest}" if sources else "verilator")
    with FileLock(str(vpath.parent / ".lock"), timeout=1800):
        if not (build_dir / ".built").exists():
            get_runner("verilator").build(
                sources=[vpath, *sources],
                hdl_toplevel=name,
                build_dir=build_dir,
                build_args=["-Wno-fatal", "-O2"],
                always=True,
                log_file=log_file and log_file.with_suffix(".build.log"),
            )
            (build_dir / ".built").write_text("ok")
    return build_dir


def field_places(layout) -> dict[str, list[int]]:
    """{field: [offset, width]} of a StructLayout, as a bench's JSON config carries it."""
    return {n: [f.offset, f.width] for n, f in layout}


def pack_fields(fields: dict, places: dict) -> int:
    """One word from named fields (missing ones 0) at their `field_places`."""
    word = 0
    for name, (offset, width) in places.items():
        word |= (int(fields.get(name, 0)) & ((1 << width) - 1)) << offset
    return word


def run_bench(
    component: wiring.Component,
    name: str,
    bench: str,
    config: dict | None = None,
    testcase: str | list[str] | None = None,
    sources: tuple[Path, ...] = (),
    log_file: Path | None = None,
) -> None:
    """Run cocotb module `bench` (dotted name) against `component` with `config` as JSON;
    raises if a test failed. `log_file` takes the tools' output (else stdout)."""
    build_dir = build(component, name, sources, log_file)
    from cocotb_tools.runner import get_results, get_runner

    test_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=build_dir.parent))
    results = get_runner("verilator").test(
        hdl_toplevel=name,
        hdl_toplevel_lang="verilog",
        test_module=bench,
        build_dir=build_dir,
        test_dir=test_dir,
        testcase=testcase,
        extra_env={ENV_CONFIG: json.dumps(config or {})},
        log_file=log_file,
    )
    tests, failed = get_results(results)
    if failed:
        where = f" (log: {log_file})" if log_file else ""
        raise RuntimeError(f"{bench}: {failed} of {tests} cocotb tests failed{where}")


async def until(clk, cond, what: str, bound: int) -> int:
    """Inside a bench: rising edges of `clk` until `cond()` holds at one (at most
    `bound`); returns how many came first. Fails the test with `what` if it never holds."""
    from cocotb.triggers import RisingEdge

    for n in range(bound):
        await RisingEdge(clk)
        if cond():
            return n
    raise AssertionError(f"{what}: not within {bound} cycles")


def bench_config() -> dict:
    """Inside a bench: the config the pytest side passed."""
    import os

    return json.loads(os.environ.get(ENV_CONFIG, "{}"))
