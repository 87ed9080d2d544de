"""benchmarks/overlap.py end to end on the micro model: all four runs happen, in order, each
trains, and the table's ratios are of the steps per minute the runs report."""

import json

import pytest

from asyncrl.testing.configs import MICRO_OVERRIDES
from benchmarks import overlap


@pytest.mark.slow
def test_overlap_runs_the_four_modes_and_prints_their_ratios(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no runs/ here: every run starts from the same fresh model
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    overrides = [f"--override={o}" for o in (*MICRO_OVERRIDES, "env.max_steps=2")]
    argv = ["--seconds", "8", "--devices", "4", "--heldout", "2", "--latency", "0.01", *overrides]
    assert overlap.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    runs = [json.loads(line) for line in out if line.startswith('{"mode"')]
    assert [(r["mode"], r["placement"]) for r in runs] == list(overlap.RUNS)
    assert all(r["steps"] >= 2 and r["steps_per_min"] > 0 for r in runs)
    table = [line.split("|")[1:-1] for line in out if line.startswith("| ") and "---" not in line]
    base = runs[0]["steps_per_min"]
    for row, run in zip(table[1:], runs, strict=True):
        assert float(row[3]) == round(run["steps_per_min"] / base, 2)
