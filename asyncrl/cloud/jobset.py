"""The rollout/trainer JobSet, rendered from the config (launched by launcher.py).

`render_jobset` is pure: a `jobset.x-k8s.io/v1alpha2` JobSet with up to two replicated jobs,
- `rollout` (placement `remote`, listed first): `cluster.rollout_replicas` rollout engine
  replicas, each bound to 0.0.0.0 on `cluster.rollout_port` and serving only peers that hold the
  shared token, which both sides read from the Secret `cluster.rollout_token_secret` mounted as a
  file; a TCP readiness probe on that port says when a replica serves; each on one single-host
  TPU node (`cluster.rollout_slice`) of the replicas' own node pool, `cluster.rollout_node_pool`;
- `trainer`: one Job over the TPU slice's hosts (an indexed Job: one pod per host, all started
  together), pods pinned to the run's node pool (`cluster.node_pool`, held exclusively by this
  job: JobSet's exclusive placement) and its accelerator and topology, `google.com/tpu` limits, and
  the `jax.distributed` wiring in the environment: the coordinator address (pod 0 of the trainer
  job, reached through the JobSet's headless service), the number of processes and each pod's
  process id (its completion index). With replicas it starts once they are all ready
  (`dependsOn`), and gets their addresses in ASYNCRL_ROLLOUT_ADDRESSES.
Both run `asyncrl` on the run folder (`--run-dir` the run's URI: a gs:// run folder is read at
its Cloud Storage FUSE path, mounted at /gcs/<bucket>) from the model training starts from.
Failures: a trainer pod that fails restarts the whole JobSet, up to `cluster.max_restarts` times
(training resumes from the run's newest checkpoint); a replica that fails restarts its own job
(`RestartJob`), and the trainer carries on with the others meanwhile. The trainer's success
completes the JobSet.
Every pod passes the `restricted` Pod Security Standard (non-root, seccomp RuntimeDefault, no
privilege escalation, all capabilities dropped, read-only root filesystem, only emptyDir and
secret volumes) and runs as the workload service account, which has no Kubernetes API rights and
no API token mounted: only the launcher (the pipeline's train pod) may create JobSets
(manifests/base/rbac.yaml). Port names match the NetworkPolicies in manifests/base/, which
select pods by their `role` label.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from typing import Any

from asyncrl.config import RunConfig, to_yaml
from asyncrl.config.topology import (  # the one table of GKE TPU slices
    ACCELERATOR,  # noqa: F401 - pipeline/definition.py imports it from here
    Slice,
    slice_of,
    slice_shape,  # noqa: F401 - likewise
)
from asyncrl.serving.auth import TOKEN_ENV

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
COORDINATOR_PORT = 8476
# The TPU runtime's slice-builder port between the hosts of one multi-host slice (GKE's
# multi-host TPU examples open it); pod-to-pod, since restricted pods may not use hostNetwork.
TPU_SLICE_PORT = 8471
# Trainer and rollout pods run model code: an identity with no RoleBinding and no mounted token.
WORKLOAD_SERVICE_ACCOUNT = "asyncrl-workload"
RUN_AS = 1000  # the runtime image's user (images/runtime.Dockerfile)
TOKEN_DIR = "/var/run/asyncrl/token"
TOKEN_FILE = f"{TOKEN_DIR}/token"
ADDRESSES_ENV = "ASYNCRL_ROLLOUT_ADDRESSES"  # read by asyncrl.wiring.training
FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"


def jobset_name(run_id: str) -> str:
    """The JobSet of a run: a DNS label short enough for `<name>-trainer-<i>-<j>` hostnames."""
    base = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    name = f"asyncrl-{base}".rstrip("-")
    if len(name) > 40:  # keep it unique: a digest of the whole id
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[:31].rstrip('-')}-{digest}"
    return name


def _stage_command(program: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """Write the config from the environment to scratch, then run `program` on it, in the run
    folder ASYNCRL_RUN_DIR (a gs:// folder is read and written at /gcs/<bucket>/..., its Cloud
    Storage FUSE path, by RunLayout)."""
    script = (
        'printf "%s" "$ASYNCRL_CONFIG_YAML" > /tmp/config.yaml && '
        f"exec {shlex.join(program)} /tmp/config.yaml "
        '--run-dir "$ASYNCRL_RUN_DIR"'
    )
    if extra:
        script += f" {shlex.join(extra)}"
    return ["sh", "-c", script]


def pod_security() -> dict[str, Any]:
    """The pod-level security context of every JobSet pod."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    """The container-level security context of every JobSet container."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _container(name, image, command, env, tpu_chips: int, ports) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "4", "memory": "16Gi"}}
    if tpu_chips:
        resources["limits"] = {"google.com/tpu": str(tpu_chips)}
        resources["requests"]["google.com/tpu"] = str(tpu_chips)
    return {
        "name": name,
        "image": image,
        "command": command,
        "env": env,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        "resources": resources,
        "securityContext": container_security(),
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
    }


