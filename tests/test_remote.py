"""Remote rollout: engines in their own processes on loopback; the trainer survives losing one."""

import json
import os
import signal
import threading
import time

import pytest

from asyncrl.testing.configs import TINY_ENGINE_OVERRIDES, micro_config


@pytest.mark.slow  # two replica processes and real training (~2 min); the fast protocol cases stay
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

    from asyncrl.envs.tasks import task_stream
    from asyncrl.rollout.groups import GroupQueue
    from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings
    from asyncrl.sampling.protocol import EngineClosed
    from asyncrl.serving.admission import ReplicaState
    from asyncrl.serving.client import RemoteEngine
    from asyncrl.wiring.episodes import Wiring

    cfg = micro_config()
    wiring = Wiring.of(cfg)
    engine = RemoteEngine([("127.0.0.1", 9)], tmp_path, save_params=None, health_interval_s=0)
    engine.replicas[0].state = ReplicaState.DEAD  # the only replica has died
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


# -- the replica as an operator starts it ---------------------------------------------------------


def test_the_replica_settings_come_from_the_config_and_flags_override_them():
    from asyncrl.serving.replica import settings_for

    cfg = micro_config(
        "cluster.rollout_bind_host=0.0.0.0",
        "cluster.rollout_port=9001",
        "cluster.rollout_read_timeout_s=7",
    )
    s = settings_for(cfg)
    # rollout.max_concurrency=8 in the micro config: 2 x 8 + 16 connections when the key is 0.
    assert (s.host, s.port, s.max_connections, s.read_timeout_s) == ("0.0.0.0", 9001, 32, 7.0)
    s = settings_for(cfg, host="127.0.0.1", port=0, max_connections=5, read_timeout_s=1.5)
    assert (s.host, s.port, s.max_connections, s.read_timeout_s) == ("127.0.0.1", 0, 5, 1.5)
    capped = settings_for(micro_config("cluster.rollout_max_connections=3"))
    assert capped.max_connections == 3


def test_the_client_keeps_the_configured_number_of_weight_versions():
    from asyncrl.serving.client_settings import ClientSettings
    from asyncrl.serving.wire import reply_bytes_for

    s = ClientSettings.of(micro_config("cluster.rollout_keep_versions=5"))
    assert s.keep_versions == 5 and s.max_reply_bytes == reply_bytes_for(256)


@pytest.mark.slow  # the replica compiles its engine first: ~15 s alone, a minute on a busy host
@pytest.mark.entry
def test_asyncrl_rollout_server_serves_token_holders_only(tmp_path, monkeypatch):
    """`asyncrl rollout-server` with a token file on port 0: it announces its address in the ready
    file, answers an authenticated health call, refuses a peer without the token, and stops on
    SIGTERM."""
    import subprocess
    import sys

    from asyncrl.config import to_yaml
    from asyncrl.serving.auth import TOKEN_ENV, load_token
    from asyncrl.serving.client import RemoteEngine

    monkeypatch.delenv(TOKEN_ENV, raising=False)  # the flag is the only way to the token
    config, token_file, ready = tmp_path / "c.yaml", tmp_path / "token", tmp_path / "address"
    config.write_text(to_yaml(micro_config()))
    token_file.write_text("an-operator's-token-0123456789\n")
    token_file.chmod(0o600)
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "rollout-server",
        str(config),
        *TINY_ENGINE_OVERRIDES,
    ]
    cmd += ["--port", "0", "--token-file", str(token_file), "--ready-file", str(ready)]
    cmd += ["--weights-root", str(tmp_path / "weights")]
    log = (tmp_path / "replica.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None, (tmp_path / "replica.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the replica did not announce itself"
            time.sleep(0.1)
        host, port = ready.read_text().rsplit(":", 1)
        address = [(host, int(port))]
        assert host == "127.0.0.1" and int(port) > 0  # loopback by default, a free port

        holder = RemoteEngine(address, tmp_path, None, 0, token=load_token(token_file))
        health = holder.health()[f"{host}:{port}"]
        assert health["ok"] is True and health["version"] == 0

        stranger = RemoteEngine(address, tmp_path, None, 0)  # no token anywhere
        assert stranger.health()[f"{host}:{port}"]["ok"] is False
        assert stranger.exhausted and stranger.replicas[0].cause.startswith("auth: ")
        assert holder.health()[f"{host}:{port}"]["ok"] is True  # still serving its peers
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == -signal.SIGTERM
    assert f"LISTENING {host}:{port}" in (tmp_path / "replica.log").read_text()


# -- re-admission ---------------------------------------------------------------------------------


def test_the_probe_backoff_and_model_digest_come_from_the_config():
    from asyncrl.config import load_config_text, to_yaml
    from asyncrl.serving.admission import model_digest
    from asyncrl.serving.client_settings import ClientSettings

    cfg = micro_config(
        "cluster.rollout_probe_interval_s=0.5", "cluster.rollout_probe_max_backoff_s=9"
    )
    s = ClientSettings.of(cfg)
    assert (s.probe_interval_s, s.probe_max_backoff_s) == (0.5, 9.0)
    # A local replica reads the trainer's config from YAML: the same digest, so it is admitted;
    # another model, tokenizer or context window is not.
    assert s.model_digest == model_digest(load_config_text(to_yaml(cfg)))
    narrower = (
        "env.max_context=128",
        "rollout.prefill_buckets=[128]",
        "rollout.attention_windows=[128]",
    )
    for change in (("model.n_layers=1",), ("tokenizer.chat_format=llama3",), narrower):
        assert model_digest(micro_config(*change)) != s.model_digest, change
    assert model_digest(micro_config("cluster.rollout_port=9000")) == model_digest(micro_config())


@pytest.mark.parametrize(
    "overrides, key, allowed",
    [
        (["cluster.rollout_probe_interval_s=0"], "rollout_probe_interval_s", "[0.01, 2592000]"),
        (["cluster.rollout_probe_max_backoff_s=.nan"], "rollout_probe_max_backoff_s", "finite"),
        (
            ["cluster.rollout_probe_interval_s=10", "cluster.rollout_probe_max_backoff_s=5"],
            "rollout_probe_max_backoff_s",
            "seconds >= rollout_probe_interval_s (10)",
        ),
    ],
)
def test_bad_probe_settings_are_refused_naming_the_key(overrides, key, allowed):
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match=f"cluster.{key}") as e:
        micro_config(*overrides)
    assert allowed in str(e.value)


