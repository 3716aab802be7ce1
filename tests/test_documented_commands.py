"""Every command line the README and docs/*.md show runs, as written, and leaves something
that can be checked.

The commands are read from the markdown: each line of a fenced code block, and each inline
code span of a table row, that starts with `optireduce `, `make`, `python -m ` or
`torchrun ` (after an optional `.venv/bin/`); a trailing `# comment` and `\\` continuations
are handled. A command added to the docs is picked up without touching this file; one that
must not run goes in NOT_RUN with the reason.

Each runs through `bash -c`, exactly as written, with OPTIREDUCE_QUICK=1 in the environment:
the documented `--quick` of every command (README, "Command line"), so that a command of
minutes takes seconds. It must exit 0, and what it promises must be there: the JSON of
`--json` parses, every file named by -o/--output/--plot/--sweep-plot is written (a folder:
not empty), and the commands with neither print what STDOUT says.

Where:
- the repository root: a folder whose entries are links to the repository's, but for
  docs/ (its own folder, its files linked), so that `--plot docs/img/...` and `make bench`'s
  bench.json are written there instead of over the tree's (several people share it). Every
  command but the excluded runs here, in the order of the docs.
- another folder (empty): where the folder matters, i.e. a command names a file, the
  first such command of each program (train -o, trace make -o, replay t.pcap, demo --plot),
  `.venv/bin/` made absolute (a user with the venv on PATH). `make` needs the Makefile, and
  `--plot docs/img/...` the tree: those run from the root only.

Each test stands alone (one command; a file it reads, such as t.pcap, is made first by the
documented command that writes it), so a failure names its command and its doc line. A
command whose quick run an earlier one makes (the same arguments as the CLI parses and
shrinks them, but the name of an output) is not run again (SAME_RUN, with its twin).

Placeholders of the docs' synopses: `[--x]` runs without and with --x, `a\\|b` once per
alternative, and the names in PLACEHOLDERS are replaced.

Slow: 41 + 4 commands, 2-90 s each on 2 loaded cores (torch process start-up in train,
demo and torchrun; the co-simulated NIC in replay --backend rtl and bench cosim, its
harness builds cached under build/); see the report of the run in the commit.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAMS = re.compile(r"^(?:\.venv/bin/)?(?:optireduce |make\b|python -m |torchrun )")

# Documented commands this test does not run, and why (each pattern must still match one).
NOT_RUN: dict[str, str] = {
    # itself, and the suite it belongs to
    r"^make test$": "the whole test suite, this test among it",
    r"^make deep$": "the deep checks (bounded model checks, amaranth.sim, sanitizers: 20 min)",
    # the quick soak is the same run with or without sizes (2 minutes): tests/test_soak.py runs
    # docs/reliability.md's line and checks the report's values and its -o and --plot files
    r"^optireduce soak\b": "the quick soak: tests/test_soak.py runs docs/reliability.md's "
    "line and checks its report and files",
    r"^(?:\.venv/bin/)?python -m pytest\b": "a test run: those tests are part of make test",
    # make demo = make install + `optireduce demo`, which runs here (README's table)
    r"^make demo$": "make install + optireduce demo; the demo line itself runs here",
    # `make bench` = `optireduce bench all --quick`: every group it runs has its own
    # documented line, run here; tests/test_cli.py checks what `bench all` runs
    r"^make bench$": "bench all: each of its groups' own documented lines runs here",
    # bitstreams: 15-16 min for the whole NIC, 2 min for the loopback shell; neither has a
    # small size (placement and routing of the real design is the point)
    r"^make bitstream": "a bitstream build (15 min per board); tests/test_bitstream.py builds "
    "the loopback shell and parses the reports",
    r"^(?:\.venv/bin/)?optireduce build bitstream\b": "a bitstream build (2-16 min); "
    "tests/test_bitstream.py builds the loopback shell and parses the reports",
    # ECP5 synthesis (and place and route) of real blocks: minutes each when the Verilog
    # changed (cached by its text otherwise); the size is the design's, there is no small one
    r"-m optireduce\.experiments\.fmax\b": "nextpnr per block: over 2.5 min for "
    "gather_tracker alone on this machine; tests/test_bitstream.py parses nextpnr's reports",
    r"-m optireduce\.experiments\.logic_depth\b": "yosys synth_ecp5 of each block (over "
    "2.5 min for two blocks here) or of the whole NIC (--board); tests/hw/test_logic_depth.py "
    "times small netlists",
    # each rank in a network namespace of its own: tests/test_train_netns.py runs that path
    r"optireduce train .*--cluster netns": "the namespace cluster's train run; "
    "tests/test_train_netns.py trains both methods across 4 namespaces",
    # a log line the docs quote, not a command
    r"^optireduce rank \d": "a log line (docs/cluster.md, 'Read the log')",
}

# Names of the docs' synopses, and what stands in for them.
PLACEHOLDERS = {
    "DIR": "train-dir",
    "TRACE.pcap": "t.pcap",  # the README's `optireduce trace make ... -o t.pcap` makes it
}

# Commands that print JSON without --json.
JSON_ALWAYS = (r"optireduce simulate\b",)

# Commands without --json or an output file: what their stdout must hold (first match).
STDOUT: list[tuple[str, str]] = [
    (r"optireduce protocol --lua$", r"Proto\(\"ubt\""),
    (r"optireduce protocol$", r"(?m)^\s*0 \d+ \w+"),  # offset 0, size, the first field
    (r"optireduce demo --numerics$", r"rel\. L2 err"),
    (r"optireduce demo$", r"time to 93% test accuracy"),
    (r"-m optireduce\.experiments\.fmax ", r"(?m)^\w+ \{.*\"fmax_mhz\""),
    (r"-m optireduce\.experiments\.logic_depth ", r"registers( in \w+)? with paths over"),
    (r"-m optireduce\.experiments\.ddp_example", r"\S"),
    # one process: the local NIC, its line says so and the replicas (one) agree
    (r"^torchrun -m optireduce\.example$", r"world 1, local NIC, .*replicas equal"),
]


def documented(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every command line in a code block or a table row of `path`."""
    out: list[tuple[int, str]] = []
    fence, pending = False, ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if s.startswith("```"):
            fence, pending = not fence, ""
            continue
        if fence:
            s = f"{pending} {s}".strip() if pending else s
            if s.endswith("\\"):
                pending = s[:-1].rstrip()
                continue
            pending = ""
            s = re.sub(r"\s+#.*$", "", s).strip()
            if PROGRAMS.match(s):
                out.append((n, s))
        elif s.startswith("|"):
            out.extend((n, c.strip()) for c in re.findall(r"`([^`]+)`", s) if PROGRAMS.match(c))
    return out


