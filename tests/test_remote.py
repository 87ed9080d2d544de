"""Remote rollout: engines in their own processes on loopback; the trainer survives losing one."""

import json
import os
import signal
import threading
import time

from asyncrl.testing.configs import micro_config


def test_remote_placement_trains_and_survives_a_killed_replica(tmp_path, monkeypatch):
    from asyncrl.run_layout import RunLayout
    from asyncrl.serving.auth import TOKEN_ENV
    from asyncrl.stages.train import train

    # Both sides find the shared token through the variable naming its file (as on GKE).
    (tmp_path / "token").write_text("a-shared-test-token-0123456789\n")
    monkeypatch.setenv(TOKEN_ENV, str(tmp_path / "token"))

    cfg = micro_config(
        "cluster.placement=remote",
        "cluster.rollout_replicas=2",
        "rollout.failure_policy=retry",
        "rollout.max_retries=3",
        "learner.steps=6",
        "learner.eval_every=0",
        "env.heldout_size=2",
        "env.train_size=16",
        "checkpoint.every_steps=0",
        "tracing.tensorboard=false",
    )
    metrics = tmp_path / "train" / "metrics.jsonl"
    killed = {}

    def kill_one_replica_after_two_steps():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            rows = metrics.read_text().splitlines() if metrics.exists() else []
            if sum('"kind": "train"' in r for r in rows) >= 2:
                pid = int((tmp_path / "train" / "replicas" / "replica-0.pid").read_text())
                os.kill(pid, signal.SIGKILL)
                killed["at_step"] = sum('"kind": "train"' in r for r in rows)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_one_replica_after_two_steps, daemon=True)
    killer.start()
    result = train(cfg, RunLayout.of(tmp_path))
    killer.join(5)
    assert killed, "the replica was never killed: training ended before step 2"
    assert result.steps == 6  # trained to the end on the surviving replica
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 7))
    assert train_rows[-1]["version"] == 6.0
    # Weights went out once per version, as safetensors folders both sides read; the trainer
    # pruned the old ones (the last prune may still be running: v4 may remain).
    folders = {p.name for p in (tmp_path / "train" / "weights").iterdir()}
    assert {"v5", "v6"} <= folders <= {"v4", "v5", "v6"}


def test_with_every_replica_gone_the_orchestrator_stops_with_a_clear_error(tmp_path):
    import asyncio

    import pytest

    from asyncrl.envs.tasks import task_stream
    from asyncrl.rollout.groups import GroupQueue
    from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings
    from asyncrl.sampling.protocol import EngineClosed
    from asyncrl.serving.client import RemoteEngine
    from asyncrl.wiring.episodes import Wiring

    cfg = micro_config()
    wiring = Wiring.of(cfg)
    engine = RemoteEngine([("127.0.0.1", 9)], tmp_path, save_params=None, health_interval_s=0)
    engine.replicas[0].alive = False  # the only replica has died
    settings = OrchestratorSettings(
        group_size=4, max_concurrency=8, limits=wiring.limits(), sampling=wiring.sampling()
    )
    orch = Orchestrator(
        engine, GroupQueue(4), settings, make_env=wiring.make_env, make_agent=wiring.make_agent
    )
    tasks = task_stream(cfg.env.tasks, "train", 4)
    with pytest.raises(EngineClosed, match="no rollout engine"):
        asyncio.run(orch.run(tasks))


def test_health_checks_mark_a_silent_replica_dead(tmp_path):
    """No request needed: the periodic health check notices a replica that stopped answering."""
    import socket

    from asyncrl.serving.client import RemoteEngine

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = RemoteEngine([("127.0.0.1", port)], tmp_path, save_params=None, health_interval_s=0.05)
    deadline = time.monotonic() + 10
    while engine.live and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.close()
    assert engine.exhausted and engine.lost == [f"127.0.0.1:{port}"]