def _start_replica(tmp_path, config, token_file, name: str, port: int = 0):
    """A replica process as an operator starts it; returns (process, port) once it serves."""
    import subprocess
    import sys

    ready = tmp_path / f"{name}.address"
    cmd = [sys.executable, "-m", "asyncrl.serving.replica", str(config), *TINY_ENGINE_OVERRIDES]
    cmd += ["--port", str(port), "--token-file", str(token_file), "--ready-file", str(ready)]
    cmd += ["--weights-root", str(tmp_path / "weights")]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    log = (tmp_path / f"{name}.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while not ready.exists():
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"{name} did not announce itself"
        time.sleep(0.1)
    return proc, int(ready.read_text().rsplit(":", 1)[1])


def _until(condition, timeout_s: float) -> float:
    """Seconds until `condition()` held (it must within `timeout_s`)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.slow  # four replica processes, each compiling its engine: ~1 min idle, more loaded
def test_a_killed_replica_restarted_on_its_port_is_readmitted_with_the_current_weights(
    tmp_path, monkeypatch
):
    """SIGKILL one of two real replicas: its request fails (the orchestrator retries it), the
    other serves on. A process on the same port with another token is never admitted; one with
    the shared token is, within the probe backoff, at the trainer's current version, and serves."""
    import asyncio

    from asyncrl.config import to_yaml
    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.sampling.protocol import EngineClosed
    from asyncrl.serving.admission import ReplicaState
    from asyncrl.serving.auth import TOKEN_ENV, load_token
    from asyncrl.serving.client import RemoteEngine
    from asyncrl.serving.client_settings import ClientSettings
    from asyncrl.types import GenerateRequest, SamplingParams

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    probing = ("cluster.rollout_probe_interval_s=0.2", "cluster.rollout_probe_max_backoff_s=1")
    cfg = micro_config(*TINY_ENGINE_OVERRIDES, *probing)
    config = tmp_path / "c.yaml"
    config.write_text(to_yaml(micro_config()))  # the tiny engine comes as overrides, as in cfg
    token_file, wrong_file = tmp_path / "token", tmp_path / "wrong-token"
    token_file.write_text("the-shared-test-token-0123456789\n")
    wrong_file.write_text("a-stale-replicas-token-987654321\n")
    procs = []
    try:
        (a, port_a), (b, port_b) = (
            _start_replica(tmp_path, config, token_file, name) for name in ("a", "b")
        )
        procs += [a, b]
        remote = RemoteEngine(
            [("127.0.0.1", port_a), ("127.0.0.1", port_b)],
            tmp_path / "weights",
            lambda model, folder: hf.save(model, str(folder)),
            0,
            token=load_token(token_file),
            settings=ClientSettings.of(cfg),
        )
        request = GenerateRequest(prompt=(1, 2, 3), params=SamplingParams(max_tokens=4, seed=5))

        def generate():
            return asyncio.run(remote.generate(request))

        def versions():
            health = remote.health()
            return [health[r.name].get("version") for r in remote.replicas]

        model = build_model(cfg.model, seed=cfg.seed)
        remote.publish(model, 1)
        _until(lambda: versions() == [1, 1], 60)
        assert set(generate().versions) == {1}

        a.kill()  # SIGKILL: no goodbye
        a.wait(10)
        with pytest.raises(EngineClosed, match=f"127.0.0.1:{port_a} is gone"):
            generate()  # in flight on the dead one: the orchestrator's retry re-issues it
        assert set(generate().versions) == {1}  # on the other
        remote.publish(model, 2)
        _until(lambda: versions() == [None, 2], 60)

        stale, _ = _start_replica(tmp_path, config, wrong_file, "stale", port_a)
        procs.append(stale)
        probes = remote.replicas[0].probes
        _until(lambda: remote.replicas[0].probes >= probes + 3, 30)
        assert not remote.replicas[0].alive
        assert remote.replicas[0].probe_error.startswith("auth: it refused our token")
        stale.kill()
        stale.wait(10)

        back, _ = _start_replica(tmp_path, config, token_file, "back", port_a)
        procs.append(back)
        # Re-admitted within one capped backoff (1 s, plus a probe's own time).
        assert _until(lambda: remote.replicas[0].alive, 30) < 10
        b.kill()  # from now on only the re-admitted replica can serve
        b.wait(10)
        assert set(generate().versions) == {2}  # it loaded v2 before it served
        name = remote.replicas[0].name
        mine = [(t.state, t.version) for t in remote.transitions if t.replica == name]
        assert mine == [
            (ReplicaState.ALIVE, None),
            (ReplicaState.DEAD, None),
            (ReplicaState.READMITTED, 2),
        ]
        remote.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