def _with_token(pod_spec: dict[str, Any], secret: str) -> dict[str, Any]:
    """Mount the rollout token Secret read-only at TOKEN_DIR in the pod's container."""
    pod_spec["volumes"].append(
        {
            "name": "rollout-token",
            "secret": {
                "secretName": secret,
                "items": [{"key": "token", "path": "token"}],
                "defaultMode": 0o440,  # owner root, group RUN_AS (fsGroup): read only
            },
        }
    )
    mount = {"name": "rollout-token", "mountPath": TOKEN_DIR, "readOnly": True}
    pod_spec["containers"][0]["volumeMounts"].append(mount)
    return pod_spec


def _pod_spec(container: dict, tpu: Slice, pool: str) -> dict[str, Any]:
    """A pod on a node of `pool` (a node pool of `tpu` slices)."""
    spec: dict[str, Any] = {
        "serviceAccountName": WORKLOAD_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    spec["nodeSelector"] = {
        "cloud.google.com/gke-tpu-accelerator": tpu.accelerator,
        "cloud.google.com/gke-tpu-topology": tpu.topology,
        "cloud.google.com/gke-nodepool": pool,
    }
    spec["tolerations"] = [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
    return spec


def _job(name: str, replicas: int, pods: int, pod_spec: dict) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": "asyncrl", "role": name}},
                    "spec": pod_spec,
                },
            }
        },
    }


def rollout_addresses(name: str, replicas: int, port: int) -> list[str]:
    """host:port of each rollout replica: pod 0 of job i, through the JobSet's headless service."""
    return [f"{name}-rollout-{i}-0.{name}:{port}" for i in range(replicas)]


def _trainer_job(
    cfg: RunConfig, name: str, env: list[dict], remote: bool, extra: Sequence[str]
) -> dict[str, Any]:
    """The indexed trainer job: one pod per host, joined by jax.distributed."""
    c = cfg.cluster
    tpu = slice_of(c.tpu_type, c.tpu_topology)
    hosts = tpu.hosts
    env = [
        *env,
        {
            "name": "JAX_COORDINATOR_ADDRESS",
            "value": f"{name}-trainer-0-0.{name}:{COORDINATOR_PORT}",
        },
        {"name": "JAX_NUM_PROCESSES", "value": str(hosts)},
        {
            "name": "JAX_PROCESS_ID",
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                }
            },
        },
    ]
    if remote:
        addresses = rollout_addresses(name, c.rollout_replicas, c.rollout_port)
        env += [
            {"name": TOKEN_ENV, "value": TOKEN_FILE},
            {"name": ADDRESSES_ENV, "value": ",".join(addresses)},
        ]
    ports = [("coordinator", COORDINATOR_PORT), ("tpu-slice", TPU_SLICE_PORT)]
    command = _stage_command(["asyncrl", "train"], extra)
    container = _container("trainer", c.image, command, env, tpu.chips_per_host, ports)
    pod = _pod_spec(container, tpu, c.node_pool)
    job = _job("trainer", 1, hosts, _with_token(pod, c.rollout_token_secret) if remote else pod)
    # The slice's node pool is the trainer's alone (a multi-host slice is one unit): no other
    # job's pod may land on it (JobSet's per-replicated-job exclusive placement).
    job["template"]["metadata"] = {"annotations": {EXCLUSIVE: "cloud.google.com/gke-nodepool"}}
    if remote:  # replicas first: a trainer that finds none serving would stop at once
        job["dependsOn"] = [{"name": "rollout", "status": "Ready"}]
    return job


