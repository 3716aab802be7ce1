"""The native sources under AddressSanitizer and UBSan: host/native built with
OPTIREDUCE_SANITIZE=ON (the self-test host/native/tests/*.cpp with every C++ source but the
bindings) into build/native-asan, with the CMake and Ninja of this environment, then run."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "native-asan"


def tool(name: str) -> str:
    """The venv's copy (pip packages cmake, ninja), else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    assert found, f"{name} not found: `make install` installs it (dev extra)"
    return found


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_native_selftest_under_asan_and_ubsan():
    BUILD.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")  # fmt: skip
    with open(BUILD.parent / "native-asan.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one user of the shared tree at a time
        build_selftest()
        r = subprocess.run(
            [str(BUILD / "native_selftest")], capture_output=True, text=True, timeout=120,
            env=env, check=False,
        )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    assert "cases passed" in r.stdout and "runtime error" not in r.stderr, r.stdout + r.stderr


def build_selftest() -> None:
    cfg = run(
        [tool("cmake"), "-S", str(ROOT / "host" / "native"), "-B", str(BUILD), "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}", "-DOPTIREDUCE_SANITIZE=ON"],
        timeout=60,
    )  # fmt: skip
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    build = run([tool("cmake"), "--build", str(BUILD), "-j", "2"], timeout=300)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
