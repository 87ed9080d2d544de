"""GKE path: JobSet rendering and validation (the rollout channel's flags, token and addresses
included), launch/watch/delete on a Kubernetes API emulator, the node-pool request against a
loopback GKE API, manifests, and two-process jax.distributed."""

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from asyncrl.cli import build_parser
from asyncrl.cloud.jobset import (
    ADDRESSES_ENV,
    GROUP,
    PLURAL,
    TOKEN_FILE,
    VERSION,
    job_manifests,
    jobset_name,
    render_jobset,
)
from asyncrl.cloud.launcher import JobSetRunner
from asyncrl.cloud.provision import (
    ProvisionError,
    delete_node_pool,
    provision_node_pool,
)
from asyncrl.config import ConfigError, load_config
from asyncrl.serving.auth import TOKEN_ENV
from asyncrl.testing.gke_stub import gke_stub
from asyncrl.testing.k8s import k8s_emulator

ROOT = Path(__file__).parent.parent
CRD = ROOT.parent / "shared" / "data" / "jobset.x-k8s.io_jobsets.yaml"
K8S_VERSION = "1.33.0"
GKE = ROOT / "configs" / "qwen2.5-0.5b-v6e.yaml"
# One data-parallel step over 2 processes vs 1 process: float32 reduction-order noise.
LOSS_TOL = 1e-5


def _closed(schema):
    """The CRD schema with additionalProperties: false wherever it lists properties (catches
    misspelled keys that an open schema would accept)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


@pytest.mark.skipif(not CRD.exists(), reason=f"the JobSet CRD is absent: {CRD}")
@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("cluster.placement=remote", "cluster.rollout_replicas=2"),
        ("cluster.max_restarts=0",),
        ("cluster.max_restarts=7", "cluster.jobset_timeout_s=900"),
    ],
)
def test_rendered_jobset_validates_offline(overrides):
    cfg = load_config(GKE, overrides)
    jobset = render_jobset(cfg, "asyncrl-run-1", "gs://bucket/runs/run-1")
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == cfg.cluster.max_restarts
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    jsonschema.validate(jobset, _closed(version["schema"]["openAPIV3Schema"]))
    for job in job_manifests(jobset):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    jobs = {rj["name"]: rj for rj in jobset["spec"]["replicatedJobs"]}
    trainer = jobs["trainer"]["template"]["spec"]
    assert trainer["parallelism"] == 1  # v6e 2x4: one host of eight chips (config/topology.py)
    container = trainer["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"google.com/tpu": "8"}
    env = {e["name"]: e for e in container["env"]}
    assert env["JAX_NUM_PROCESSES"]["value"] == "1"
    assert env["JAX_COORDINATOR_ADDRESS"]["value"].startswith("asyncrl-run-1-trainer-0-0.")
    assert "job-completion-index" in env["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    remote = "cluster.placement=remote" in overrides
    assert list(jobs) == (["rollout", "trainer"] if remote else ["trainer"])


def _script_argv(container) -> list[str]:
    """The command after `exec` in a stage container's `sh -c` script, split as sh would."""
    shell, flag, script = container["command"]
    assert (shell, flag) == ("sh", "-c")
    return shlex.split(script.split("exec ", 1)[1])


