"""`optireduce replay --backend native` writes what `--backend model` writes: frames, counters."""

from __future__ import annotations

import json

import pytest

from optireduce.cli import main


@pytest.mark.parametrize("scenario", ["loss", "malformed"])
def test_replay_native_equals_model_from_the_command_line(tmp_path, capsys, scenario):
    trace = tmp_path / "t.pcap"
    assert main(["trace", "make", "--scenario", scenario, "--seed", "3", "-o", str(trace)]) == 0
    out = {}
    for backend in ("model", "native"):
        capsys.readouterr()
        pcap = tmp_path / f"{backend}.pcap"
        assert main(["replay", str(trace), "--backend", backend, "-o", str(pcap), "--json"]) == 0
        out[backend] = (json.loads(capsys.readouterr().out), pcap.read_bytes())
    assert out["model"][0]["frames_out"] > 0
    assert out["native"] == out["model"]