def expand(cmd: str) -> list[str]:
    """A synopsis's forms: `[--x]` without and with, `a\\|b` each, PLACEHOLDERS replaced."""
    if m := re.search(r"\[([^\]]+)\]", cmd):
        return expand(cmd[: m.start()].rstrip() + cmd[m.end() :]) + expand(
            cmd[: m.start()] + m.group(1) + cmd[m.end() :]
        )
    if m := re.search(r"(\S+)\\\|(\S+)", cmd):
        return [f for alt in (m.group(1), m.group(2))
                for f in expand(cmd[: m.start()] + alt + cmd[m.end() :])]  # fmt: skip
    words = [PLACEHOLDERS.get(w, w) for w in cmd.split(" ")]
    return [" ".join(words)]


def excluded(cmd: str) -> str | None:
    return next((why for pat, why in NOT_RUN.items() if re.search(pat, cmd)), None)


def all_commands() -> list[tuple[str, str]]:
    """(where, command) in the docs' order, each distinct command once."""
    seen: dict[str, str] = {}
    for path in DOCS:
        for n, cmd in documented(path):
            for form in expand(cmd):
                seen.setdefault(form, f"{path.relative_to(REPO)}:{n}")
    return [(where, cmd) for cmd, where in seen.items()]


def program(cmd: str) -> str:
    """`optireduce replay`, `python -m optireduce.experiments.fmax`, `make bench`, ..."""
    w = cmd.removeprefix(".venv/bin/").split()
    if w[0] == "optireduce" and len(w) > 2 and w[1] in ("bench", "trace", "build"):
        return " ".join(w[:3])
    if w[0] == "python":
        return " ".join(w[:3])
    if w[0] == "torchrun":
        return " ".join(w[:1] + [x for x in w if x.startswith("optireduce.")][:1])
    return " ".join(w[:2])


