"""The `optireduce` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Sequence

from optireduce.params import NicParams

# NicParams fields on the command line: --field-name, but for these. p, b and c keep the
# names the experiments always had; --seed is each subcommand's run seed, so the sign
# PRNG key is --sign-seed.
PARAM_FLAGS = {
    "p": ("--p", "--packet"), "b": ("--b", "--block"), "c": ("--c", "--chunk"),
    "seed": ("--sign-seed",),
}  # fmt: skip


def _field_docs(cls: type) -> dict[str, str]:
    """The comment that follows each field in the class's source: its help text."""
    import inspect
    import io
    import textwrap
    import tokenize

    names = {f.name for f in dataclasses.fields(cls)}
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    first: dict[int, str] = {}  # line -> its first name
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        row = tok.start[0]
        if tok.type == tokenize.NAME and row not in first:
            first[row] = tok.string
            if tok.string == "def":
                break  # the fields are above the methods
        elif tok.type == tokenize.COMMENT and first.get(row) in names:
            docs[first[row]] = tok.string.lstrip("#").strip()
    return docs


def _int_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer or 'none'") from None


def add_nic_params(
    parser: argparse.ArgumentParser, defaults: NicParams, only: Sequence[str] | None = None
) -> None:
    """One flag per NicParams field (of `only`, if given), typed as the field, defaulting to
    `defaults`; nic_params(args) reads them back. Help: the field's comment in params.py."""
    docs = _field_docs(NicParams)
    hints = typing.get_type_hints(NicParams)
    group = parser.add_argument_group("NIC parameters (NicParams)")
    fields = [f for f in dataclasses.fields(NicParams) if only is None or f.name in only]
    for f in fields:
        flags = PARAM_FLAGS.get(f.name, ("--" + f.name.replace("_", "-"),))
        default = getattr(defaults, f.name)
        help_ = f"{docs.get(f.name) or 'NicParams.' + f.name} (default: {default})"
        hint = hints[f.name]
        kw: dict = {"dest": "nic_" + f.name, "default": default, "help": help_}
        if hint is bool:
            kw.update(action=argparse.BooleanOptionalAction)
        elif hint in (int, str):
            kw.update(type=hint, metavar=hint.__name__.upper())
        elif hint == (int | None):
            kw.update(type=_int_or_none, metavar="INT|none")
        else:
            raise TypeError(f"add_nic_params: no command-line type for {f.name}: {hint}")
        group.add_argument(*flags, **kw)
    parser.set_defaults(nic_defaults=defaults, nic_fields=tuple(f.name for f in fields))


def nic_params(args: argparse.Namespace) -> NicParams:
    """The NicParams of add_nic_params's flags (validated: a bad value is a ValueError)."""
    return args.nic_defaults.replace(**{k: getattr(args, "nic_" + k) for k in args.nic_fields})


def nic_fields(args: argparse.Namespace) -> dict[str, object]:
    """The offered fields of nic_params(args), for a config that carries them by name."""
    q = nic_params(args)
    return {k: getattr(q, k) for k in args.nic_fields}


