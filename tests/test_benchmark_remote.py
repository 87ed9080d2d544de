"""benchmarks/remote.py's cheap parts: its arguments, the runs and trainer processes it makes, and
the trace-share helper (no run); and its publication from two trainer processes, for the micro
model."""

import sys
from pathlib import Path

import pytest

from asyncrl.cloud.distributed import ENV
from asyncrl.tracing.reader import TraceSummary
from benchmarks.remote import (
    measure_publish,
    parse_args,
    publish_command,
    trainer_command,
    trainer_env,
    training_runs,
    where_time_goes,
)


def test_quick_mode_shrinks_the_run_and_bad_budgets_are_refused():
    full, quick = parse_args([]), parse_args(["--quick"])
    assert full.publish_models.split(",") == ["micro", "tiny", "small"] and full.replicas == 2
    assert quick.publish_models == "micro" and quick.steps < full.steps
    assert quick.publishes < full.publishes
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1"])


def test_one_trainer_host_by_default_and_n_hosts_add_a_remote_run_after_the_baseline():
    assert parse_args([]).trainer_hosts == 1
    assert parse_args(["--trainer-hosts", "2"]).trainer_hosts == 2
    with pytest.raises(SystemExit):
        parse_args(["--trainer-hosts", "0"])
    assert training_runs(1) == [("colocated", 1), ("remote", 1)]  # as before the option
    assert training_runs(2) == [("colocated", 1), ("remote", 1), ("remote", 2)]


def test_each_trainer_process_runs_the_train_stage_with_one_device_and_its_place_in_the_job(
    monkeypatch,
):
    monkeypatch.setenv("JAX_PROCESS_ID", "7")  # a launching process's own: never passed on
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    command = trainer_command(Path("/r/cfg.yaml"), Path("/r"))
    assert command[:4] == [sys.executable, "-m", "asyncrl.cli", "train"]
    assert command[4:] == ["/r/cfg.yaml", "--run-dir", "/r"]
    envs = [trainer_env(i, 2, 4242, Path("/r/jax-cache")) for i in range(2)]
    assert [e["JAX_PROCESS_ID"] for e in envs] == ["0", "1"]
    for env in envs:
        assert set(ENV) <= set(env)
        assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:4242"
        assert env["JAX_NUM_PROCESSES"] == "2"
        assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
        assert env["JAX_PLATFORMS"] == "cpu"
        assert env["JAX_COMPILATION_CACHE_DIR"] == "/r/jax-cache"  # the warm-up run's programs


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
    assert shares["publish_s"] == pytest.approx(1.0 / 4)
    assert shares["train_step_share"] == pytest.approx(8.0 / 20.0)
    assert shares["learner_idle"] == pytest.approx(0.6)
    assert shares["model_call_mean_s"] == pytest.approx(12.0 / 30)
    none = where_time_goes(TraceSummary(1.0, (), 1.0, 1.0, (), ()))
    assert none["publish_share"] == 0.0 and none["model_call_mean_s"] is None
    assert none["publish_s"] is None


def test_each_publishing_process_runs_this_script_for_one_preset_with_the_budget():
    args = parse_args(["--publishes", "3", "--replicas", "1"])
    command = publish_command("tiny", args, Path("/r/p"))
    assert command[:2] == [sys.executable, str(Path("benchmarks/remote.py").resolve())]
    again = parse_args(command[2:])
    assert again.publish_process == "tiny" and again.publish_dir == Path("/r/p")
    assert (again.publishes, again.replicas) == (3, 1)


def test_two_trainer_processes_publish_the_micro_model_to_both_replicas(tmp_path):
    """Two processes joined by jax.distributed hold the sharded parameters; process 0 gathers
    them, writes and announces each version; both replicas end up serving the last one."""
    args = parse_args(["--publishes", "2", "--publish-models", "micro", "--hosts-timeout", "120"])
    row = measure_publish("micro", args, tmp_path, hosts=2)
    assert row["model"] == "micro" and row["processes"] == 2
    assert row["served_versions"] == [3, 3]  # one warm-up and two timed publishes, each replica
    assert row["MB"] > 0.1
    for part in ("gather_s", "write_s", "publish_s", "total_s"):
        assert row[part] > 0, part
    assert row["total_s"] >= row["publish_s"]
    logs = sorted(p.name for p in tmp_path.glob("publish-micro-2h-*/trainer-*.log"))
    assert logs == ["trainer-0.log", "trainer-1.log"]
