"""`asyncrl compare`: two real micro runs (the session's passing run and failing-gate run) side by
side, from local folders and from a gs:// bucket; the table's cells are the runs' own results."""

import pytest

from asyncrl import storage
from asyncrl.cli import main
from asyncrl.compare import compare, load_run, table_rows
from asyncrl.run_layout import RunLayout
from asyncrl.stages.quality_gate import GateResult
from asyncrl.stages.train import TrainResult


@pytest.fixture(scope="module")
def runs(passing_run, failing_gate_run):
    return passing_run.result.run_dir, failing_gate_run.result.run_dir


def _cells(rows, label):
    (found,) = [cells for name, cells in rows if name == label]
    return found


def test_the_table_shows_each_runs_own_results_and_the_config_difference(runs):
    summaries = [load_run(str(r)) for r in runs]
    rows = table_rows(summaries)
    assert _cells(rows, "run") == [r.name for r in runs]
    # The configs differ in the gate's bar and champion registry (the stage list is pipeline.*,
    # where a run goes rather than what it trains, so it is not shown).
    differences = {name.removeprefix("config: ") for name, _ in rows if name.startswith("config:")}
    assert differences == {"gate.min_solve_rate", "gate.champion"}
    assert _cells(rows, "config: gate.min_solve_rate") == ["0.0", "1.0"]
    assert _cells(rows, "gate verdict") == ["passed", "failed"]
    assert _cells(rows, "check: solve_rate >= min_solve_rate") == ["pass", "FAIL"]
    for run, cell in zip(runs, _cells(rows, "RL steps"), strict=True):
        assert cell == str(RunLayout.of(run).read(TrainResult).steps)
    for run, cell in zip(runs, _cells(rows, "gate: solve_rate"), strict=True):
        e = RunLayout.of(run).read(GateResult).candidate["solve_rate"]
        assert cell == f"{100 * e.value:.1f}% [{100 * e.low:.1f}, {100 * e.high:.1f}]"


def test_compare_cli_prints_the_table_and_writes_the_overlay_plot(runs, tmp_path, capsys):
    plot = tmp_path / "curves.png"
    assert main(["compare", *map(str, runs), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert all(r.name in out.splitlines()[0] for r in runs)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000


def test_a_run_in_a_bucket_compares_like_its_local_folder(runs, gcs_bucket):
    uri = f"{gcs_bucket}/compare/{runs[0].name}"
    storage.upload_tree(runs[0], uri)
    local_text, _ = compare([str(runs[0]), str(runs[1])], None)
    remote_text, _ = compare([uri, str(runs[1])], None)
    assert remote_text == local_text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["compare", "/nonexistent-run"], "/nonexistent-run: not a run folder"),
        (["compare", *["x"] * 9], "compare takes 1 to 8 run folders, got 9"),
    ],
)
def test_compare_refuses_what_is_not_a_run(argv, named, capsys):
    assert main(argv) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ('{"kind": "eval", "step": 1, "solve_rate": 0.5}\n[1, 2]\n', "line 2 is not a JSON object"),
        ('{"kind": "eval", "step": "x", "solve_rate": 0.5}\n', "without a numeric step"),
        ('{"kind": "eval", "step": 1, "solve_rate": NaN}\n', "without a numeric step"),
        ('{"kind": "eval", "step": 1\n', "not a metrics file"),
    ],
    ids=["not-an-object", "text-step", "nan-rate", "cut-short"],
)
def test_a_malformed_metrics_file_is_named(tmp_path, capsys, metrics, named):
    from asyncrl.config import to_yaml
    from asyncrl.testing.configs import micro_config

    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(micro_config()))
    (run / "train" / "metrics.jsonl").write_text(metrics)
    assert main(["compare", str(run), "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl" in err and named in err
