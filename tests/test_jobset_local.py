"""The GKE launch path on one machine: the local JobSet executor behind an in-process Kubernetes API

Fast tests drive the executor with small JobSets whose pods are short Python programs (what the
controller and kubelet do: environment, DNS names, token Secret, scratch, ordering, failure and
success policies, logs, cancellation). The slow ones run the JobSet the train stage renders,
with a real trainer and two rollout replicas: the GKE-shaped pipeline end to end through
kfp.local, a 2-host trainer equal step by step to one host replaying its recorded batches, a
trainer pod SIGKILLed and resumed, a replica SIGKILLed, a JobSet failing for good.
"""

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from asyncrl.cloud.jobset import GROUP, PLURAL, VERSION
from asyncrl.cloud.launcher import JobSetRunner
from asyncrl.cloud.local_cluster import local_cluster

NS = "asyncrl"
SECRET = "asyncrl-rollout-token"
WAIT_S = 60  # longest a fast test waits for a JobSet of small programs

# A replica: listens on argv[1]:argv[2], answers each connection with its hostname and token.
SERVER = textwrap.dedent(
    """
    import os, socket, sys
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen()
    print("serving on", s.getsockname()[0], flush=True)
    token = open(sys.argv[3]).read()
    while True:
        c, _ = s.accept()
        c.sendall(f"{os.environ['HOSTNAME']} {token}".encode())
        c.close()
    """
)
# A trainer: asks every address in ADDRS, writes what it saw to $OUT/<index>.json, then waits for
# $OUT/go (when it exists) and exits with $EXIT (default 0).
TRAINER = textwrap.dedent(
    """
    import json, os, socket, sys, time
    seen = []
    for address in os.environ["ADDRS"].split(","):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as c:
            seen.append(c.recv(200).decode())
    index = os.environ["JOB_COMPLETION_INDEX"]
    report = {
        "seen": seen,
        "index": index,
        "process_id": os.environ["PROCESS_ID"],
        "hostname": os.environ["HOSTNAME"],
        "scratch": open(sys.argv[1]).read(),
        "token_env": open(os.environ["TOKEN_FILE"]).read(),
    }
    out = os.environ["OUT"]
    open(os.path.join(out, index + ".json"), "w").write(json.dumps(report))
    print("trainer", index, "saw", len(seen), "replicas", flush=True)
    while os.environ.get("WAIT") and not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
    raise SystemExit(int(os.environ.get("EXIT", "0")))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pod(command, env=(), port=None):
    container = {
        "name": "main",
        "image": "local",
        "command": command,
        "env": list(env),
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/tmp"},
            {"name": "token", "mountPath": "/var/run/asyncrl/token", "readOnly": True},
        ],
    }
    if port:
        container["ports"] = [{"name": "rollout", "containerPort": port}]
        container["readinessProbe"] = {"tcpSocket": {"port": "rollout"}}
    secret = {"secretName": SECRET, "items": [{"key": "token", "path": "token"}]}
    return {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "token", "secret": secret}],
    }


def _job(name, replicas, pods, spec, **extra):
    template = {"metadata": {"labels": {"role": name}}, "spec": spec}
    job = {
        "parallelism": pods,
        "completions": pods,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": template,
    }
    return {"name": name, "replicas": replicas, **extra, "template": {"spec": job}}


def small_jobset(name, out: Path, *, trainers=2, replicas=2, env=(), max_restarts=0, rules=()):
    """Replicas first, trainers (an indexed job) once they are ready, as render_jobset does."""
    port = _free_port()
    addresses = ",".join(f"{name}-rollout-{i}-0.{name}:{port}" for i in range(replicas))
    serve = ["python", "-c", SERVER, "0.0.0.0", str(port), "/var/run/asyncrl/token/token"]
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    trainer_env = [
        {"name": "ADDRS", "value": addresses},
        {"name": "OUT", "value": str(out)},
        {"name": "TOKEN_FILE", "value": "/var/run/asyncrl/token/token"},
        {"name": "PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": index}}},
        {"name": "CODE", "value": TRAINER},
        *env,
    ]
    script = 'echo "scratch of $HOSTNAME" > /tmp/note && exec python -c "$CODE" /tmp/note'
    jobs = [
        _job("rollout", replicas, 1, _pod(serve, port=port)),
        _job(
            "trainer",
            1,
            trainers,
            _pod(["sh", "-c", script], trainer_env),
            dependsOn=[{"name": "rollout", "status": "Ready"}],
        ),
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": {"maxRestarts": max_restarts, "rules": list(rules)},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
            "replicatedJobs": jobs,
        },
    }


@pytest.fixture
def cluster(tmp_path):
    with local_cluster(tmp_path / "cluster", NS, SECRET, shared=(tmp_path,)) as c:
        yield c


def _token(cluster) -> str:
    import base64

    secret = client.CoreV1Api(cluster.api_client()).read_namespaced_secret(SECRET, NS)
    return base64.b64decode(secret.data["token"]).decode()


def _wait(predicate, what, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_jobset_runs_as_rendered_with_what_kubernetes_injects(cluster, tmp_path):
    """Two trainer pods reach both replicas by their headless-service names, read the Secret's
    token, have their own /tmp and completion index; the JobSet completes and the replicas stop."""
    out = tmp_path / "out"
    out.mkdir()
    runner = JobSetRunner(cluster.api_client(), NS, poll_s=0.1)
    outcome = runner.run(small_jobset("js-a", out), timeout_s=WAIT_S)
    assert outcome.state == "Completed", (outcome.message, outcome.logs, cluster.executor.errors)
    token = _token(cluster)
    reports = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    for i, report in enumerate(reports):
        assert report["index"] == report["process_id"] == str(i)
        assert report["hostname"] == f"js-a-trainer-0-{i}"
        assert report["scratch"] == f"scratch of js-a-trainer-0-{i}\n"  # its own /tmp
        assert report["token_env"] == token
        assert report["seen"] == [f"js-a-rollout-{r}-0 {token}" for r in range(2)]
    assert cluster.executor.pods("js-a") == []  # the replicas were stopped with the JobSet


def test_pods_logs_status_and_addresses_through_the_api(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    custom = client.CustomObjectsApi(cluster.api_client())
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_jobset("js-b", out, trainers=1, env=[_wait_env()])
    )
    core = client.CoreV1Api(cluster.api_client())
    trainer = _wait(lambda: cluster.executor.pods("js-b", "trainer"), "the trainer pod")[0]
    replicas = cluster.executor.pods("js-b", "rollout")
    ips = {p.ip for p in [trainer, *replicas]}
    assert len(ips) == 3 and all(ip.startswith("127.") for ip in ips)  # one address per pod
    for pod in replicas:  # ready (probe passed) before the trainer was created
        got = core.read_namespaced_pod(pod.name, NS)
        assert got.status.phase == "Running" and got.status.pod_ip == pod.ip
        assert {c.type: c.status for c in got.status.conditions}["Ready"] == "True"
        log = core.read_namespaced_pod_log(pod.name, NS, tail_lines=1)
        assert log == f"serving on {pod.ip}\n"  # 0.0.0.0 is the pod's own address
    (out / "go").touch()
    _wait(lambda: _status(cluster, "js-b").get("terminalState"), "the JobSet to end")
    done = core.read_namespaced_pod(trainer.name, NS)
    assert done.status.phase == "Succeeded"
    assert done.status.container_statuses[0].state.terminated.exit_code == 0
    assert done.metadata.labels["jobset.sigs.k8s.io/jobset-name"] == "js-b"


def _wait_env():
    return {"name": "WAIT", "value": "1"}


def _status(cluster, name) -> dict:
    custom = client.CustomObjectsApi(cluster.api_client())
    return custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name).get("status") or {}


def test_a_failing_trainer_restarts_the_jobset_then_fails_it_with_the_log_tail(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    jobset = small_jobset(
        "js-c", out, trainers=1, replicas=1, max_restarts=2, env=[{"name": "EXIT", "value": "3"}]
    )
    runner = JobSetRunner(cluster.api_client(), NS, poll_s=0.1)
    outcome = runner.run(jobset, timeout_s=WAIT_S)
    assert outcome.state == "Failed" and outcome.restarts == 2
    assert "ReachedMaxRestarts" in outcome.message and "exited with 3" in outcome.message
    (pod,) = [p for p in outcome.logs if "-trainer-" in p]  # the last attempt's pod, kept
    assert outcome.logs[pod] == "trainer 0 saw 1 replicas\n"


def test_a_killed_replica_restarts_alone_while_the_trainer_carries_on(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rule = {"name": "Replica", "action": "RestartJob", "targetReplicatedJobs": ["rollout"]}
    custom = client.CustomObjectsApi(cluster.api_client())
    jobset = small_jobset("js-d", out, trainers=1, max_restarts=1, env=[_wait_env()], rules=[rule])
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, jobset)
    trainer = _wait(lambda: cluster.executor.pods("js-d", "trainer"), "the trainer pod")[0]
    _wait((out / "0.json").exists, "the trainer to reach both replicas")
    victim = next(p for p in cluster.executor.pods("js-d", "rollout") if "-rollout-1-" in p.name)
    os.kill(victim.pid, signal.SIGKILL)

    def replaced():
        pods = [p for p in cluster.executor.pods("js-d", "rollout") if "-rollout-1-" in p.name]
        return pods and pods[0].name != victim.name and pods[0].ready and pods[0]

    again = _wait(replaced, "a ready replacement replica")
    assert again.ip == victim.ip  # same hostname, same address
    status = _status(cluster, "js-d")
    assert status["restarts"] == 0  # the JobSet was not restarted
    rollout = next(s for s in status["replicatedJobsStatus"] if s["name"] == "rollout")
    assert rollout["jobRestarts"] == [0, 1]
    assert cluster.executor.pods("js-d", "trainer")[0].pid == trainer.pid  # untouched
    (out / "go").touch()
    _wait(lambda: _status(cluster, "js-d").get("terminalState") == "Completed", "completion")


LAUNCH = textwrap.dedent(
    """
    import json, sys
    from asyncrl.cloud.launcher import JobSetRunner, kube_api_client, sigterm_cancels
    runner = JobSetRunner(kube_api_client(), "asyncrl", poll_s=0.1)
    print("launching", flush=True)
    with sigterm_cancels():
        runner.run(json.loads(sys.argv[1]), timeout_s=600)
    """
)


def test_a_cancelled_launcher_deletes_its_jobset_and_the_pods_stop(cluster, tmp_path):
    """SIGTERM (how KFP cancels a task) to a launcher process: its JobSet is deleted, so its pods
    are stopped and deleted, nothing keeps running."""
    out = tmp_path / "out"
    out.mkdir()
    jobset = small_jobset("js-e", out, trainers=1, replicas=1, env=[_wait_env()])
    env = {**os.environ, **cluster.env()}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, json.dumps(jobset)], env=env, stdout=subprocess.PIPE
    )
    pods = _wait(
        lambda: len(cluster.executor.pods("js-e")) == 2 and cluster.executor.pods("js-e"),
        "both pods",
        timeout_s=120,
    )
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(60) != 0
    _wait(lambda: not cluster.executor.runs.get("js-e"), "the executor to drop the JobSet")
    assert all(p.poll() is not None for p in pods)
    listed = client.CoreV1Api(cluster.api_client()).list_namespaced_pod(NS).items
    assert [p.metadata.name for p in listed if "js-e" in p.metadata.name] == []
    with pytest.raises(client.exceptions.ApiException) as gone:
        client.CustomObjectsApi(cluster.api_client()).get_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "js-e"
        )
    assert gone.value.status == 404


# -- the JobSet the train stage renders: a real trainer and two rollout replicas ------------------

GKE = (
    "cluster.backend=gke",
    "cluster.placement=remote",
    "cluster.rollout_replicas=2",
    "cluster.tpu_type=v6e",
    "cluster.tpu_topology=2x2",  # one host of four chips: a 1-process trainer
    "cluster.project=local",
    "cluster.location=local",
    "cluster.cluster_name=local",
    "cluster.node_pool=local-pool",
)
SLOW_S = 900  # longest a slow test waits for a training JobSet on a loaded 2-core machine


def _training_config(tmp_path, *overrides):
    from asyncrl.testing.configs import micro_config

    return micro_config(
        *GKE,
        f"cluster.rollout_port={_free_port()}",
        "learner.steps=6",
        "learner.eval_every=0",
        "env.heldout_size=1",
        "env.train_size=16",
        "checkpoint.every_steps=2",
        "rollout.failure_policy=retry",  # episodes on a lost replica are retried elsewhere
        "rollout.max_retries=3",
        "tracing.tensorboard=false",
        f"pipeline.runs_dir={tmp_path / 'runs'}",
        *overrides,
    )


def _launch(cfg, cluster, layout, **kw):
    from asyncrl.cloud.launcher import run_training_jobset

    return run_training_jobset(cfg, layout, None, cluster.api_client(), poll_s=0.5, **kw)


def _in_background(fn):
    """Run `fn` in a daemon thread; returns a dict that gets its result or its error."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    threading.Thread(target=run, daemon=True).start()
    return box


def _continues(saved: dict, final: dict) -> bool:
    """The data cursor after a resume (as stages/recovery_test.py judges it): the groups trained
    before the checkpoint start the final record, none is trained twice or both trained and
    dropped, and every group ever issued is trained, dropped or pending."""
    before, after = saved["state"]["cursor"], final["state"]["cursor"]
    trained = after["trained"]
    return (
        trained[: len(before["trained"])] == before["trained"]
        and len(set(trained)) == len(trained)
        and not set(trained) & set(after["dropped"])
        and set(trained) | set(after["dropped"]) | set(after["pending"])
        == set(range(after["next_index"]))
    )


@pytest.mark.slow
def test_a_killed_trainer_pod_restarts_the_jobset_and_resumes_without_losing_a_task(tmp_path):
    from asyncrl.checkpoint.manager import Checkpointer
    from asyncrl.cloud.jobset import jobset_name
    from asyncrl.run_layout import RunLayout

    cfg = _training_config(tmp_path)
    layout = RunLayout.at(cfg.pipeline.runs_dir, "kill-trainer").create()
    name = jobset_name(layout.run_id)
    with local_cluster(tmp_path / "cluster", NS, SECRET, shared=(tmp_path,)) as cluster:
        checkpoints = Checkpointer(layout.checkpoints)

        def kill_after_the_first_checkpoint():
            _wait(lambda: (checkpoints.latest_step() or 0) >= 2, "a checkpoint", SLOW_S)
            (pod,) = cluster.executor.pods(name, "trainer")
            os.kill(pod.pid, signal.SIGKILL)
            assert pod.process.wait(30) == -signal.SIGKILL
            at_kill = checkpoints.latest_step()
            seen = _wait(lambda: _status(cluster, name).get("restarts"), "the restart", SLOW_S)
            return at_kill, checkpoints.read_pipeline(at_kill), seen

        killer = _in_background(kill_after_the_first_checkpoint)
        result = _launch(cfg, cluster, layout)
        _wait(lambda: killer, "the killer's report")
        assert "error" not in killer, killer.get("error")
        at_kill, saved, restarts = killer["value"]
        final = checkpoints.read_pipeline(checkpoints.latest_step())
        checkpoints.close()
    assert restarts == 1 and 2 <= at_kill < cfg.learner.steps  # killed mid-run, restarted once
    assert result.steps == cfg.learner.steps
    resumed = json.loads(layout.resume_record.read_text())
    assert resumed["step"] == at_kill  # the restarted trainer resumed from the newest checkpoint
    assert resumed["digest"] == saved["digest"]  # bit-identical arrays
    assert _continues(saved, final)


@pytest.mark.slow
def test_a_killed_replica_does_not_stop_training(tmp_path):
    from asyncrl.cloud.jobset import jobset_name
    from asyncrl.run_layout import RunLayout

    cfg = _training_config(tmp_path, "checkpoint.every_steps=0")
    layout = RunLayout.at(cfg.pipeline.runs_dir, "kill-replica").create()
    name = jobset_name(layout.run_id)

    def trained_steps() -> int:
        rows = (
            layout.train_metrics.read_text().splitlines() if layout.train_metrics.exists() else []
        )
        return sum('"kind": "train"' in r for r in rows)

    with local_cluster(tmp_path / "cluster", NS, SECRET, shared=(tmp_path,)) as cluster:

        def kill_a_replica_after_two_steps():
            _wait(lambda: trained_steps() >= 2, "two train steps", SLOW_S)
            victim = next(
                p for p in cluster.executor.pods(name, "rollout") if "-rollout-0-" in p.name
            )
            os.kill(victim.pid, signal.SIGKILL)
            status = _wait(
                lambda: next(
                    (
                        s
                        for s in _status(cluster, name)["replicatedJobsStatus"]
                        if s["jobRestarts"][0]
                    ),
                    None,
                ),
                "the replica's job to restart",
                SLOW_S,
            )
            return trained_steps(), status, _status(cluster, name)["restarts"]

        killer = _in_background(kill_a_replica_after_two_steps)
        result = _launch(cfg, cluster, layout)
        _wait(lambda: killer, "the killer's report")
        assert "error" not in killer, killer.get("error")
        at_kill, rollout, restarts = killer["value"]
    assert at_kill < cfg.learner.steps  # the replica died mid-run
    assert rollout["name"] == "rollout" and rollout["jobRestarts"] == [1, 0]
    assert restarts == 0  # only the replica's job was restarted, not the JobSet
    trainer_pods = list((tmp_path / "cluster" / "pods").glob(f"{name}-trainer-*"))
    assert len(trainer_pods) == 1  # one trainer process from start to end
    assert result.steps == cfg.learner.steps
    rows = [json.loads(line) for line in layout.train_metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 7))


