"""benchmarks/remote.py's cheap parts: its arguments and the trace-share helper (no run)."""

import pytest

from asyncrl.tracing.reader import TraceSummary
from benchmarks.remote import parse_args, where_time_goes


def test_quick_mode_shrinks_the_run_and_bad_budgets_are_refused():
    full, quick = parse_args([]), parse_args(["--quick"])
    assert full.publish_models.split(",") == ["micro", "small"] and full.replicas == 2
    assert quick.publish_models == "micro" and quick.steps < full.steps
    assert quick.publishes < full.publishes
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1"])


def test_where_time_goes_divides_each_slice_total_by_the_traced_span():
    summary = TraceSummary(
        seconds=20.0,
        by_name=(("model call", 12.0, 30), ("train step", 8.0, 4), ("publish", 1.0, 4)),
        engine_idle=1.0,
        learner_idle=0.6,
        slowest_episodes=(),
        counters=(),
    )
    shares = where_time_goes(summary)
    assert shares["publish_share"] == pytest.approx(1.0 / 20.0)
    assert shares["train_step_share"] == pytest.approx(8.0 / 20.0)
    assert shares["learner_idle"] == pytest.approx(0.6)
    assert shares["model_call_mean_s"] == pytest.approx(12.0 / 30)
    none = where_time_goes(TraceSummary(1.0, (), 1.0, 1.0, (), ()))
    assert none["publish_share"] == 0.0 and none["model_call_mean_s"] is None
