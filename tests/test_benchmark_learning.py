"""benchmarks/learning.py's cheap parts: a run's curve (training time excludes the evaluations'
own time and the start-up; Wilson intervals over the evaluated episodes) and the time to a target
(no run), and the count of lookup calls in greedy lookup episodes."""

import json

import pytest

from asyncrl.envs.demonstrations import demonstration
from asyncrl.envs.tasks import calculator_task, lookup_task
from asyncrl.metrics.intervals import wilson
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from benchmarks.learning import MODES, curve, lookups, mode_overrides, time_to


def _write(run, rows):
    (run / "train").mkdir(parents=True)
    lines = [json.dumps({"kind": kind, **row}) for kind, row in rows]
    (run / "train" / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _eval(step: int, elapsed_s: float, eval_s: float, solved: int, n: int = 8) -> tuple:
    e = wilson(solved, n, 0.95)  # the interval the train stage's evaluation records
    row = {"solve_rate": e.value, "solve_rate_low": e.low, "solve_rate_high": e.high}
    return "eval", {"step": step, "elapsed_s": elapsed_s, "eval_s": eval_s, **row}


def test_the_curve_subtracts_every_evaluation_so_far_from_the_elapsed_time(tmp_path):
    _write(
        tmp_path,
        [
            _eval(0, 14.0, 10.0, 2),
            ("train", {"step": 1, "elapsed_s": 30.0}),
            _eval(2, 59.0, 5.0, 4),
            _eval(4, 94.0, 5.0, 6),
        ],
    )
    points = curve(tmp_path)
    assert [p["step"] for p in points] == [0, 2, 4]
    assert [p["train_s"] for p in points] == [0.0, 40.0, 70.0]  # from the first evaluation
    assert {p["startup_s"] for p in points} == {4.0}  # before it: engine and compiles
    expected = wilson(6, 8, 0.95)
    assert (points[2]["low"], points[2]["high"]) == (expected.low, expected.high)
    assert time_to(points, 0.25 + 0.05) == 40.0  # the first evaluation at or above the target
    assert time_to(points, 0.8) is None  # never reached


def test_modes_compare_the_same_device_budget_and_sync_keeps_no_stale_groups():
    assert MODES[0] == ("sync", "colocated")  # the baseline the ratios divide by
    sync = mode_overrides("sync", "colocated", devices=4)
    split = mode_overrides("async", "disaggregated", devices=4)
    assert "learner.max_staleness=0" in sync and "cluster.rollout_devices=0" in sync
    assert "cluster.rollout_devices=2" in split and "cluster.train_devices=2" in split
    assert "learner.max_staleness=1" in split


@pytest.mark.parametrize("mode,placement", MODES)
def test_every_mode_is_a_valid_config(mode, placement):
    from benchmarks.learning import config

    cfg = config(mode_overrides(mode, placement, devices=4))
    assert (cfg.learner.mode, cfg.cluster.placement) == (mode, placement)


def test_lookup_episodes_are_counted_by_their_lookup_calls():
    fmt = ChatFormat("chatml", ByteTokenizer())
    tasks = [lookup_task("train", i) for i in range(3)] + [calculator_task("train", 0)]
    # Two privileged episodes (one lookup call each), one expert episode (two calls), one
    # calculator episode (not a lookup task: not counted); every demonstration is solved.
    shares = [1.0, 1.0, 0.0, 1.0]
    episodes = [
        demonstration(t, fmt, privileged_fraction=p) for t, p in zip(tasks, shares, strict=True)
    ]
    assert lookups(tasks, episodes, fmt) == {
        "lookup_calls=1": "2 episodes, solved 100.0%",
        "lookup_calls=2": "1 episodes, solved 100.0%",
    }