def _pod_log(cluster_dir: Path, pod_prefix: str) -> str:
    """The log of the one pod whose name starts with `pod_prefix` (what pods/log serves)."""
    (folder,) = [p for p in (cluster_dir / "pods").iterdir() if p.name.startswith(pod_prefix)]
    return (folder / "log").read_text()


def _replay(cfg, records: Path, out: Path, devices: int) -> None:
    """`asyncrl.testing.replay` in one fresh process with `devices` CPU devices and the pods'
    environment (the image's: no XLA flags of this test session's), so it compiles as they do."""
    from asyncrl.cloud.local_jobset import image_env
    from asyncrl.config import to_yaml

    config = out.parent / "replay-config.yaml"
    config.write_text(to_yaml(cfg))
    env = image_env() | {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    command = [sys.executable, "-m", "asyncrl.testing.replay", str(config), str(records), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SLOW_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _shard_digests(params: dict) -> dict[str, str]:
    """What `note_trained` writes for a host holding every parameter whole: name[0:n,...]."""
    import hashlib

    import numpy as np

    return {
        f"{name}[{','.join(f'0:{n}' for n in a.shape)}]": hashlib.sha256(
            np.ascontiguousarray(a).tobytes()
        ).hexdigest()
        for name, a in params.items()
    }


@pytest.mark.slow
def test_a_two_host_trainer_trains_six_steps_like_one_host_on_the_same_batches(tmp_path):
    """v5p 2x2x2 is two hosts: the rendered JobSet's trainer is an indexed job of two pods that
    join one jax.distributed job through the headless-service name of pod 0, beside two rollout
    replicas. It trains 6 steps, saving checkpoints together (Orbax's multi-host path) and
    publishing each version from process 0; both processes return the same result.

    Process 0 records what it trained on (ASYNCRL_RECORD_STEPS, in the pods' image environment):
    each step's batch, loss and parameters. One process with two devices (the same data-parallel
    mesh, the same learner config and initial model) replays the recorded batches in order; its
    loss and parameters after each step equal the 2-host run's within test_multihost's EXACT (0:
    one device per host, so the gradient all-reduce adds two terms, which commute). The record is
    tied to the run: its losses are the logged ones, and its last parameters are what each host
    holds at the end (each host's own shard digests)."""
    import numpy as np
    from test_multihost import EXACT

    from asyncrl.cloud.jobset import jobset_name
    from asyncrl.run_layout import RunLayout
    from asyncrl.wiring import step_record

    cfg = _training_config(
        tmp_path,
        "cluster.tpu_type=v5p",
        "cluster.tpu_topology=2x2x2",  # 2 hosts (config/topology.py): two trainer processes
        "cluster.mesh_data=2",  # one CPU device per pod here: a replica of the parameters each
        "cluster.mesh_fsdp=1",
        # The micro model earns no reward, so every advantage is 0: what moves the parameters is
        # weight decay, then the KL term's gradient (kl_coef 0.1) once they left the reference;
        # at this rate that gradient is not negligible, and the loss is not 0 from step 2 on.
        "learner.weight_decay=0.1",
        "learner.lr=1e-3",
    )
    assert cfg.cluster.hosts == 2 and cfg.learner.steps == 6
    layout = RunLayout.at(cfg.pipeline.runs_dir, "two-hosts").create()
    name = jobset_name(layout.run_id)
    with local_cluster(tmp_path / "cluster", NS, SECRET, shared=(tmp_path,)) as cluster:
        cluster.executor.base_env[step_record.ENV] = "1"  # as if set in the trainer's image
        result = _launch(cfg, cluster, layout)
    assert result.steps == 6
    pods = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cluster" / "pods").iterdir())
    assert pods == [f"{name}-rollout-0-0", f"{name}-rollout-1-0"] + [
        f"{name}-trainer-0-{i}" for i in range(2)
    ]
    said = [
        [
            x
            for x in _pod_log(tmp_path / "cluster", f"{name}-trainer-0-{i}").splitlines()
            if "train: " in x
        ]
        for i in range(2)
    ]
    assert len(said[0]) == len(said[1]) == 1  # one result line each, the same result
    assert said[0][0].split("train: ", 1)[1] == said[1][0].split("train: ", 1)[1]
    assert said[0][0].split("train: ", 1)[1].startswith("6 steps")
    rows = [json.loads(line) for line in layout.train_metrics.read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 7))
    assert (Path(layout.checkpoints) / "6").is_dir()  # saved by both processes together
    published = sorted(p.name for p in layout.weights.iterdir())  # what process 0 sent replicas
    assert published == ["v5", "v6"]  # the last two of six versions are kept

    recorded = step_record.read(layout.step_records)
    assert [r.step for r in recorded] == list(range(1, 7))
    assert [r.loss for r in recorded] == [r["loss"] for r in train_rows]
    hosts = [json.loads(layout.host_record(i).read_text()) for i in range(2)]
    assert [h["process"] for h in hosts] == [0, 1] and {h["processes"] for h in hosts} == {2}
    assert {h["step"] for h in hosts} == {6}
    assert len(hosts[0]["shards"]) > 1  # every parameter, whole on each host
    assert hosts[0]["shards"] == hosts[1]["shards"] == _shard_digests(recorded[-1].params)
    assert all(r.loss != 0 for r in recorded[1:])  # KL to the reference, through the model
    for before, after in itertools.pairwise(recorded):
        moved = [np.abs(after.params[k] - before.params[k]).max() for k in before.params]
        assert min(moved) > 0  # every step changes every parameter: equality is not trivial

    _replay(cfg, layout.step_records, tmp_path / "replay", devices=2)
    replayed = step_record.read(tmp_path / "replay")
    assert [r.step for r in replayed] == list(range(1, 7))
    for mine, theirs in zip(recorded, replayed, strict=True):
        assert abs(mine.loss - theirs.loss) <= EXACT, (mine.step, mine.loss, theirs.loss)
        assert sorted(mine.params) == sorted(theirs.params)
        worst = max(float(np.abs(mine.params[k] - theirs.params[k]).max()) for k in mine.params)
        assert worst <= EXACT, (mine.step, worst)


@pytest.mark.slow
def test_a_jobset_that_fails_for_good_fails_the_train_stage_with_the_pod_log_tail(tmp_path):
    """The train component itself (what the KFP task runs): its trainer cannot load the model
    it is given, every attempt; after maxRestarts the component raises with the trainer's last
    words."""
    from kfp import dsl

    from asyncrl.cloud.jobset import JobSetError
    from asyncrl.cloud.local_cluster import environment
    from asyncrl.config import to_yaml
    from asyncrl.pipeline.components import components
    from asyncrl.run_layout import RunLayout

    cfg = _training_config(
        tmp_path,
        "cluster.placement=colocated",
        "cluster.rollout_replicas=0",
        "cluster.max_restarts=1",  # from the config to the rendered failure policy
    )
    layout = RunLayout.at(cfg.pipeline.runs_dir, "fails").create()
    train = components("asyncrl-runtime:test").train.python_func
    missing = tmp_path / "no-such-model"
    with (
        local_cluster(tmp_path / "cluster", NS, SECRET, shared=(tmp_path,)) as cluster,
        environment(cluster.env()),
    ):
        with pytest.raises(JobSetError) as failed:
            train(
                to_yaml(cfg),
                str(layout.root),
                str(missing),
                dsl.Model(uri=str(tmp_path / "m")),
                dsl.Metrics(uri=str(tmp_path / "metrics")),
                dsl.Artifact(uri=str(tmp_path / "trace")),
                dsl.HTML(uri=str(tmp_path / "html")),
            )
        _wait(lambda: not cluster.executor.runs, "the executor to see the JobSet deleted")
    message = str(failed.value)
    assert "Failed (ReachedMaxRestarts" in message and "after 1 restarts" in message
    assert str(missing) in message.split("pod log tails:", 1)[1]  # the trainer's own error line


@pytest.mark.slow
def test_the_gke_shaped_pipeline_runs_end_to_end_on_the_local_executor(tmp_path):
    """configs/local-jobset.yaml (backend gke) through kfp.local: provision asks the loopback GKE
    API for the node pool, the train task launches the JobSet (trainer + 2 replicas) that the
    executor runs, the gate passes the model it trained, teardown deletes the node pool. The
    recovery test is left out: on gke it still runs inside its own task (not through a JobSet),
    five trainer restarts with their own replicas, which the other tests here cover."""
    from test_pipeline import TINY

    from asyncrl.cloud.jobset import jobset_name
    from asyncrl.config import load_config
    from asyncrl.pipeline.local import run_local
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.train import TrainResult
    from asyncrl.testing.gke_stub import gke_stub

    root = Path(__file__).parent.parent
    cfg = load_config(
        root / "configs/local-jobset.yaml",
        [
            *TINY,
            f"cluster.rollout_port={_free_port()}",
            f"pipeline.runs_dir={tmp_path / 'runs'}",
            f"gate.champion={tmp_path / 'ch'}",
            "pipeline.stages=[provision,warm_start,train,quality_gate,report]",
        ],
    )
    with gke_stub() as gke:
        gke.polls_to_run = 0
        with local_cluster(
            tmp_path / "cluster", NS, SECRET, shared=(tmp_path,), gke_endpoint=gke.endpoint
        ) as cluster:
            result = run_local(cfg, cluster)
        requests = [(method, path.rsplit("/", 1)[-1]) for method, path, _ in gke.requests]
    assert result.succeeded and result.final_state == "SUCCEEDED", result
    assert result.stages_done == (
        "provision",
        "warm_start",
        "train",
        "quality_gate",
        "promote",
        "report",
    )
    assert result.gate_passed is True
    assert requests.count(("POST", "nodePools")) == 2  # the trainer's and the replicas' pools
    deletes = [r for r in requests if r[0] == "DELETE"]
    assert deletes == [("DELETE", "local-v6e-2x2-rollout"), ("DELETE", "local-v6e-2x2")]
    layout = RunLayout.of(result.run_dir)
    assert layout.read(TrainResult).steps == cfg.learner.steps
    pods = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cluster" / "pods").iterdir())
    name = jobset_name(layout.run_id)
    assert pods == [f"{name}-rollout-0-0", f"{name}-rollout-1-0", f"{name}-trainer-0-0"]
    assert (layout.train_model / "model.safetensors").exists()


def test_the_launcher_streams_each_new_log_line_once(cluster, tmp_path):
    """What the KFP log shows while a JobSet runs: every line of every pod, whole, once."""
    out = tmp_path / "out"
    out.mkdir()
    shown: list[str] = []
    runner = JobSetRunner(cluster.api_client(), NS, poll_s=0.05)
    jobset = small_jobset("js-f", out, trainers=1, replicas=1)
    assert runner.run(jobset, timeout_s=WAIT_S, stream=shown.append).state == "Completed"
    trainer = [s for s in shown if "-trainer-0-0-" in s]
    assert [s.split("] ", 1)[1] for s in trainer] == ["trainer 0 saw 1 replicas"]
    replica = [s for s in shown if "-rollout-0-0-" in s]
    assert len(replica) == 1 and replica[0].split("] ", 1)[1].startswith("serving on 127.")