def _json_of(stdout: str) -> object:
    """The JSON document of stdout (after any table the command prints first)."""
    try:
        return json.loads(stdout)
    except ValueError:
        lines = stdout.splitlines()
        starts = [i for i, s in enumerate(lines) if s in ("{", "[")]
        assert starts, f"no JSON document in stdout:\n{stdout[-2000:]}"
        return json.loads("\n".join(lines[starts[-1] :]))


def check(cmd: str, cwd: Path, res: subprocess.CompletedProcess) -> list[str]:
    """What the command promised and is not there (empty: all is)."""
    tail = f"\n--- stdout ---\n{res.stdout[-1500:]}\n--- stderr ---\n{res.stderr[-3000:]}"
    if res.returncode != 0:
        return [f"exit {res.returncode}{tail}"]
    words, checked, bad = shlex.split(cmd), 0, []
    if "--json" in words or any(re.search(pat, cmd) for pat in JSON_ALWAYS):
        checked += 1
        try:
            doc = _json_of(res.stdout)
            if not doc:
                bad.append(f"empty JSON{tail}")
        except (ValueError, AssertionError) as e:
            bad.append(f"--json: {e}{tail}")
    for flag in ("-o", "--output", "--plot", "--sweep-plot"):
        if flag in words[:-1] and (name := words[words.index(flag) + 1]):
            checked += 1
            f = cwd / name
            if f.is_dir() and any(f.iterdir()):
                continue
            if not f.is_file() or f.stat().st_size == 0:
                bad.append(f"{flag} {name}: not written in {cwd}{tail}")
            elif f.suffix == ".json":
                json.loads(f.read_text())
    if words[:2] == ["make", "bench"]:  # the Makefile's -o bench.json
        checked += 1
        if not (cwd / "bench.json").is_file():
            bad.append(f"make bench: no bench.json in {cwd}{tail}")
        else:
            assert json.loads((cwd / "bench.json").read_text())["groups"]["ran"]
    for pat, want in STDOUT:
        if re.search(pat, cmd):
            checked += 1
            if not re.search(want, res.stdout):
                bad.append(f"stdout lacks {want!r}{tail}")
            break
    if not checked:
        bad.append("nothing to check: give it --json or an output file, or add it to STDOUT")
    return bad


def run(cmd: str, cwd: Path, timeout: float = 300) -> tuple[list[str], float]:
    env = dict(os.environ, OPTIREDUCE_QUICK="1", OMP_NUM_THREADS="1")
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    try:
        res = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return [f"no result in {timeout:.0f} s"], time.monotonic() - t0
    return check(cmd, cwd, res), time.monotonic() - t0


def root_copy(dest: Path) -> Path:
    """A folder that reads as the repository root; docs/ of its own (written plots land here)."""
    dest.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("docs", ".git"):
            (dest / entry.name).symlink_to(entry)
    (dest / "docs").mkdir()
    for entry in (REPO / "docs").iterdir():
        if entry.name != "img":
            (dest / "docs" / entry.name).symlink_to(entry)
    (dest / "docs" / "img").mkdir()
    return dest


def _inputs(cmd: str, cwd: Path, writers: dict[str, str]) -> None:
    """Make the files `cmd` reads (`replay t.pcap`) with the documented command that writes
    them (`trace make ... -o t.pcap`), when this folder lacks them: each test stands alone."""
    words = shlex.split(cmd)
    outputs = {b for a, b in itertools.pairwise(words) if a in ("-o", "--output")}
    for word in words[1:]:
        if word in writers and word not in outputs and not (cwd / word).exists():
            _inputs(writers[word], cwd, writers)
            bad, _ = run(writers[word], cwd)
            assert not bad, f"making {word} with `{writers[word]}`: {bad[0]}"


def _writers(cmds: list[str]) -> dict[str, str]:
    """output file -> the first documented command that writes it (-o/--output)."""
    out: dict[str, str] = {}
    for cmd in cmds:
        words = shlex.split(cmd)
        for flag in ("-o", "--output"):
            if flag in words[:-1]:
                out.setdefault(words[words.index(flag) + 1], cmd)
    return out


def _param(where: str, cmd: str):
    return pytest.param(where, cmd, id=f"{where} {cmd}")


OUTPUT_ARGS = ("output", "plot", "sweep_plot")


def quick_run(cmd: str, parser) -> str | None:
    """What an `optireduce` command computes under OPTIREDUCE_QUICK=1: its arguments as
    parsed and shrunk by the CLI, output names reduced to whether there is one (None:
    not an optireduce command, or one that does not parse: it runs and its test says)."""
    from optireduce import cli

    words = shlex.split(cmd)
    if words[0].removeprefix(".venv/bin/") != "optireduce":
        return None
    try:
        args = parser.parse_args(words[1:])
    except SystemExit:
        return None
    cli.shrink(args)
    d = {k: (getattr(v, "__name__", v) if callable(v) else v) for k, v in vars(args).items()}
    return repr(sorted({**d, **{k: bool(d[k]) for k in OUTPUT_ARGS if k in d}}.items()))


def distinct_runs(cmds: list[tuple[str, str]]) -> tuple[list, dict[str, str]]:
    """The commands whose quick run no earlier one makes (the same arguments but an output
    name: `train --json -o train-out` after `train --json -o train-dir`), and each other
    one's twin. The twin's test runs what both would (the time budget)."""
    from optireduce import cli

    # --quick's default is read when the parser is built
    with mock.patch.dict(os.environ, {"OPTIREDUCE_QUICK": "1"}):
        parser = cli.build_parser()
    first: dict[str, str] = {}
    runs, twins = [], {}
    for where, cmd in cmds:
        key = quick_run(cmd, parser)
        if key is not None and key in first:
            twins[cmd] = first[key]
        else:
            runs.append((where, cmd))
            if key is not None:
                first[key] = cmd
    return runs, twins


ROOT_RUNS, SAME_RUN = distinct_runs([(w, c) for w, c in all_commands() if not excluded(c)])


def _names_a_file(cmd: str) -> bool:
    words = shlex.split(cmd)
    flags = ("-o", "--output", "--plot", "--sweep-plot")
    return any(w in flags for w in words[:-1]) or any(w.endswith(".pcap") for w in words)


def _elsewhere() -> list[tuple[str, str]]:
    """The folder matters where a command names a file: the first such command of each
    program, but make (it needs the Makefile) and those that write under docs/ (written
    for the root). The other commands run from the root only (the time budget)."""
    first: dict[str, tuple[str, str]] = {}
    for where, cmd in ROOT_RUNS:
        if not cmd.startswith("make") and " docs/" not in cmd and _names_a_file(cmd):
            first.setdefault(program(cmd), (where, cmd))
    return list(first.values())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return root_copy(tmp_path_factory.mktemp("documented") / "repo")


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("elsewhere")


# Slow: one test per command, 2-90 s each on 2 loaded cores (torch process start-up in
# train, demo and torchrun; the co-simulated NIC in replay --backend rtl and bench cosim).
@pytest.mark.parametrize(("where", "cmd"), [_param(w, c) for w, c in ROOT_RUNS])
def test_documented_command_from_the_repository_root(root, where, cmd):
    if cmd.startswith("make"):
        # make's install prerequisite would pip-install into the shared venv, racing any
        # other install (seen: two builds in one CMake tree); a test must not install
        stale = subprocess.run(["make", "-q", "install"], cwd=root, capture_output=True)
        assert stale.returncode == 0, (
            "the venv is older than pyproject/native sources: make install"
        )
    _inputs(cmd, root, _writers([c for _, c in ROOT_RUNS] + list(SAME_RUN)))
    bad, secs = run(cmd, root)
    assert not bad, f"{where}: `{cmd}` ({secs:.0f} s, in {root}): " + "\n".join(bad)