@pytest.mark.parametrize("port", [8470, 9123])
def test_remote_replicas_bind_all_interfaces_and_read_the_token_secret(port):
    cfg = load_config(
        GKE,
        [
            "cluster.placement=remote",
            "cluster.rollout_replicas=2",
            f"cluster.rollout_port={port}",
            "cluster.rollout_token_secret=run-1-token",
        ],
    )
    jobset = render_jobset(cfg, "run-1", "gs://bucket/runs/run-1")
    rollout, trainer = (
        rj["template"]["spec"]["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]
    )
    assert [rj["replicas"] for rj in jobset["spec"]["replicatedJobs"]] == [2, 1]
    argv = _script_argv(rollout["containers"][0])
    assert argv[:3] == ["asyncrl", "rollout-server", "/tmp/config.yaml"]
    args = build_parser().parse_args(argv[1:])  # the CLI's own flags: a typo fails to parse
    assert (args.host, args.port, args.token_file) == ("0.0.0.0", port, TOKEN_FILE)
    assert args.run_dir == "$ASYNCRL_RUN_DIR" and args.overrides == []
    assert rollout["containers"][0]["ports"] == [
        {"name": "rollout", "containerPort": port, "protocol": "TCP"}
    ]
    for pod in (trainer, rollout):
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == "run-1-token"
        assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
        assert mount["readOnly"] and f"{mount['mountPath']}/token" == TOKEN_FILE
    env = {e["name"]: e.get("value") for e in trainer["containers"][0]["env"]}
    assert env[TOKEN_ENV] == TOKEN_FILE
    assert env[ADDRESSES_ENV] == (f"run-1-rollout-0-0.run-1:{port},run-1-rollout-1-0.run-1:{port}")
    assert _script_argv(trainer["containers"][0])[:2] == ["asyncrl", "train"]


def test_the_trainer_reads_the_addresses_variable_the_jobset_sets():
    from asyncrl.wiring import training

    assert training.ADDRESSES_ENV == ADDRESSES_ENV


def test_without_remote_replicas_no_pod_mounts_the_token():
    jobset = render_jobset(load_config(GKE), "run-1", "gs://b/r")
    (trainer,) = [
        rj["template"]["spec"]["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]
    ]
    assert [v["name"] for v in trainer["volumes"]] == ["scratch", "runs"]  # runs: the bucket
    names = {e["name"] for e in trainer["containers"][0]["env"]}
    assert not {TOKEN_ENV, ADDRESSES_ENV} & names


def test_a_misspelled_key_is_caught_by_the_closed_schema():
    if not CRD.exists():
        pytest.skip(f"the JobSet CRD is absent: {CRD}")
    jobset = render_jobset(load_config(GKE), "x", "gs://b/r")
    jobset["spec"]["replicatedJob"] = jobset["spec"].pop("replicatedJobs")
    crd = yaml.safe_load(CRD.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            jobset, _closed(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        )


def _set_condition(k, name, kind, after_s):
    def later():
        time.sleep(after_s)
        from kubernetes import client

        client.CustomObjectsApi(k.api_client()).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "asyncrl",
            PLURAL,
            name,
            {"status": {"conditions": [{"type": kind, "status": "True", "message": f"{kind}!"}]}},
        )

    threading.Thread(target=later, daemon=True).start()


@pytest.mark.parametrize("ending", ["Completed", "Failed", "TimedOut"])
def test_launch_watch_and_delete_on_the_api_emulator(ending):
    """The runner reports how the JobSet ended and deletes it whatever the end."""
    cfg = load_config(GKE)
    jobset = render_jobset(cfg, f"run-{ending.lower()}", "gs://b/r")
    resources = (f"{GROUP}/{VERSION}/{PLURAL}", "v1/pods")
    with k8s_emulator(resources) as k:
        runner = JobSetRunner(k.api_client(), "asyncrl", poll_s=0.05)
        if ending != "TimedOut":
            _set_condition(k, jobset["metadata"]["name"], ending, after_s=0.3)
        polls = []
        outcome = runner.run(jobset, timeout_s=1.5, on_poll=polls.append)
        assert outcome.state == ending and len(polls) > 1
        assert {p.state for p in polls[:-1]} == {"Running"}
        assert outcome.message == (f"{ending}!" if ending != "TimedOut" else "after 2 s")
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        custom = client.CustomObjectsApi(k.api_client())
        with pytest.raises(ApiException) as gone:
            custom.get_namespaced_custom_object(GROUP, VERSION, "asyncrl", PLURAL, outcome.name)
        assert gone.value.status == 404


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("cluster.max_restarts=-1", "[0, 2147483647]"),
        ("cluster.max_restarts=2.5", "expected an int"),
        ("cluster.max_restarts=yes", "expected an int"),
        ("cluster.max_restarts=4294967296", "[0, 2147483647]"),
        ("cluster.jobset_timeout_s=0", "[1, 2592000]"),
        ("cluster.jobset_timeout_s=-60", "[1, 2592000]"),
        ("cluster.jobset_timeout_s=.nan", "finite"),
        ("cluster.jobset_timeout_s=.inf", "finite"),
        ("cluster.jobset_timeout_s=soon", "expected a float"),
        ("cluster.jobset_timeout_s=3600", "less than pipeline.timeout_s=3600"),
    ],
)
def test_bad_restart_and_timeout_keys_are_refused_naming_the_key(override, allowed):
    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError) as refused:
        load_config(GKE, [override])
    assert refused.value.key == key and allowed in str(refused.value)


