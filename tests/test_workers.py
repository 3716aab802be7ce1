"""experiments/workers.py: workers forked from the preloaded server see this process's
environment as it is when they start, not the server's."""

from __future__ import annotations

import os
import time
from pathlib import Path

from optireduce.experiments.workers import start_workers

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