@pytest.mark.parametrize(("where", "cmd"), [_param(w, c) for w, c in _elsewhere()])
def test_documented_command_from_another_folder(elsewhere, where, cmd):
    """`.venv/bin/` made absolute: a user with the venv's bin on PATH, elsewhere."""
    cmd = cmd.replace(".venv/bin/", f"{VENV_BIN}/")
    _inputs(
        cmd,
        elsewhere,
        _writers([c.replace(".venv/bin/", f"{VENV_BIN}/") for _, c in ROOT_RUNS] + list(SAME_RUN)),
    )
    bad, secs = run(cmd, elsewhere)
    assert not bad, f"{where}: `{cmd}` ({secs:.0f} s, in {elsewhere}): " + "\n".join(bad)


@pytest.mark.parametrize("cmd", ["optireduce protocol", "optireduce replay x.pcap --json"])
def test_a_missing_promise_is_reported(tmp_path, cmd):
    """The checker itself: a command that exits 0 without its output is a failure."""
    ok = subprocess.CompletedProcess(cmd, 0, stdout="nothing here\n", stderr="")
    assert check(cmd, tmp_path, ok)
    assert check(cmd, tmp_path, subprocess.CompletedProcess(cmd, 1, "", "boom"))


def test_the_docs_show_the_commands_and_every_exclusion_is_still_there():
    cmds = [c for _, c in all_commands()]
    # the README's table and the docs' blocks are read (a broken reader finds nothing)
    for want in ("optireduce simulate --workers 8 --elements 100000 --drop-rate 0.01",
                 "optireduce replay t.pcap --backend rtl -o out.pcap --json",
                 "optireduce demo", "optireduce demo --numerics",
                 "optireduce train --json -o train-dir", "make bench"):  # fmt: skip
        assert want in cmds
    assert "optireduce demo [--numerics]" not in cmds
    for pat in NOT_RUN:
        assert any(re.search(pat, c) for c in cmds), f"{pat!r} matches no documented command"
    continued = [c for c in cmds if c.startswith(".venv/bin/optireduce cluster --tail 3 --ops 30")]
    assert continued and continued[0].endswith("--json")  # the `\` continuation is one line
    assert len(_elsewhere()) >= 4  # train, trace, replay, demo: the folder matters there
    assert _writers(cmds)["t.pcap"].startswith("optireduce trace make")


def test_a_command_is_run_once_per_distinct_quick_run():
    """An output's name does not make a new run, its presence does, and so does any
    argument that survives --quick's shrinking (steps above 4 do not)."""
    runs, twins = distinct_runs([
        ("a", "optireduce train --json -o x"), ("b", ".venv/bin/optireduce train --json -o y"),
        ("c", "optireduce cluster --json --plot p.png"), ("d", "optireduce cluster --json"),
        ("e", "optireduce train --json -o y --steps 9"), ("f", "optireduce demo --plot q.png"),
        ("g", "optireduce train --json -o y --seed 3"), ("h", "make bench"),
        ("i", "optireduce demo"),  # its --plot has a default: the same run as f
    ])  # fmt: skip
    assert [w for w, _ in runs] == ["a", "c", "d", "f", "g", "h"]
    assert twins == {".venv/bin/optireduce train --json -o y": "optireduce train --json -o x",
                     "optireduce train --json -o y --steps 9": "optireduce train --json -o x",
                     "optireduce demo": "optireduce demo --plot q.png"}  # fmt: skip
    assert ("docs/reproduce.md:11", ".venv/bin/optireduce train --json -o train-out") not in (
        ROOT_RUNS
    )  # the README's `train --json -o train-dir` runs it


def test_expand_placeholders():
    assert expand("optireduce protocol [--lua]") == [
        "optireduce protocol", "optireduce protocol --lua"]  # fmt: skip
    assert expand("optireduce replay t.pcap --backend model\\|rtl -o out.pcap") == [
        "optireduce replay t.pcap --backend model -o out.pcap",
        "optireduce replay t.pcap --backend rtl -o out.pcap",
    ]
    assert expand("optireduce train --json -o DIR") == ["optireduce train --json -o train-dir"]