def test_the_launchers_wait_bound_comes_from_the_config():
    from asyncrl.cloud.launcher import jobset_timeout

    assert jobset_timeout(load_config(GKE)) == 3600 - 120  # the KFP task's limit less a margin
    assert jobset_timeout(load_config(GKE, ["pipeline.timeout_s=200"])) == 100  # half, at least
    given = ["pipeline.timeout_s=200", "cluster.jobset_timeout_s=150"]
    assert jobset_timeout(load_config(GKE, given)) == 150
    again = load_config(GKE, ["cluster.jobset_timeout_s=null"])  # null: back to the derived bound
    assert again.cluster.jobset_timeout_s is None and jobset_timeout(again) == 3480


def test_the_launcher_deletes_a_jobset_that_outlives_the_configured_timeout(tmp_path):
    """No controller runs the JobSet: it stays Running until `cluster.jobset_timeout_s`, then the
    launcher fails the stage and deletes it; what it created carried `cluster.max_restarts`."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from asyncrl.cloud.jobset import JobSetError
    from asyncrl.cloud.launcher import run_training_jobset
    from asyncrl.run_layout import RunLayout

    cfg = load_config(GKE, ["cluster.jobset_timeout_s=2", "cluster.max_restarts=4"])
    layout = RunLayout.at(str(tmp_path / "runs"), "slow-run").create()
    name = jobset_name("slow-run")
    where = (GROUP, VERSION, "asyncrl", PLURAL)
    with k8s_emulator((f"{GROUP}/{VERSION}/{PLURAL}", "v1/pods")) as k:
        custom = client.CustomObjectsApi(k.api_client())
        seen: dict = {}

        def watch():
            deadline = time.monotonic() + 30
            while "policy" not in seen and time.monotonic() < deadline:
                try:
                    obj = custom.get_namespaced_custom_object(*where, name)
                    seen["policy"] = obj["spec"]["failurePolicy"]
                except ApiException:
                    time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = time.monotonic()
        with pytest.raises(JobSetError, match=r"TimedOut \(after 2 s\) after 0 restarts"):
            run_training_jobset(cfg, layout, None, k.api_client(), poll_s=0.05, say=lambda _: None)
        waited = time.monotonic() - start
        watcher.join(5)
        with pytest.raises(ApiException) as gone:
            custom.get_namespaced_custom_object(*where, name)
    assert gone.value.status == 404
    assert seen["policy"]["maxRestarts"] == 4
    assert 2 <= waited < 30


def test_jobset_names_are_short_dns_labels_and_keep_long_ids_apart():
    assert jobset_name("20261202-101500-abc123") == "asyncrl-20261202-101500-abc123"
    assert jobset_name("My_Run.v2") == "asyncrl-my-run-v2"
    a, b = jobset_name("x" * 60 + "a"), jobset_name("x" * 60 + "b")
    assert a != b and len(a) <= 40 and len(f"{a}-trainer-0-0") <= 63
    for name in (a, b, jobset_name("-Weird--ID-")):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


def test_the_trainer_waits_for_ready_replicas_and_replica_failures_restart_only_them():
    cfg = load_config(GKE, ["cluster.placement=remote", "cluster.rollout_replicas=2"])
    jobset = render_jobset(cfg, "run-1", "gs://bucket/runs/run-1", "/gcs/bucket/m", max_restarts=5)
    rollout, trainer = jobset["spec"]["replicatedJobs"]
    assert trainer["dependsOn"] == [{"name": "rollout", "status": "Ready"}]
    probe = rollout["template"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["tcpSocket"]["port"] == "rollout"
    policy = jobset["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5
    assert policy["rules"] == [
        {
            "name": "RolloutReplicaFailed",
            "action": "RestartJob",
            "targetReplicatedJobs": ["rollout"],
        }
    ]
    for rj in (rollout, trainer):  # both start from the given model, in the run folder
        pod = rj["template"]["spec"]["template"]
        argv = _script_argv(pod["spec"]["containers"][0])
        args = build_parser().parse_args(argv[1:])
        assert args.init_model == "/gcs/bucket/m" and args.run_dir == "$ASYNCRL_RUN_DIR"
        (fuse,) = [v for v in pod["spec"]["volumes"] if "csi" in v]
        assert fuse["csi"]["volumeAttributes"]["bucketName"] == "bucket"
        mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounts[fuse["name"]] == "/gcs/bucket"
        assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}


def test_a_local_run_folder_mounts_no_bucket():
    jobset = render_jobset(load_config(GKE), "run-1", "/srv/runs/run-1")
    (trainer,) = jobset["spec"]["replicatedJobs"]
    pod = trainer["template"]["spec"]["template"]
    assert "annotations" not in pod["metadata"]
    assert not [v for v in pod["spec"]["volumes"] if "csi" in v]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ASYNCRL_RUN_DIR"] == "/srv/runs/run-1"
    assert "rules" not in jobset["spec"]["failurePolicy"]  # no replicas, no replica rule


def test_node_pool_request_matches_its_snapshot_and_teardown_deletes_only_it():
    cfg = load_config(GKE, ["cluster.reservation=my-reservation"])
    with gke_stub() as stub:
        record = provision_node_pool(cfg, endpoint=stub.endpoint, poll_s=0.01)
        assert record["created"] and record["status"] == "RUNNING"
        create = [r for r in stub.requests if r[0] == "POST"]
        assert len(create) == 1
        _, path, body = create[0]
        snapshot = json.loads((ROOT / "tests/snapshots/node_pool_request.json").read_text())
        assert {"path": path, "body": body} == snapshot
        again = provision_node_pool(cfg, endpoint=stub.endpoint, poll_s=0.01)
        assert not again["created"]  # reused: teardown would leave it alone
        delete_node_pool(cfg, record, endpoint=stub.endpoint)
        assert stub.pools == {} and stub.requests[-1][0] == "DELETE"


REMOTE = ("cluster.placement=remote", "cluster.rollout_replicas=2")


def test_a_remote_run_provisions_a_rollout_pool_and_teardown_releases_both(tmp_path):
    from asyncrl.cloud.provision import NodePoolProvisioner
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.provision import ProvisionResult, teardown

    cfg = load_config(GKE, REMOTE)
    with gke_stub() as stub:
        provisioner = NodePoolProvisioner(endpoint=stub.endpoint, poll_s=0.01)
        trainer, rollout = provisioner.acquire(cfg)
        assert trainer.created and rollout.created and trainer.status == rollout.status == "RUNNING"
        posts = [body["nodePool"] for method, _, body in stub.requests if method == "POST"]
        assert [p["name"] for p in posts] == ["asyncrl-v6e-2x4", "asyncrl-v6e-2x4-rollout"]
        assert posts[1]["initialNodeCount"] == 2 and "placementPolicy" not in posts[1]
        assert posts[1]["config"]["machineType"] == "ct6e-standard-8t"
        assert posts[0]["placementPolicy"]["tpuTopology"] == "2x4"
        assert sorted(stub.pools) == sorted(f"/v1/{r.name}" for r in (trainer, rollout))
        layout = RunLayout.at(str(tmp_path / "runs"), "r").create()
        layout.write(
            ProvisionResult(
                run_id="r",
                run_dir=layout.location,
                backend="gke",
                devices="",
                created=(trainer, rollout),
            )
        )
        done = teardown(cfg, layout, "SUCCEEDED", provisioner)
        deletes = [path for method, path, _ in stub.requests if method == "DELETE"]
    assert stub.pools == {} and deletes == [f"/v1/{rollout.name}", f"/v1/{trainer.name}"]
    assert done.released == (rollout, trainer)  # the last acquired first


@pytest.mark.parametrize("trainer_pool_exists", [False, True])
def test_a_refused_rollout_pool_undoes_only_what_this_provision_created(trainer_pool_exists):
    """Provision is all or nothing: the run records no pools when it fails, so a trainer pool it
    created must go again (teardown would never see it); one it found already there stays."""
    from asyncrl.cloud.provision import NodePoolProvisioner

    cfg = load_config(GKE, REMOTE)
    with gke_stub() as stub:
        if trainer_pool_exists:
            provision_node_pool(cfg, endpoint=stub.endpoint, poll_s=0.01)
        stub.refuse_create = {"asyncrl-v6e-2x4-rollout": (429, "RESOURCE_EXHAUSTED", "Quota")}
        with pytest.raises(ProvisionError, match=r"asyncrl-v6e-2x4-rollout: TPU quota exceeded"):
            NodePoolProvisioner(endpoint=stub.endpoint, poll_s=0.01).acquire(cfg)
        left = [name.rsplit("/", 1)[1] for name in stub.pools]
    assert left == (["asyncrl-v6e-2x4"] if trainer_pool_exists else [])


def test_a_created_pool_that_never_runs_is_deleted_again():
    with gke_stub() as stub:
        stub.polls_to_run = 10**9
        with pytest.raises(ProvisionError, match=r"not RUNNING after 0\.2 s"):
            provision_node_pool(
                load_config(GKE), endpoint=stub.endpoint, timeout_s=0.2, poll_s=0.01
            )
        assert stub.pools == {} and stub.requests[-1][0] == "DELETE"


@pytest.mark.parametrize(
    ("refusal", "message"),
    [
        (
            (403, "PERMISSION_DENIED", "caller lacks container.nodePools.create"),
            "permission denied",
        ),
        ((429, "RESOURCE_EXHAUSTED", "Quota 'TPUV6E' exceeded"), "quota"),
    ],
)
def test_provision_errors_name_the_cause(refusal, message):
    with gke_stub() as stub:
        stub.refuse = refusal
        with pytest.raises(ProvisionError, match=message):
            provision_node_pool(load_config(GKE), endpoint=stub.endpoint, poll_s=0.01)


def test_unknown_topology_fails_before_any_request():
    with pytest.raises(ConfigError, match=r"3x3.*v6e slice GKE offers.*2x4"):
        load_config(GKE, ["cluster.tpu_topology=3x3"])  # refused with the config, before provision


def _manifests():
    docs = []
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_manifests_validate_strictly_and_kustomizations_are_complete():
    docs = _manifests()
    builtin = [(p, d) for p, d in docs if "kueue" not in d["apiVersion"]]
    assert {d["kind"] for _, d in builtin} >= {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
    }
    for _path, doc in builtin:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for kust in (ROOT / "manifests").rglob("kustomization.yaml"):
        for ref in yaml.safe_load(kust.read_text())["resources"]:
            assert (kust.parent / ref).exists(), f"{kust}: {ref} missing"
    role = next(d for _, d in builtin if d["kind"] == "Role")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and not any(d["kind"].startswith("Cluster") for _, d in builtin)
    namespace = next(d for _, d in builtin if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # Policies, pod security and RBAC in depth: tests/test_cluster_security.py.


@pytest.mark.slow  # two jax.distributed processes; tests/test_multihost.py keeps a fast relation
def test_two_process_jax_distributed_step_is_consistent_and_equals_one_process(tmp_path):
    """Two processes (one CPU device each) take one data-parallel SFT step of the micro model;
    both see the same loss and parameters, equal to the same step in a single process."""
    port = 20000 + os.getpid() % 20000
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncrl.testing.multihost", "--selftest"],
            env=env
            | {
                "JAX_PLATFORMS": "cpu",
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [
        json.loads(line.split(" ", 1)[1])
        for o in outs
        for line in o.splitlines()
        if line.startswith("SELFTEST ")
    ]
    assert [r["processes"] for r in results] == [2, 2] and results[0]["devices"] == 2
    assert results[0]["loss"] == results[1]["loss"]
    assert results[0]["params_digest"] == results[1]["params_digest"]
    single = subprocess.run(
        [sys.executable, "-m", "asyncrl.testing.multihost", "--selftest"],
        env=env | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    one = json.loads(
        next(x for x in single.stdout.splitlines() if x.startswith("SELFTEST ")).split(" ", 1)[1]
    )
    assert one["processes"] == 1 and one["devices"] == 2
    assert one["loss"] == pytest.approx(results[0]["loss"], abs=LOSS_TOL)


def test_on_gke_the_train_task_is_a_launcher_without_a_tpu():
    """The JobSet's pods hold the slice; a train task on a TPU node would hold one of its hosts."""
    spec = list(yaml.safe_load_all((ROOT / "pipelines/compiled/asyncrl-gke.yaml").read_text()))
    pipeline, platform = spec[0], spec[1]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = pipeline["deploymentSpec"]["executors"]
    assert "nodeSelector" not in executors["exec-train"]
    assert "accelerator" not in containers["exec-train"]["container"].get("resources", {})
    for task in ("exec-warm-start", "exec-recovery-test", "exec-quality-gate"):
        labels = executors[task]["nodeSelector"]["labels"]
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice", task