def _losses(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if not all(0.0 <= v < 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: loss rates must be in [0, 1)")
    return vals


def cmd_demo(args: argparse.Namespace) -> int:
    if args.numerics:
        return _demo_numerics(args)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from optireduce.experiments.demo import RTL, cosim_status, demo_config, rtl_config, train_demo
    from optireduce.experiments.train import plot as plot_train

    cfg = demo_config(steps=args.steps, seed=args.seed)
    if args.quick:
        cfg = dataclasses.replace(cfg, world=2)
    console = Console(width=max(Console().width, 110))
    with console.status("co-simulated NIC: checking (a first run builds it: minutes)"):
        usable, why = (False, "--no-cosim") if args.no_cosim else cosim_status(rtl_config(cfg))
    console.print(
        f"[bold]OptiReduce demo[/]: {cfg.world} processes on loopback train an MLP on "
        f"sklearn's digits to {cfg.target_acc:.0%}, with gloo and with OptiReduce, under the "
        f"same tail (one straggler per step, median {cfg.straggler_median_ms:g} ms, "
        f"P99/P50 {cfg.tail:g}; per-packet delay median {cfg.packet_median_us:g} us)"
    )
    if usable:
        console.print("co-simulated NIC: a third run, rank 0's NIC the Verilated RTL")
    else:
        console.print(f"co-simulated NIC: unavailable ({why}); no RTL run")
    runs = [*cfg.methods, *([RTL] if usable else [])]
    with Progress(console=console, transient=True) as prog:
        tasks = {m: prog.add_task(f"{m:>14}", total=cfg.steps) for m in runs}
        out = train_demo(cfg, usable, progress=lambda m, s: prog.update(tasks[m], completed=s))
    table = Table(title=f"time to {cfg.target_acc:.0%} test accuracy under the same tail")
    cols = ("method", "backend", "time to accuracy", "final acc.", "P99 op latency",
            "entries lost", "straggler (by design)", "packet delay (by design)",
            "our processing (worst step)",
            "RTL check op bit-exact")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "method" else "right",
                         no_wrap=col == "method")  # fmt: skip
    if "rtl_error" in out:
        console.print(f"co-simulated NIC: the RTL run failed ({out['rtl_error']})")
    runs = [m for m in runs if m in out]
    for m in runs:
        r = out[m]
        tta = "not reached" if r["tta_s"] is None else f"{r['tta_s']:.2f} s"
        exact = r.get("cosim_bit_exact")
        name = "optireduce, rank 0 RTL" if m == RTL else m
        backends = ",".join(sorted(set(r.get("backends", ["gloo"]))))
        split = r.get("entries_lost_processing") is not None
        table.add_row(name, backends, tta, f"{r['final_acc']:.2%}", f"{r['op_p99_ms']:.1f} ms",
                      f"{r['entries_lost']:.3%}",
                      f"{r['entries_lost_straggler']:.3%}" if split else "n/a",
                      f"{r['entries_lost_delay']:.3%}" if split else "n/a",
                      f"{r['entries_lost_processing']:.3%} "
                      f"({r['entries_lost_processing_max_step']:.2%})" if split else "n/a",
                      "n/a" if exact is None else ("yes" if exact else "NO"))  # fmt: skip
    console.print(table)
    if RTL in out and out[RTL].get("cosim_bit_exact") is None:
        console.print("co-simulated NIC: rank 0 fell back to software (see the log line above)")
    ratio = out["ratios"]["tta_optireduce_over_gloo"]
    gap = out["ratios"]["final_acc_gap_points"]
    if ratio is not None:
        met = "met" if ratio <= 0.6 else "not met"
        console.print(f"time to accuracy, OptiReduce / gloo: {ratio:.2f} (target <= 0.6: {met})")
    console.print(f"final accuracy, gloo - OptiReduce: {gap:+.2f} points (target <= 0.5)")
    if RTL in out:
        console.print(
            "the RTL run shares the 2 cores with a simulator ~100x slower than a NIC: its "
            "times are the simulator's. Its last column is one lossless check op before "
            "training, compared bit for bit with the model; the training ops are not compared"
        )
    if args.plot:
        plot_train(out, out["curves"], args.plot)
        console.print(f"accuracy vs wall time plotted to [bold]{args.plot}[/]")
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if k != "curves"}, indent=2))
    return 0


