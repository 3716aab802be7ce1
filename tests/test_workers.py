"""experiments/workers.py: workers forked from the preloaded server see this process's
environment as it is when they start, not the server's, and end with that process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from optireduce.experiments.workers import start_workers

ROOT = Path(__file__).resolve().parents[1]
VAR = "OPTIREDUCE_TEST_WORKERS_VALUE"


def write_env(rank: int, out: str) -> None:
    import sys

    Path(out, f"{rank}.txt").write_text(f"{os.environ.get(VAR)} {'torch' in sys.modules}")


def test_each_start_takes_the_environment_of_its_moment(tmp_path, monkeypatch):
    for value in ("first", "second"):  # the server starts with "first" and stays
        monkeypatch.setenv(VAR, value)
        out = tmp_path / value
        out.mkdir()
        ctx = start_workers(write_env, (str(out),), 2)
        deadline = time.monotonic() + 60
        while not ctx.join(timeout=1):  # True once every worker has ended
            assert time.monotonic() < deadline, "workers did not end within 60 s"
        assert sorted(p.read_text() for p in out.iterdir()) == [f"{value} True"] * 2


def sleep_long(rank: int, out: str) -> None:
    Path(out, f"{rank}.pid").write_text(str(os.getpid()))
    time.sleep(300)


def test_workers_end_with_a_killed_caller(tmp_path):
    """SIGKILL to the process that started them: its workers (children of the forkserver)
    are gone within seconds, as spawned ones would be."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time; from optireduce.experiments.workers import start_workers; "
            "from tests.test_workers import sleep_long; "
            "start_workers(sleep_long, (sys.argv[1],), 2); time.sleep(300)")  # fmt: skip
    caller = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline and caller.poll() is None, "workers did not start"
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "workers outlived their caller"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended
