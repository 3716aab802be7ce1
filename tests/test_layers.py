"""The layers of docs/architecture.md, checked by import-linter (contracts in pyproject.toml).

hw/, sim/, host/ and experiments/ are mapped into the package `optireduce` at install, so the
package is not one folder on disk, which is what import-linter walks. The test lays out a
mirror of the installed package (symlinks to the sources) and runs lint-imports on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package folder -> source folder, as in pyproject.toml's package mapping
SOURCES = {"": "optireduce", "hw": "hw", "sim": "sim", "host": "host", "experiments": "experiments"}


def _site_packages() -> str:
    try:
        import importlinter
    except ImportError:
        pytest.fail("import-linter is missing: run `make install` (it is a dev extra)")
    return str(Path(importlinter.__file__).resolve().parents[1])


# `python -S`: without site, the editable install's finder (a .pth file) is not loaded, so
# `optireduce` is found in the mirror, the only place where the whole package is one folder
LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.argv[0] = 'lint-imports'; lint_imports_command()"
)


def _mirror(dest: Path) -> Path:
    pkg = dest / "optireduce"
    for sub, src in SOURCES.items():
        for f in (ROOT / src).rglob("*.py"):
            rel = f.relative_to(ROOT / src)
            if sub == "" and rel.parts[0] in SOURCES:
                continue
            target = pkg / sub / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(f)
    return pkg


def _run(mirror_root: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join((str(mirror_root), _site_packages()))
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-S", "-c", LINT, str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=mirror_root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_every_layer_contract_is_kept(tmp_path):
    pkg = _mirror(tmp_path)
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout, r.stdout
    # every module was read: the graph is the mirror's, not a partial package found elsewhere
    assert f"Analyzed {len(list(pkg.rglob('*.py')))} files" in r.stdout, r.stdout


@pytest.mark.parametrize(
    ("where", "line", "contract"),
    [
        ("hw/_bad.py", "import optireduce.experiments.demo", "Layers"),
        ("host/model/_bad.py", "import optireduce.hw.fwht", "The model imports only"),
        ("host/model/_bad.py", "import optireduce.host.driver", "Inside host/"),
        ("ubt.py", "import optireduce.sim.replay", "Layers"),
    ],
)
def test_a_violation_breaks_its_contract(tmp_path, where, line, contract):
    pkg = _mirror(tmp_path)
    target = pkg / where
    if target.is_symlink():  # a vocabulary module: a copy with the bad line added
        text = target.read_text()
        target.unlink()
        target.write_text(text + "\n" + line + "\n")
    else:
        target.write_text(line + "\n")
    r = _run(tmp_path)
    assert r.returncode != 0
    broken = [ln for ln in r.stdout.splitlines() if " BROKEN" in ln]
    assert any(contract in ln for ln in broken), r.stdout


def test_every_module_of_the_package_root_is_in_a_layer():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = cfg["contracts"][0]["layers"]
    listed = {m.strip() for layer in layers for m in layer.split(":")}
    root_modules = {f"optireduce.{f.stem}" for f in (ROOT / "optireduce").glob("*.py")}
    assert root_modules - {"optireduce.__init__"} <= listed, root_modules - listed


def test_importing_the_gateware_loads_neither_numba_nor_torch():
    code = (
        "import sys, optireduce.hw.nic_core, optireduce.hw.board_top;"
        "print(sorted(m for m in ('numba', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