def _demo_numerics(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from optireduce.experiments.demo import CONFIGS, plot, run_demo

    console = Console(width=max(Console().width, 110))
    console.print(
        f"[bold]OptiReduce model[/]: {args.workers} workers, a {len(args.loss)}-level loss sweep, "
        "software NICs on a virtual network (no board needed)"
    )
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("simulating", total=len(CONFIGS) * len(args.loss))
        rows, layer_err = run_demo(
            args.workers, args.loss, args.seed, progress=lambda: prog.advance(task)
        )
    table = Table(title="AllReduce error vs the float64 mean (mean over workers)")
    cols = ("datapath", "loss", "rel. L2 err", "bias", "worst layer err", "holes", "lost p1/p2")
    for col in cols:
        table.add_column(col, justify="left" if col == "datapath" else "right")
    for r in rows:
        table.add_row(
            r.config, f"{r.loss:.0%}", f"{r.rel_l2:.1e}", f"{r.bias:+.1e}",
            f"{r.worst_layer:.1e} {r.worst_layer_name}", f"{r.zeroed:.2%}",
            f"{r.lost_phase1}/{r.lost_phase2}",
        )  # fmt: skip
    console.print(table)
    console.print(
        "holes: elements decoded as exactly 0 where the mean is above 1% of its layer's rms "
        "(a lost packet's span). "
        "With the transform a loss is spread, unbiased noise instead."
    )
    if args.plot:
        plot(layer_err, args.loss, args.plot)
        console.print(f"per-layer errors plotted to [bold]{args.plot}[/]")
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


# `optireduce bench GROUP`: name -> (module, function). `all` runs every group whose
# module is installed and says which ran; a group's function takes whichever of
# quick/area/progress it declares.
BENCH_GROUPS: dict[str, tuple[str, str]] = {
    "model": ("optireduce.experiments.bench_model", "bench_model"),
    "rtl": ("optireduce.experiments.bench_rtl", "bench_rtl"),
    "collective": ("optireduce.experiments.bench_collective", "bench_collective"),
    "cosim": ("optireduce.experiments.bench_cosim", "bench_cosim"),
    "fpga": ("optireduce.experiments.bench_fpga", "bench_fpga"),
    "sdram": ("optireduce.experiments.bench_sdram", "bench_sdram"),
}


# --quick, or OPTIREDUCE_QUICK=1 in the environment: every command at smoke size, whatever its size
# flags say, so that each documented command line runs as written in seconds (the test of the
# documented commands does this). What it shrinks, per command:
QUICK = {
    "demo": "2 processes, 4 steps, no co-simulated run; --numerics: 4 workers",
    "train": "2 processes, 4 steps, the first seed of --seeds; --model large: width 256",
    "simulate": "at most 16384 elements",
    "cluster": "5 ops after 2 warm-up ops, 64 KiB buckets, the smallest world of --sweep-workers",
    "loss-tolerance": "4 workers, 4 steps, the first seed, the first two loss rates",
    "bench": "smaller sizes; rtl: three blocks, no synthesis; sdram: one clock, 2048 words; "
    "all: no fpga (bitstreams)",
    "soak": "one training run per fault, one sigint, one replay and one collective run (2 min)",
}
QUICK_ENV = "OPTIREDUCE_QUICK"


def _quick(ap: argparse.ArgumentParser, what: str) -> None:
    import os

    on = os.environ.get(QUICK_ENV, "") not in ("", "0")
    ap.add_argument("--quick", action="store_true", default=on,
                    help=f"a smoke run: {what} (also {QUICK_ENV}=1)")  # fmt: skip


def shrink(args: argparse.Namespace) -> None:
    """Apply --quick (QUICK[args.cmd]) to the parsed sizes."""
    if not getattr(args, "quick", False):
        return
    if args.cmd == "demo":
        args.steps, args.no_cosim, args.workers = min(args.steps, 4), True, min(args.workers, 4)
    elif args.cmd == "train":
        args.world, args.steps = 2, min(args.steps, 4)
        args.seeds = args.seeds[:1] if args.seeds else args.seeds
    elif args.cmd == "simulate":
        args.elements = min(args.elements, 16_384)
    elif args.cmd == "cluster":
        args.ops, args.warmup, args.bucket_kib = min(args.ops, 5), min(args.warmup, 2), 64
        args.sweep_workers = [min(args.sweep_workers)] if args.sweep_workers else None
    elif args.cmd == "loss-tolerance":
        args.workers, args.steps = min(args.workers, 4), min(args.steps, 4)
        args.seeds, args.losses = args.seeds[:1], args.losses[:2]


def _bench_group(name: str, args: argparse.Namespace) -> dict:
    import importlib
    import inspect

    from rich.console import Console

    module, func = BENCH_GROUPS[name]
    fn = getattr(importlib.import_module(module), func)
    with Console(stderr=True).status(f"bench {name}") as status:
        offer = {
            "quick": args.quick,
            "area": not (args.no_area or args.quick),
            "progress": lambda n: status.update(f"bench {name}: {n}"),
        }
        accepted = inspect.signature(fn).parameters
        return fn(**{k: v for k, v in offer.items() if k in accepted})


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib.util

    def present(name: str) -> bool:
        return importlib.util.find_spec(BENCH_GROUPS[name][0]) is not None

    if args.what != "all":
        if not present(args.what):
            raise ValueError(f"bench {args.what}: {BENCH_GROUPS[args.what][0]} is not installed")
        out = _bench_group(args.what, args)
    else:
        missing = [g for g in BENCH_GROUPS if not present(g)]
        slow = [g for g in BENCH_GROUPS if args.quick and g == "fpga" and g not in missing]
        ran = [g for g in BENCH_GROUPS if g not in missing + slow]
        print(f"bench all: running {', '.join(ran)}"
              + (f"; not present: {', '.join(missing)}" if missing else "")
              + (f"; not run (--quick): {', '.join(slow)}" if slow else ""),
              file=sys.stderr)  # fmt: skip
        out = {g: _bench_group(g, args) for g in ran}
        out["groups"] = {"ran": ran, "missing": missing}
    if args.output:
        from pathlib import Path

        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
        print(f"bench: written to {args.output}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from rich.console import Console
        from rich.pretty import Pretty

        Console().print(Pretty(out))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from optireduce import simulate_allreduce

    rng = np.random.default_rng(args.seed)
    xs = [rng.standard_normal(args.elements).astype(np.float32) for _ in range(args.workers)]
    outs, st = simulate_allreduce(xs, params=nic_params(args), drop_rate=args.drop_rate,
                                  seed=args.seed)  # fmt: skip
    ref = np.mean([x.astype(np.float64) for x in xs], axis=0)
    summary = st.summary()
    summary["rel_l2_error"] = [float(np.linalg.norm(o - ref) / np.linalg.norm(ref)) for o in outs]
    print(json.dumps(summary, indent=2))
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    import os

    from optireduce.experiments.cluster import (
        ALGOS,
        ClusterConfig,
        link_spec,
        run_cluster,
        summarize,
    )

    algos = tuple(args.algos.split(",")) if args.algos else ALGOS
    for a in algos:
        if a not in ALGOS:
            raise ValueError(f"--algos: {a!r} is not one of {','.join(ALGOS)}")
    link = link_spec(args.tail, args.median_us, args.loss, args.gbps)
    jobs = args.jobs or os.cpu_count() or 1

    def config(workers: int) -> ClusterConfig:
        return ClusterConfig(
            workers=workers, link=link, ops=args.ops, bucket_bytes=args.bucket_kib * 1024,
            warmup=args.warmup, compute_us=args.compute_us, rto_us=args.rto_us, seed=args.seed,
            exponents=args.exponents, **nic_fields(args),
        )  # fmt: skip

    if args.sweep_workers:
        from optireduce.experiments.cluster_plots import plot_sweep

        sweep = {}
        for n in args.sweep_workers:
            print(f"cluster: {n} workers, tail {args.tail}", file=sys.stderr)
            cfg = config(n)
            sweep[n] = summarize(cfg, run_cluster(cfg, algos, jobs))
        p99 = {n: {a: s[a]["p99_ms"] for a in algos} for n, s in sweep.items()}
        plot_sweep(p99, args.sweep_plot, f"P99 vs world size, tail {link.name}")
        print(f"cluster: P99 vs world size plotted to {args.sweep_plot}", file=sys.stderr)
        out = {"sweep": {str(n): s for n, s in sweep.items()}}
    else:
        cfg = config(args.workers)
        res = run_cluster(cfg, algos, jobs)
        out = summarize(cfg, res)
        if args.plot:
            from optireduce.experiments.cluster_plots import plot_cdfs

            title = f"{cfg.workers} workers, {link.name}, median {link.median_us:g} us"
            plot_cdfs({a: r.latency_us for a, r in res.items()}, args.plot, title)
            print(f"cluster: latency CDFs plotted to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        rows = out["sweep"] if "sweep" in out else {str(args.workers): out}
        table = Table(title=f"cluster simulator, tail {link.name}")
        for col in ("workers", "algorithm", "p50 ms", "p99 ms", "entries lost"):
            table.add_column(col, justify="right")
        for n, s in rows.items():
            for a in algos:
                table.add_row(n, a, f"{s[a]['p50_ms']:.3f}", f"{s[a]['p99_ms']:.3f}",
                              f"{s[a]['entries_lost']:.4%}")  # fmt: skip
        Console().print(table)
        for n, s in rows.items():
            if "ratios" in s:
                print(f"{n} workers: ratios {json.dumps(s['ratios'])}")
    return 0


def cmd_loss_tolerance(args: argparse.Namespace) -> int:
    import time

    from optireduce.experiments.loss_tolerance import LossToleranceConfig, plot, run_all, summarize

    if args.steps < 2 or args.workers < 2 or not args.seeds:
        raise ValueError("loss-tolerance: need --steps >= 2, --workers >= 2 and a seed")
    cfg = LossToleranceConfig(
        workers=args.workers, steps=args.steps, batch=args.batch, lr=args.lr,
        seeds=tuple(args.seeds), losses=args.losses, **nic_fields(args),
    )  # fmt: skip
    total = len(cfg.seeds) * (1 + 2 * len(cfg.losses))
    done = 0
    t0 = time.monotonic()

    def progress(r: object) -> None:
        nonlocal done
        done += 1
        print(f"loss-tolerance: {done}/{total} runs, {time.monotonic() - t0:.0f} s",
              file=sys.stderr)  # fmt: skip

    out = summarize(cfg, run_all(cfg, args.jobs, progress))
    out["settings"]["wall_s"] = round(time.monotonic() - t0, 1)
    if args.plot:
        plot(out, args.plot)
        print(f"loss-tolerance: accuracy vs loss plotted to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"final test accuracy (reference {out['reference_acc']:.2%})")
        for col in ("loss", "rht: worker 0", "rht: mean", "rht: diverg.", "no_rht: worker 0",
                    "no_rht: mean", "no_rht: diverg."):  # fmt: skip
            table.add_column(col, justify="right")
        for loss in out["rht"]:
            a, b = out["rht"][loss], out["no_rht"][loss]
            table.add_row(f"{float(loss):.0%}", f"{a['final_acc']:.2%}",
                          f"{a['mean_worker_acc']:.2%}", f"{a['divergence']:.1e}",
                          f"{b['final_acc']:.2%}", f"{b['mean_worker_acc']:.2%}",
                          f"{b['divergence']:.1e}")  # fmt: skip
        Console().print(table)
    return 0


def train_config(args: argparse.Namespace):
    """The TrainConfig of `optireduce train`'s flags: on the digits defaults, or with
    --model large on the large model's (a flag left at its digits default takes the
    large default). Its NicParams are checked: a bad combination is a ValueError now."""
    from dataclasses import replace

    from optireduce.experiments.train import TrainConfig, large_config

    given = dict(
        world=args.world, steps=args.steps, target_acc=args.target, seed=args.seed,
        tail=args.tail, straggler_median_ms=args.straggler_ms,
        packet_median_us=args.packet_delay_us, schedule=args.schedule,
        methods=tuple(args.methods.split(",")), cluster=args.cluster,
        boards=tuple(args.boards or ()),
        **{k: getattr(args, "nic_" + k) for k in args.nic_fields},
    )  # fmt: skip
    if args.model == "large":
        digits = TrainConfig()
        cfg = replace(large_config(), **{k: v for k, v in given.items()
                                         if v != getattr(digits, k)})  # fmt: skip
        if args.quick:
            cfg = replace(cfg, large_width=256)  # the plumbing, not the size
    else:
        cfg = TrainConfig(**given)
    cfg.nic_params()
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    from optireduce.experiments.train import run_seeds, run_train, write_outputs

    cfg = train_config(args)
    seeds = args.seeds or [args.seed]
    err = Console(stderr=True)
    work = str(Path(args.output) / "raw")
    with Progress(console=err, transient=True) as prog:
        tasks = {m: prog.add_task(f"{m}: {cfg.world} processes", total=cfg.steps * len(seeds))
                 for m in cfg.methods}  # fmt: skip

        def tick(m: str, s: int) -> None:
            prog.update(tasks[m], completed=s)

        if args.seeds:
            out, curves = run_seeds(cfg, seeds, work, tick)
        else:
            out, curves = run_train(cfg, work=work, progress=tick)
    js, png = write_outputs(out, curves, args.output)
    err.print(f"train: {js} and accuracy vs wall time in {png}")
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if k not in ("settings", "per_seed")},
                         indent=2))  # fmt: skip
    else:
        from rich.table import Table

        over = f", mean of {len(seeds)} seeds" if args.seeds else ""
        table = Table(title=f"time to {cfg.target_acc:.0%} test accuracy, same injected tail{over}")
        for col in ("method", "time to accuracy", "final acc.", "entries lost", "step"):
            table.add_column(col, justify="right")
        for m in cfg.methods:
            r = out[m]
            tta = "not reached" if r["tta_s"] is None else f"{r['tta_s']:.2f} s"
            table.add_row(m, tta, f"{r['final_acc']:.2%}", f"{r['entries_lost']:.3%}",
                          f"{r['step_ms']:.1f} ms")  # fmt: skip
        Console().print(table)
        if "ratios" in out:
            print(f"ratios: {json.dumps(out['ratios'])}")
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from optireduce.experiments.soak import SoakConfig, plot, quick_config, run_soak

    # a failed run's folder is kept beside the report (-o), for whoever looks into it
    keep = f"{args.output}.failed" if args.output else None
    cfg = SoakConfig(runs=args.runs, minutes=args.minutes, seed=args.seed, keep_failed=keep)
    if args.quick:
        cfg = quick_config(cfg)
    err = Console(stderr=True)
    cols = (TextColumn("soak"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"))  # fmt: skip
    with Progress(*cols, console=err, transient=True) as prog:
        task = prog.add_task("", total=None)
        failed = [0]

        def tick(rep, planned: int) -> None:
            failed[0] += not rep.ok
            if not rep.ok:
                err.print(
                    f"run {rep.run} {rep.piece}/{rep.fault}: {rep.cause}: {rep.detail}"
                    + (f" (kept: {rep.facts['kept']})" if "kept" in rep.facts else "")
                )
            prog.update(task, advance=1, total=planned,
                        description=f"{rep.piece}/{rep.fault} {rep.wall_s:.1f} s, "
                        f"{failed[0]} failed")  # fmt: skip

        out = run_soak(cfg, tick)
    out["command"] = (f"optireduce soak --runs {args.runs} --minutes {args.minutes:g} --seed "
                      f"{args.seed}" + " --quick" * args.quick)  # fmt: skip
    if args.plot:
        plot(out, args.plot)
        err.print(f"soak: outcomes per fault kind plotted to {args.plot}")
    if args.output:
        from pathlib import Path

        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"soak: {out['runs']} runs in {out['wall_s'] / 60:.1f} min")
        for col in ("fault", "runs", "documented outcome", "failed", "longest", "bound"):
            table.add_column(col, justify="left" if col == "fault" else "right")
        for k, d in out["by_fault"].items():
            table.add_row(k, str(d["runs"]), str(d["ok"]), str(d["failed"]),
                          f"{d['max_s']:.1f} s", f"{d['bound_s']:.0f} s")  # fmt: skip
        Console().print(table)
        print(f"failures {out['failures']} {out['failures_by_cause']}, hangs {out['hangs']}, "
              f"entries lost unexplained {out['entries_lost_unexplained']}, "
              f"runs with leaks {out['leaks']} {out['leaks_by_kind']}")  # fmt: skip
    # a run that failed because someone rebuilt the native engine under it is reported,
    # not charged to the product
    return 1 if out["unexplained_failures"] or out["entries_lost_unexplained"] else 0


def cmd_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from optireduce.sim.bitstream import build_bitstream, core_by_name, timing_met

    err = Console(stderr=True)
    with err.status(f"bitstream {args.board}") as status:
        res = build_bitstream(args.board, core=core_by_name(args.core), sdram=args.sdram,
                              progress=status.update)  # fmt: skip
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        if not res["fits"]:
            print(f"{args.board}: the design does not fit {res['device']} (no timing)")
        for dom, f in res["fmax_mhz"].items():
            print(f"{dom:>10}: Fmax {f:7.2f} MHz (target {res['target_mhz'].get(dom, 0):.2f})")
            if cp := res.get("critical_path", {}).get(dom):
                print(f"{'':>12}worst path {cp['ns']} ns: {cp['from']} -> {cp['to']}")
        cap = res["capacity"]
        for k in ("luts", "ffs", "brams", "dsps"):
            print(f"{k:>10}: {res[k]} of {cap[k]}")
        print(f"bitstream: {res['bitstream']}")
    return 0 if timing_met(res) else 1


def cmd_board_detect(args: argparse.Namespace) -> int:
    from optireduce.host.board_nic import detect, interfaces

    names = [n for n in (args.ifname or "").split(",") if n] or interfaces()
    errors: dict[str, str] = {}
    found = detect(names, timeout_s=args.timeout, errors=errors)
    for reason in errors.values():
        print(f"optireduce board detect: {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps([{"ifname": b.ifname, "version": b.version, "params": b.params}
                          for b in found], indent=2))  # fmt: skip
    else:
        for b in found:
            print(b.describe())
        if not found:
            print(f"no optireduce NIC answered on {', '.join(names) or 'any interface'} "
                  f"within {args.timeout} s (is the board programmed and cabled?)")  # fmt: skip
    return 0 if found else 1


