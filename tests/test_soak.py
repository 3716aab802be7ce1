"""The soak campaign, short: one training run under each fault, one `optireduce train`
interrupted by SIGINT, one mutated replay and one collective run under junk; the
report's zeros (docs/reliability.md, whose command line the first test runs).

About 2 minutes on 2 loaded cores (each training run spawns 3 processes)."""

from __future__ import annotations

import json

import pytest

from optireduce.experiments import faults, soak


def test_every_fault_ends_in_its_documented_outcome_without_hangs_loss_or_leaks(tmp_path):
    """docs/reliability.md's command line, quick (as the documented-commands test would run
    it): its report's zeros, and both files it promises."""
    import subprocess
    import sys

    report, png = tmp_path / "soak.json", tmp_path / "soak.png"
    cmd = [sys.executable, "-m", "optireduce.cli", "soak", "--runs", "200", "--minutes", "80",
           "--json", "-o", str(report), "--plot", str(png), "--quick"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert json.loads(report.read_text()) == out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    failed = json.dumps(out["failed_runs"], indent=1)[:4000]
    # every planned run ran: one per training fault, a sigint, a replay, a collective run
    assert out["runs"] == out["planned"] == len(soak.TRAIN_FAULTS) + 3, failed
    assert set(out["by_fault"]) == {*soak.TRAIN_FAULTS, "sigint", "replay", "collective/junk"}
    # a run whose engine was rebuilt under it (another `make install`) is reported as such
    assert out["unexplained_failures"] == 0, failed
    assert out["hangs"] == 0, failed
    assert out["entries_lost_unexplained"] == 0, failed
    assert out["leaks"] == 0, failed
    for kind, d in out["by_fault"].items():
        assert d["max_s"] <= d["bound_s"], f"{kind}: {d['max_s']} s > {d['bound_s']} s"


def test_a_leak_is_seen(tmp_path):
    """The leak check finds what a run leaves: a process carrying the run's mark, a
    socket of ours, a folder in the run's TMPDIR."""
    import os
    import socket
    import subprocess
    import sys

    before = soak.Baseline.now()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "optireduce-train-x").mkdir()
    env = {**os.environ, soak.MARK: "leaktest"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        found = soak.leaks(before, "leaktest", tmp, grace_s=0.5)
    finally:
        proc.kill()
        proc.wait()
        sock.close()
    assert [p.split()[0] for p in found["processes"]] == [str(proc.pid)]
    assert len(found["sockets"]) == 1
    assert found["tmp"] == ["optireduce-train-x"]
    assert soak.leaks(before, "leaktest", tmp_path / "none", grace_s=0.5) == {}


def test_malformed_junk_is_dropped_and_counted_by_the_model():
    """Every datagram the junk sender makes for a data socket is dropped by the NIC and
    counted under one of the reasons the campaign sums (soak.JUNK_REASONS)."""
    import numpy as np

    from optireduce.host.model.nic_model import NicModel
    from optireduce.params import NicParams

    rng = np.random.default_rng(0)
    nic = NicModel(NicParams(), 0, 3)
    for k in range(1, 201):
        nic.receive_datagram(k, faults.malformed_ubt(rng, sender=1, world=3, job_id=1))
        assert sum(nic.counters.get(r, 0) for r in soak.JUNK_REASONS) == k
    assert nic.counters["rx_scatter"] == nic.counters["rx_gather"] == 0


@pytest.mark.parametrize("fault", ["kill", "nonsense"])
def test_config_checks(fault):
    if fault == "nonsense":
        with pytest.raises(ValueError, match="faults"):
            soak.SoakConfig(faults=("nonsense",))
    else:
        assert soak.schedule(soak.quick_config())[:2] == [("train", "none"), ("train", fault)]


def _soak_ranks(soak_pid: int) -> set[int]:
    """Processes the runs of the soak `soak_pid` started (their environment carries a run's
    mark, "{soak pid}-{run}"; another test's soak beside this one has marks of its own)."""
    import os
    from pathlib import Path

    needle = f"{soak.MARK}={soak_pid}-".encode()
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes():
                    out.add(int(d.name))
            except OSError:
                pass
    return out


def test_sigint_to_the_soak_alone_leaves_no_rank_behind():
    """`kill -INT` of the soak's own process (not a terminal's whole group) mid-run: it
    exits with 130 within a bound and no rank of its run outlives it."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-c", "from optireduce.cli import main; raise SystemExit(main())",
           "soak", "--runs", "1", "--minutes", "2"]  # fmt: skip
    # SIGINT at its default even when this test runs in a background job
    proc = subprocess.Popen(soak.ctrl_c_reaches(cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _soak_ranks(proc.pid) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        assert _soak_ranks(proc.pid), "no rank of the soak's run started within 120 s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    end = time.monotonic() + 10
    while _soak_ranks(proc.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _soak_ranks(proc.pid), "ranks outlived the soak"


def test_a_failed_runs_folder_is_kept_when_asked(tmp_path, monkeypatch):
    """A run that fails leaves its folder (without its scratch tmp/) under keep_failed,
    named in the report; without keep_failed nothing is kept."""

    def broken(cfg, rep):
        raise RuntimeError("replay broke")

    monkeypatch.setattr(soak, "_replay_run", broken)
    keep = tmp_path / "kept"
    for where in (None, str(keep)):
        base = tmp_path / f"base-{where is None}"
        base.mkdir()
        rep = soak.run_one(soak.SoakConfig(keep_failed=where), 7, "replay", "none", base)
        assert not rep.ok and "replay broke" in rep.detail
        assert list(base.iterdir()) == []  # the run's own folder is gone either way
        if where is None:
            assert "kept" not in rep.facts and not keep.exists()
        else:
            (kept,) = keep.iterdir()
            assert rep.facts["kept"] == str(kept) and kept.name.startswith("run7-")
            assert not (kept / "tmp").exists()


def test_the_sigint_bound_counts_from_the_signal():
    """A sigint run's bound is on its exit after SIGINT, not on its start-up: the summary's
    longest run is the time since the signal where a run has one."""
    reports = [soak.RunReport(0, "sigint", "sigint", wall_s=50.0, bound_s=30.0, bounded_s=4.0),
               soak.RunReport(1, "train", "none", wall_s=12.0, bound_s=90.0)]  # fmt: skip
    out = soak.summarize(soak.quick_config(), reports, 62.0, 2)
    assert out["by_fault"]["sigint"]["max_s"] == 4.0
    assert out["by_fault"]["none"]["max_s"] == 12.0