def _rollout_job(cfg: RunConfig, env: list[dict], extra: Sequence[str]) -> dict[str, Any]:
    """`cluster.rollout_replicas` single-pod jobs, each a replica serving on 0.0.0.0 (whatever
    `cluster.rollout_bind_host` says: its loopback default is for replicas on one machine)."""
    c = cfg.cluster
    tpu = c.rollout_slice
    if tpu is None:
        raise ValueError("remote rollout replicas on GKE need cluster.tpu_type and tpu_topology")
    serve = ["--host", "0.0.0.0", "--port", str(c.rollout_port), "--token-file", TOKEN_FILE]
    command = _stage_command(["asyncrl", "rollout-server"], [*serve, *extra])
    port = [("rollout", c.rollout_port)]
    container = _container("rollout", c.image, command, env, tpu.chips_per_host, port)
    container["readinessProbe"] = {"tcpSocket": {"port": "rollout"}, "periodSeconds": 5}
    pod = _pod_spec(container, tpu, c.rollout_node_pool)
    return _job("rollout", c.rollout_replicas, 1, _with_token(pod, c.rollout_token_secret))


def _with_run_folder(job: dict[str, Any], run_uri: str) -> dict[str, Any]:
    """Mount a gs:// run folder's bucket at /gcs/<bucket> (Cloud Storage FUSE CSI, ephemeral)."""
    if not run_uri.startswith("gs://"):
        return job
    bucket = run_uri[len("gs://") :].split("/", 1)[0]
    template = job["template"]["spec"]["template"]
    template["metadata"]["annotations"] = {"gke-gcsfuse/volumes": "true"}
    template["spec"]["volumes"].append(
        {
            "name": "runs",
            "csi": {
                "driver": FUSE_DRIVER,
                "volumeAttributes": {"bucketName": bucket, "mountOptions": "implicit-dirs"},
            },
        }
    )
    mount = {"name": "runs", "mountPath": f"/gcs/{bucket}"}
    template["spec"]["containers"][0]["volumeMounts"].append(mount)
    return job


def render_jobset(
    cfg: RunConfig,
    name: str,
    run_uri: str,
    init_model: str | None = None,
    max_restarts: int | None = None,
) -> dict[str, Any]:
    """The JobSet of a training run whose folder is `run_uri` (a gs:// URI on GKE), starting from
    the model folder `init_model` (as its pods see it) when given; `max_restarts` (default
    `cluster.max_restarts`) bounds the restarts after a trainer pod fails."""
    c = cfg.cluster
    remote = c.placement == "remote" and c.rollout_replicas > 0
    env = [
        {"name": "ASYNCRL_CONFIG_YAML", "value": to_yaml(cfg)},
        {"name": "ASYNCRL_RUN_DIR", "value": run_uri},
    ]
    extra = ["--init-model", init_model] if init_model else []
    jobs = [_rollout_job(cfg, env, extra)] if remote else []
    jobs.append(_trainer_job(cfg, name, env, remote, extra))
    restarts = c.max_restarts if max_restarts is None else max_restarts
    failure: dict[str, Any] = {"maxRestarts": restarts}
    if remote:
        failure["rules"] = [
            {
                "name": "RolloutReplicaFailed",
                "action": "RestartJob",
                "targetReplicatedJobs": ["rollout"],
            }
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": c.namespace,
            "labels": {"app": "asyncrl", "asyncrl/run": name},
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": failure,
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
            "replicatedJobs": [_with_run_folder(job, run_uri) for job in jobs],
        },
    }


def job_manifests(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """Each replicated job's template as a standalone batch/v1 Job (for offline validation)."""
    out = []
    for rj in jobset["spec"]["replicatedJobs"]:
        out.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{jobset['metadata']['name']}-{rj['name']}"},
                "spec": rj["template"]["spec"],
            }
        )
    return out


class JobSetError(RuntimeError):
    """A JobSet that could not be launched, or did not complete (the message holds its pods' log
    tails)."""