def cmd_board_program(args: argparse.Namespace) -> int:
    from rich.console import Console

    from optireduce.sim.program import program

    with Console(stderr=True).status(f"programming the {args.board}"):
        res = program(args.board, args.bitstream, flash=args.flash)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        where = "flash" if args.flash else "SRAM"
        print(f"{args.board}: {res['bitstream']} loaded into {where}")
    return 0


def cmd_board_virtual(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from optireduce.sim.cosim_build import board_harness_path

    with Console(stderr=True).status("building the virtual board (cached after the first time)"):
        exe = board_harness_path(nic_params(args))
    cmd = [str(exe), "--host", args.host, "--net", args.net]
    if args.pcap:
        cmd += ["--pcap", args.pcap]
    os.execv(cmd[0], cmd)  # until Ctrl-C; it prints its figures as it ends
    return 1


def cmd_protocol(args: argparse.Namespace) -> int:
    from optireduce.ubt_lua import lua_dissector

    if args.lua:
        sys.stdout.write(lua_dissector())
    else:
        from optireduce import ubt

        for f in ubt.FIELDS:
            off, size = ubt.FIELD_OFFSETS[f.name]
            print(f"{off:2d} {size} {f.name:<13} {f.doc}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from optireduce.sim.trace import make_trace, write_pcap

    frames = make_trace(args.scenario, args.seed)
    write_pcap(args.output, frames)
    print(f"{args.output}: {len(frames)} frames, scenario {args.scenario}, seed {args.seed}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from optireduce.host.native.engine import NativeError, NativeNicModel
    from optireduce.sim.replay import ReplayError, replay
    from optireduce.sim.trace import read_pcap, write_pcap

    backend = NativeNicModel if args.backend == "native" else args.backend
    try:
        frames = read_pcap(args.trace)
        res = replay(frames, backend=backend)
    except (OSError, ValueError, ReplayError, NativeError) as e:
        print(f"optireduce replay: {e}", file=sys.stderr)
        return 2
    if args.output:
        write_pcap(args.output, res.frames)
    if args.json:
        print(json.dumps(res.summary(), indent=2))
    else:
        nonzero = {k: v for k, v in res.counters.items() if v}
        print(f"{len(res.frames)} frames out, {len(res.results)} ops completed; {nonzero}")
    return 0


def _workers(ap: argparse.ArgumentParser) -> None:
    """--workers N of the simulated clusters: 2 up to the default NicParams.n_max."""
    ap.add_argument("--workers", type=int, default=8, choices=range(2, NicParams().n_max + 1),
                    metavar="N")  # fmt: skip


def _jobs(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--jobs", type=int, default=0, help="processes (default: all cores)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="optireduce", description="OptiReduce SmartNIC offload: model, simulation, benches"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="training under tail: OptiReduce vs gloo (--numerics: the "
                       "AllReduce error with and without the transform)")  # fmt: skip
    d.add_argument("--numerics", action="store_true", help="the error table of the transform")
    d.add_argument("--steps", type=int, default=120, help="training steps of each method")
    d.add_argument("--no-cosim", action="store_true", help="every rank software")
    _workers(d)
    d.add_argument("--loss", type=_losses, default=(0.0, 0.01, 0.05), help="e.g. 0,0.01,0.05")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--plot", default="optireduce-demo.png", help="PNG path ('' for none)")
    d.add_argument("--json", action="store_true", help="also print the rows as JSON")
    _quick(d, QUICK["demo"])
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="benchmarks, as ratios against baselines in the same run")
    b.add_argument("what", choices=(*BENCH_GROUPS, "all"), help="which figures")
    b.add_argument("-o", "--output", default="", help="also write the JSON to this file")
    b.add_argument("--json", action="store_true", help="print JSON")
    _quick(b, QUICK["bench"])
    b.add_argument("--no-area", action="store_true", help="rtl: skip yosys synthesis")
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("simulate", help="one AllReduce of random data on the virtual cluster")
    _workers(s)
    s.add_argument("--elements", type=int, default=100_000)
    s.add_argument("--drop-rate", type=float, default=0.0)
    s.add_argument("--seed", type=int, default=0)
    add_nic_params(s, NicParams())
    _quick(s, QUICK["simulate"])
    s.set_defaults(func=cmd_simulate)

    from optireduce.sim.trace import SCENARIOS

    t = sub.add_parser("trace", help="make pcap traces of test scenarios")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    tm = tsub.add_parser("make", help="write one scenario's trace")
    tm.add_argument("--scenario", required=True, choices=SCENARIOS)
    tm.add_argument("--seed", type=int, default=0)
    tm.add_argument("-o", "--output", required=True, help="pcap file to write")
    tm.set_defaults(func=cmd_trace)

    r = sub.add_parser("replay", help="feed a trace to a NIC backend")
    r.add_argument("trace", help="pcap or pcapng file")
    r.add_argument("--backend", default="model", choices=("model", "native", "rtl"))
    r.add_argument("-o", "--output", help="pcap of the NIC's output frames")
    r.add_argument("--json", action="store_true", help="print the counters as JSON")
    r.set_defaults(func=cmd_replay)

    def _sizes(text: str) -> list[int]:
        try:
            return [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: e.g. 8,16,32") from None

    from optireduce.experiments import cluster, loss_tolerance

    cl = sub.add_parser("cluster", help="SimPy cluster: ring, TAR and OptiReduce on the same links")
    _workers(cl)
    cl.add_argument("--tail", default="3", help="P99/P50 of the per-packet delay, or 'cloud'")
    cl.add_argument("--ops", type=int, default=100, help="measured ops per algorithm")
    cl.add_argument("--median-us", type=float, default=100.0, help="median per-packet delay")
    cl.add_argument("--loss", type=float, default=0.0, help="per-packet loss rate")
    cl.add_argument("--gbps", type=float, default=10.0, help="link bandwidth")
    cl.add_argument("--bucket-kib", type=int, default=1024, help="bytes of one op (KiB)")
    cl.add_argument("--warmup", type=int, default=5, help="OptiReduce calibration ops")
    cl.add_argument("--compute-us", type=int, default=0, help="compute time between ops")
    cl.add_argument("--rto-us", type=int, default=1000, help="reliable baselines' RTO")
    cl.add_argument("--seed", type=int, default=0)
    cl.add_argument("--exponents", default="inband", choices=cluster.EXPONENTS,
                    help="OptiReduce's exponent agreement: in-band after the first ops "
                    "(the hook's), or an all-gather before every op")  # fmt: skip
    cl.add_argument("--algos", default="", help="comma-separated subset (default: all)")
    _jobs(cl)
    cl.add_argument("--plot", default="", help="PNG of the latency CDFs")
    cl.add_argument("--sweep-workers", type=_sizes, default=None, help="e.g. 8,16,32")
    cl.add_argument("--sweep-plot", default="cluster-p99-vs-workers.png", help="sweep PNG")
    cl.add_argument("--json", action="store_true", help="print JSON")
    add_nic_params(cl, cluster.ClusterConfig().params(), only=cluster.NIC_FIELDS)
    _quick(cl, QUICK["cluster"])
    cl.set_defaults(func=cmd_cluster)

    lt = sub.add_parser("loss-tolerance", help="training accuracy vs packet loss, +/- the RHT")
    _workers(lt)
    lt.add_argument("--steps", type=int, default=250, help="SGD steps per run")
    lt.add_argument("--batch", type=int, default=32, help="minibatch per worker")
    lt.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (momentum 0.9)")
    lt.add_argument("--seeds", type=_sizes, default=[0, 1, 2, 3, 4], help="e.g. 0,1,2")
    lt.add_argument("--losses", type=_losses, default=(0.0, 0.01, 0.02, 0.05, 0.1))
    _jobs(lt)
    lt.add_argument("--plot", default="", help="PNG of accuracy vs loss rate")
    lt.add_argument("--json", action="store_true", help="print JSON")
    add_nic_params(lt, loss_tolerance.LossToleranceConfig().nic_params(),
                   only=loss_tolerance.NIC_FIELDS)  # fmt: skip
    _quick(lt, QUICK["loss-tolerance"])
    lt.set_defaults(func=cmd_loss_tolerance)

    from optireduce.experiments import train
    from optireduce.experiments.train import SCHEDULES

    tr = sub.add_parser("train", help="time-to-accuracy: DDP with OptiReduce vs gloo, same tail")
    tr.add_argument("--world", type=int, default=4, choices=range(2, 17), metavar="N")
    tr.add_argument("--steps", type=int, default=150, help="SGD steps of every method")
    tr.add_argument("--target", type=float, default=0.93, help="target test accuracy")
    tr.add_argument("--tail", type=float, default=3.0, help="P99/P50 of the injected delays")
    tr.add_argument("--straggler-ms", type=float, default=20.0, help="straggler delay median")
    tr.add_argument("--packet-delay-us", type=float, default=200.0, help="per-packet median")
    tr.add_argument("--schedule", default="cosine", choices=SCHEDULES,
                    help="learning rate over the steps")  # fmt: skip
    tr.add_argument("--methods", default="gloo,optireduce", help="comma-separated")
    tr.add_argument("--model", default="digits", choices=train.MODELS,
                    help="digits: the 2410-parameter MLP; large: a 10.3 M-parameter MLP "
                    "on a generated task (its own defaults: train.LARGE)")  # fmt: skip
    tr.add_argument(
        "--cluster",
        default="local",
        choices=train.CLUSTERS,
        help="local: processes on loopback; netns: each rank a host of its own "
        "(network namespaces on a bridge, 1 Gbit/s links; needs root)",
    )
    tr.add_argument("--boards", type=_sizes, default=None,
                    help="with --cluster netns: these ranks (e.g. 0 or 0,2) drive virtual "
                    "boards (the Verilated NIC) over their host ports")  # fmt: skip
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--seeds", type=_sizes, default=None,
                    help="e.g. 0,1,2,3,4: one run each, means and ranges (not --seed)")  # fmt: skip
    tr.add_argument("-o", "--output", default="train-out", help="directory of JSON and plot")
    tr.add_argument("--json", action="store_true", help="print {METHOD: {tta_s, ...}}")
    add_nic_params(tr, train.TrainConfig().nic_params(), only=train.NIC_FIELDS)
    _quick(tr, QUICK["train"])
    tr.set_defaults(func=cmd_train)

    sk = sub.add_parser("soak", help="the job's pieces again and again under rotating faults: "
                        "failures, hangs, unexplained loss, leaks")  # fmt: skip
    sk.add_argument("--runs", type=int, default=200,
                    help="training-smoke runs (faults in turn; every 10, plus a sigint, a replay "
                    "and a collective run)")  # fmt: skip
    sk.add_argument("--minutes", type=float, default=14.0, help="no run starts after this")
    sk.add_argument("--seed", type=int, default=0)
    sk.add_argument("--plot", default="", help="PNG of the outcomes per fault kind")
    sk.add_argument("-o", "--output", default="", help="also write the JSON report here")
    sk.add_argument("--json", action="store_true", help="print the report as JSON")
    _quick(sk, QUICK["soak"])
    sk.set_defaults(func=cmd_soak)

    from optireduce.sim.bitstream import BOARDS, CORES

    bd = sub.add_parser("build", help="board bitstreams with yowasp (no programmer needed)")
    bsub = bd.add_subparsers(dest="build_cmd", required=True)
    bb = bsub.add_parser("bitstream", help="build one board's bitstream; Fmax and utilization")
    bb.add_argument("--board", required=True, choices=BOARDS)
    bb.add_argument("--json", action="store_true", help="print JSON")
    bb.add_argument("--core", choices=CORES, default="nic",
                    help="loopback: the shell alone around a stand-in core (the 125 MHz side, "
                         "routed in minutes)")  # fmt: skip
    bb.add_argument("--sdram", action="store_true",
                    help="the aggregator's accumulators in the board's SDRAM, behind "
                         "litedram's controller (boards with SDRAM: colorlight)")  # fmt: skip
    bb.set_defaults(func=cmd_build)

    bo = sub.add_parser("board", help="FPGA NICs: find them, load them, or run a virtual one")
    bosub = bo.add_subparsers(dest="board_cmd", required=True)
    bdt = bosub.add_parser("detect", help="the NICs answering on the host's interfaces")
    bdt.add_argument("--ifname", default="", help="comma-separated (default: every one up)")
    bdt.add_argument("--timeout", type=float, default=0.5, help="seconds to wait for answers")
    bdt.add_argument("--json", action="store_true", help="print JSON")
    bdt.set_defaults(func=cmd_board_detect)
    bpr = bosub.add_parser("program", help="load a bitstream with openFPGALoader (SRAM)")
    bpr.add_argument("--board", required=True, choices=BOARDS)
    bpr.add_argument("--bitstream", default=None, help="default: the newest built for it")
    bpr.add_argument("--flash", action="store_true", help="write the SPI flash instead")
    bpr.add_argument("--json", action="store_true", help="print JSON")
    bpr.set_defaults(func=cmd_board_program)
    bvi = bosub.add_parser("virtual", help="the Verilated board shell on two interfaces (root)")
    bvi.add_argument("--host", required=True, help="interface of its host port (0x88B5 frames)")
    bvi.add_argument("--net", required=True, help="interface of its network port (UBT)")
    bvi.add_argument("--pcap", default="", help="capture both ports to PREFIX-host/-net.pcap")
    add_nic_params(bvi, train.TrainConfig(boards=(0,), cluster="netns").nic_params())
    bvi.set_defaults(func=cmd_board_virtual)

    p = sub.add_parser("protocol", help="the UBT v1 header, or its Wireshark dissector")
    p.add_argument("--lua", action="store_true", help="print the Lua dissector")
    p.set_defaults(func=cmd_protocol)
    return ap


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message says what to do (a board, a cable, a tool): no traceback."""
    from optireduce.host.board_nic import BoardError
    from optireduce.sim.program import ProgramError
    from optireduce.sim.toolchain import ToolchainError

    return (BoardError, ProgramError, ToolchainError)


def main(argv: Sequence[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    shrink(args)
    try:
        return args.func(args)
    except (ValueError, TypeError, *_user_errors()) as e:
        if os.environ.get("OPTIREDUCE_DEBUG"):
            raise
        print(f"optireduce: error: {e} (OPTIREDUCE_DEBUG=1 shows where)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get("OPTIREDUCE_DEBUG"):
            raise
        print(f"optireduce {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
