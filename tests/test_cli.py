"""The `optireduce` command line: every subcommand's help, its outputs, its errors."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from optireduce.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "optireduce.cli", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("sub", ["", "demo", "bench", "simulate", "protocol"])
def test_help_of_every_subcommand(sub):
    r = run(*([sub] if sub else []), "--help")
    assert r.returncode == 0
    assert "usage: optireduce" in r.stdout
    if sub:
        assert sub in r.stdout.splitlines()[0]


def test_simulate_prints_lossless_stats(capsys):
    assert main(["simulate", "--workers", "3", "--elements", "5000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world"] == 3 and out["n"] == 5000
    assert out["lost_phase1"] == out["lost_phase2"] == 0
    assert max(out["rel_l2_error"]) <= 1e-4
    # every packet of every worker carried all 3 contributions
    # 5000 elements pad to 2 blocks = 32 packets, each seen by 3 workers
    assert out["contributor_hist"][3] == 3 * 32 and sum(out["contributor_hist"]) == 96


def test_simulate_reports_injected_loss(capsys):
    assert main(["simulate", "--workers", "4", "--elements", "40000", "--drop-rate", "0.05"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lost_phase1"] == out["injected_phase1"] > 0
    assert out["lost_phase2"] == out["injected_phase2"] > 0


def test_protocol_lua_is_the_shipped_dissector(capsys):
    assert main(["protocol", "--lua"]) == 0
    assert capsys.readouterr().out == (ROOT / "optireduce" / "ubt.lua").read_text()


def test_bad_arguments_exit_2_with_a_message():
    r = run("demo", "--loss", "0,2")
    assert r.returncode == 2 and "loss rates must be in [0, 1)" in r.stderr
    r = run("simulate", "--workers", "1")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run("simulate", "--elements", "0")
    assert r.returncode == 2 and "empty" in r.stderr


def test_demo_table_shows_the_transform_argument(tmp_path):
    png = tmp_path / "demo.png"
    r = run("demo", "--numerics", "--workers", "4", "--loss", "0,0.05", "--json", "--plot",
            str(png))  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout[r.stdout.index("[\n") :])
    by = {(row["config"], row["loss"]): row for row in rows}
    assert len(rows) == 6
    for cfg in ("RHT, unbiased decode", "RHT, plain decode", "no transform"):
        assert by[(cfg, 0.0)]["rel_l2"] <= 1e-4
        assert by[(cfg, 0.0)]["lost_phase1"] == by[(cfg, 0.0)]["lost_phase2"] == 0
        assert by[(cfg, 0.05)]["lost_phase2"] > 0
    # zeroed packets bias toward zero; the unbiased decode removes most of it
    unb, plain = by[("RHT, unbiased decode", 0.05)], by[("RHT, plain decode", 0.05)]
    assert plain["bias"] < 0 and abs(unb["bias"]) < abs(plain["bias"]) / 3
    # without the transform a lost reduced packet is a hole of zeros; with it, none
    holes = by[("no transform", 0.05)]["zeroed"]
    assert holes > 0.01 and unb["zeroed"] < holes / 20
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.deep  # a second compile of the native engine, 70-90 s beside the suite
def test_package_installs_as_a_wheel(tmp_path):
    """pip install . must carry optireduce.{hw,sim,host}, the dissector and the carry map."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    import zipfile

    (whl,) = tmp_path.glob("optireduce-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for f in (
        "optireduce/__init__.py", "optireduce/cli.py", "optireduce/params.py",
        "optireduce/hw/__init__.py", "optireduce/sim/__init__.py",
        "optireduce/host/model/nic_model.py", "optireduce/ubt.lua",
        "optireduce/sim/ecp5_carry_map.vmap",  # the 25F's bitstream build reads it
    ):  # fmt: skip
        assert f in names, f
    assert not any(n.startswith(("tests/", "hw/", "host/")) for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "optireduce = optireduce.cli:main" in zipfile.ZipFile(whl).read(entry).decode()


def fake_bench(quick: bool) -> dict:
    """A bench group for the registry test (the real ones take minutes)."""
    return {"quick": quick}


def test_bench_all_runs_the_groups_present_and_names_the_missing(tmp_path, monkeypatch, capsys):
    from optireduce import cli

    monkeypatch.setattr(cli, "BENCH_GROUPS", {
        "fake": ("tests.test_cli", "fake_bench"), "ghost": ("optireduce.sim.no_such", "f"),
    })  # fmt: skip
    path = tmp_path / "bench.json"
    assert main(["bench", "all", "--quick", "--json", "-o", str(path)]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out == json.loads(path.read_text())
    assert out["fake"] == {"quick": True} and "ghost" not in out
    assert out["groups"] == {"ran": ["fake"], "missing": ["ghost"]}
    assert "running fake; not present: ghost" in cap.err
    assert main(["bench", "ghost"]) == 2  # asked for by name: a clear error, no traceback
    assert "optireduce.sim.no_such is not installed" in capsys.readouterr().err


def _fake_demo(ratio: float, **runs) -> dict:
    """What train_demo returns, made up: gloo and optireduce rows plus `runs`."""
    curve = {"steps": [0, 5, 10], "times": [0.0, 0.5, 1.0], "acc": [0.1, 0.8, 0.95]}
    summ = {"tta_s": 1.0, "final_acc": 0.95, "entries_lost": 0.0, "op_p99_ms": 12.5}
    out = {"gloo": dict(summ, tta_s=2.0), "optireduce": dict(summ)}
    out.update({k: dict(summ, **v) if isinstance(v, dict) else v for k, v in runs.items()})
    out["ratios"] = {"tta_optireduce_over_gloo": ratio, "final_acc_gap_points": 0.0}
    out["settings"] = {"world": 4, "steps": 10, "straggler_median_ms": 20.0, "tail": 3.0,
                       "target_acc": 0.93}  # fmt: skip
    out["curves"] = {k: curve for k, v in out.items() if isinstance(v, dict) and "tta_s" in v}
    return out


def test_demo_table_falls_back_to_software_and_plots(tmp_path, monkeypatch, capsys):
    """The demo's rendering: the one-line co-simulation fallback, the table with n/a, the
    ratio against the target, the plot (the training itself: tests/test_train.py)."""
    from optireduce.experiments import demo

    fake = _fake_demo(0.5, optireduce={"entries_lost": 0.001})
    monkeypatch.setattr(demo, "train_demo", lambda cfg, rtl, progress=None: fake)
    monkeypatch.setattr(demo, "cosim_status", lambda cfg=None: (False, "no toolchain here"))
    png = tmp_path / "demo.png"
    assert main(["demo", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "co-simulated NIC: unavailable (no toolchain here); no RTL run" in text
    assert "n/a" in text and "0.100%" in text and "12.5 ms" in text
    assert "OptiReduce / gloo: 0.50 (target <= 0.6: met)" in text
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_demo_table_splits_the_entries_lost_by_cause(tmp_path, monkeypatch, capsys):
    """The optireduce row: the entries lost by the straggler, by the per-packet delay and by
    our processing (its worst step in brackets); gloo loses none: n/a."""
    from optireduce.experiments import demo

    split = {
        "entries_lost": 0.3, "entries_lost_straggler": 0.2712, "entries_lost_delay": 0.0034,
        "entries_lost_processing": 0.0254, "entries_lost_processing_max_step": 0.125,
    }  # fmt: skip
    fake = _fake_demo(0.5, optireduce=split)
    monkeypatch.setattr(demo, "train_demo", lambda cfg, rtl, progress=None: fake)
    monkeypatch.setattr(demo, "cosim_status", lambda cfg=None: (False, "no toolchain here"))
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["demo", "--plot", str(tmp_path / "d.png")]) == 0
    row = next(
        ln for ln in capsys.readouterr().out.splitlines() if "optireduce" in ln and "%" in ln
    )
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[5:9] == ["30.000%", "27.120%", "0.340%", "2.540% (12.50%)"]


def test_demo_table_has_the_rtl_run_with_its_bit_exactness(tmp_path, monkeypatch, capsys):
    """With the co-simulation usable, a third row: the run with rank 0's NIC the RTL, and
    its bit-exactness; the ratio stays the software run's against gloo."""
    from optireduce.experiments import demo

    fake = _fake_demo(0.4, **{demo.RTL: {"tta_s": 9.0, "cosim_bit_exact": False}})
    seen = {}

    def fake_train(cfg, rtl, progress=None):
        seen["rtl"] = rtl
        return fake

    monkeypatch.setattr(demo, "train_demo", fake_train)
    monkeypatch.setattr(demo, "cosim_status", lambda cfg=None: (True, "rank 0"))
    assert main(["demo", "--plot", str(tmp_path / "d.png")]) == 0
    text = capsys.readouterr().out
    assert seen["rtl"] is True
    assert "optireduce, rank 0 RTL" in text and "9.00 s" in text
    assert "NO" in text  # a mismatch is shown as such, never hidden
    assert "OptiReduce / gloo: 0.40 (target <= 0.6: met)" in text


def test_demo_reports_a_failed_rtl_run_and_keeps_the_software_table(tmp_path, monkeypatch, capsys):
    from optireduce.experiments import demo

    fake = _fake_demo(0.4, rtl_error="RuntimeError: harness died")
    monkeypatch.setattr(demo, "train_demo", lambda cfg, rtl, progress=None: fake)
    monkeypatch.setattr(demo, "cosim_status", lambda cfg=None: (True, "rank 0"))
    assert main(["demo", "--plot", str(tmp_path / "d.png")]) == 0
    text = capsys.readouterr().out
    assert "the RTL run failed (RuntimeError: harness died)" in text
    assert "rank 0 RTL" not in text and "OptiReduce / gloo: 0.40" in text


# A value other than the default for every NicParams field, valid together.
NIC_VALUES = {
    "n_max": 16, "p": 64, "b": 512, "c": 1024, "lanes": 2, "ops_in_flight": 3, "w_wire": 32,
    "headroom_bits": 5, "seed": 7, "rht": False, "estimator": "plain", "t_b_us": 5000,
    "t_c_init_us": 3000, "t_c_min_us": 10, "alpha_q8": 32, "last_percent": 2,
    "tc_gain_shift": 4, "tc_dev_shift": 3, "tc_dev_mult": 2, "tc_sample": "last_arrival",
    "udp_port": 4000, "job_id": 9,
    "exp_inband": True, "exp_lead": 5, "progress_ahead": True, "fwht_shared": True,
    "tick_bits": 24, "sdram_addr_bits": 20,
}  # fmt: skip


def _nic_argv(values: dict) -> list[str]:
    from optireduce.cli import PARAM_FLAGS

    argv = []
    for k, v in values.items():
        flag = PARAM_FLAGS.get(k, ("--" + k.replace("_", "-"),))[0]
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        else:
            argv += [flag, str(v)]
    return argv


def test_simulate_takes_every_nic_param_with_its_type():
    import dataclasses

    from optireduce.cli import build_parser, nic_params
    from optireduce.params import NicParams

    assert set(NIC_VALUES) == {f.name for f in dataclasses.fields(NicParams)}
    args = build_parser().parse_args(["simulate", *_nic_argv(NIC_VALUES)])
    got = nic_params(args)
    assert got == NicParams(**NIC_VALUES)
    for k, v in NIC_VALUES.items():
        assert type(getattr(got, k)) is type(v), k
    assert args.seed == 0  # the run's seed is not the sign PRNG key
    # no flag: the defaults; 'none' for the fields that may be None
    assert nic_params(build_parser().parse_args(["simulate"])) == NicParams()
    args = build_parser().parse_args(["simulate", "--headroom-bits", "4", "--t-c-init-us", "none"])
    assert nic_params(args) == NicParams(headroom_bits=4)


def test_simulate_help_lists_every_nic_param():
    import dataclasses

    from optireduce.params import NicParams

    text = run("simulate", "--help").stdout
    for f in dataclasses.fields(NicParams):
        flag = "--sign-seed" if f.name == "seed" else "--" + f.name.replace("_", "-")
        assert flag in text, flag
    assert "hard bound of one phase (default: 20000)" in text  # help from params.py


def test_experiments_take_their_nic_params_with_their_own_defaults():
    from optireduce.cli import build_parser, nic_fields
    from optireduce.experiments import cluster, loss_tolerance, train

    ap = build_parser()
    configs = {"cluster": (cluster, cluster.ClusterConfig()),
               "loss-tolerance": (loss_tolerance, loss_tolerance.LossToleranceConfig()),
               "train": (train, train.TrainConfig())}  # fmt: skip
    for sub, (mod, cfg) in configs.items():
        assert nic_fields(ap.parse_args([sub])) == {k: getattr(cfg, k) for k in mod.NIC_FIELDS}
        want = {k: NIC_VALUES[k] for k in mod.NIC_FIELDS}
        assert nic_fields(ap.parse_args([sub, *_nic_argv(want)])) == want, sub
    # the names these experiments always had
    args = ap.parse_args(["loss-tolerance", "--packet", "32", "--block", "256", "--chunk", "512"])
    assert nic_fields(args) == {"p": 32, "b": 256, "c": 512, "t_b_us": 2000}


def test_bad_nic_params_exit_2_with_the_field_named(capsys):
    assert main(["simulate", "--b", "100", "--elements", "10"]) == 2
    assert "NicParams.b=100: transform block must be a power of two" in capsys.readouterr().err
    r = run("simulate", "--p", "x")
    assert r.returncode == 2 and "invalid int value: 'x'" in r.stderr


def test_quick_from_the_environment_shrinks_every_sized_command(monkeypatch):
    """OPTIREDUCE_QUICK=1 is --quick everywhere, and it wins over the size flags given."""
    from optireduce import cli

    monkeypatch.setenv("OPTIREDUCE_QUICK", "1")

    def parsed(*argv: str) -> argparse.Namespace:
        args = cli.build_parser().parse_args(argv)
        cli.shrink(args)
        return args

    a = parsed("train", "--seeds", "0,1,2,3,4", "--steps", "150")
    assert (a.world, a.steps, a.seeds) == (2, 4, [0])
    a = parsed("cluster", "--ops", "100", "--sweep-workers", "16,8,32")
    assert (a.ops, a.warmup, a.bucket_kib, a.sweep_workers) == (5, 2, 64, [8])
    a = parsed("loss-tolerance")
    assert (a.workers, a.steps, a.seeds, a.losses) == (4, 4, [0], (0.0, 0.01))
    a = parsed("demo", "--steps", "150")
    assert (a.steps, a.no_cosim) == (4, True)
    assert parsed("simulate", "--elements", "100000").elements == 16_384
    assert parsed("bench", "model").quick
    sized = {n for n, sp in _subparsers(cli.build_parser()).items()
             if any("--quick" in a.option_strings for a in sp._actions)}  # fmt: skip
    assert sized == set(cli.QUICK)
    monkeypatch.setenv("OPTIREDUCE_QUICK", "0")
    a = parsed("train", "--steps", "150")
    assert (a.world, a.steps, a.quick) == (4, 150, False)


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_train_flags_apply_on_the_large_models_defaults():
    """--p with --model large is checked against the large model's b (16384), not the
    digits' (1024): 4096 divides 16384 and is taken, 3000 does not and names b=16384."""
    from optireduce.cli import build_parser, train_config

    ap = build_parser()
    cfg = train_config(ap.parse_args(["train", "--model", "large", "--p", "4096",
                                      "--c", "262144"]))  # fmt: skip
    assert (cfg.model, cfg.p, cfg.b, cfg.c) == ("large", 4096, 16384, 262144)
    assert cfg.steps == 150 and cfg.straggler_median_ms == 100.0  # the large defaults
    digits = train_config(ap.parse_args(["train", "--p", "512", "--ops-in-flight", "4"]))
    assert (digits.model, digits.p, digits.b) == ("digits", 512, 1024)
    assert digits.nic_params().ops_in_flight == 4  # K reaches the hook's NicParams
    with pytest.raises(ValueError, match=r"NicParams\.b=16384"):
        train_config(ap.parse_args(["train", "--model", "large", "--p", "3000"]))
