"""The native sources under AddressSanitizer and UBSan: host/native built with
OPTIREDUCE_SANITIZE=ON (the self-test host/native/tests/*.cpp with every C++ source but the
bindings) into build/native-asan[-<march>], with the CMake and Ninja of this environment, then
run."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILDS = ROOT / "build"


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def tool(name: str) -> str:
    """The venv's copy (pip packages cmake, ninja), else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    assert found, f"{name} not found: `make install` installs it (dev extra)"
    return found


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


# x86-64-v2: the module's default version of the vector code (SSE); x86-64-v3 its AVX2 one,
# which machines with AVX-512 (these) never run otherwise. v4 is what the module runs here,
# checked against the model by test_codec_native.py.
@pytest.mark.deep  # two sanitizer builds, 2 minutes: the engine's bit-exact tests are in make test
@pytest.mark.parametrize("march", ["x86-64-v2", "x86-64-v3"])
def test_native_selftest_under_asan_and_ubsan(march):
    if march == "x86-64-v3" and "avx2" not in cpu_flags():
        pytest.skip("this CPU cannot run AVX2 code")
    build = BUILDS / ("native-asan" if march == "x86-64-v2" else f"native-asan-{march}")
    build.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")  # fmt: skip
    with open(f"{build}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one user of the shared tree at a time
        build_selftest(build, march)
        r = subprocess.run(
            [str(build / "native_selftest")], capture_output=True, text=True, timeout=120,
            env=env, check=False,
        )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    assert "cases passed" in r.stdout and "runtime error" not in r.stderr, r.stdout + r.stderr


def build_selftest(build_dir: Path, march: str) -> None:
    cfg = run(
        [tool("cmake"), "-S", str(ROOT / "host" / "native"), "-B", str(build_dir), "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}", "-DOPTIREDUCE_SANITIZE=ON",
         f"-DOPTIREDUCE_SELFTEST_MARCH={march}"],
        timeout=60,
    )  # fmt: skip
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    build = run([tool("cmake"), "--build", str(build_dir), "-j", "2"], timeout=300)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
