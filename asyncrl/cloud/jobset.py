"""The rollout/trainer JobSet: render it from the config, launch it, watch it, clean it up.

`render_jobset` is pure: a `jobset.x-k8s.io/v1alpha2` JobSet with two replicated jobs,
- `trainer`: one Job over the TPU slice's hosts (an indexed Job: one pod per host, all started
  together), pods pinned to the node pool's accelerator and topology, `google.com/tpu` limits, and
  the `jax.distributed` wiring in the environment: the coordinator address (pod 0 of the trainer
  job, reached through the JobSet's headless service), the number of processes and each pod's
  process id (its completion index);
- `rollout`: `cluster.rollout_replicas` rollout engine replicas (placement `remote`), each bound
  to 0.0.0.0 on `cluster.rollout_port` and serving only peers that hold the shared token, which
  both sides read from the Secret `cluster.rollout_token_secret` mounted as a file; the trainer
  gets the replicas' addresses in ASYNCRL_ROLLOUT_ADDRESSES.
Every pod passes the `restricted` Pod Security Standard (non-root, seccomp RuntimeDefault, no
privilege escalation, all capabilities dropped, read-only root filesystem, only emptyDir and
secret volumes) and runs as the workload service account, which has no Kubernetes API rights and
no API token mounted: only the launcher (the pipeline's train pod) may create JobSets
(manifests/base/rbac.yaml). Port names match the NetworkPolicies in manifests/base/, which
select pods by their `role` label. `JobSetRunner` launches the JobSet with the `kubernetes`
client, watches its status until it completes, fails or times out, collects a tail of each pod's
log, and deletes it on cancellation or timeout.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig, to_yaml
from asyncrl.serving.auth import TOKEN_ENV

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
ACCELERATOR = {"v5e": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}
CHIPS_PER_HOST = {"v5e": 4, "v5p": 4, "v6e": 4}
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


def slice_shape(tpu_type: str, topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of a slice; raises ValueError for an unknown generation."""
    if tpu_type not in CHIPS_PER_HOST:
        raise ValueError(f"unknown TPU type {tpu_type!r}; known: {', '.join(CHIPS_PER_HOST)}")
    chips = 1
    for part in topology.split("x"):
        chips *= int(part)
    per_host = min(CHIPS_PER_HOST[tpu_type], chips)
    return max(chips // per_host, 1), per_host


def _stage_command(program: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """Write the config from the environment to scratch, then run `program` on it. The run
    folder gs://b/p is read and written at /gcs/b/p (Cloud Storage FUSE)."""
    script = (
        'printf "%s" "$ASYNCRL_CONFIG_YAML" > /tmp/config.yaml && '
        f"exec {shlex.join(program)} /tmp/config.yaml "
        '--run-dir "/gcs/${ASYNCRL_RUN_DIR#gs://}"'
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


def _pod_spec(cfg: RunConfig, container: dict, tpu: bool) -> dict[str, Any]:
    c = cfg.cluster
    spec: dict[str, Any] = {
        "serviceAccountName": WORKLOAD_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if tpu:
        spec["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": ACCELERATOR[c.tpu_type],
            "cloud.google.com/gke-tpu-topology": c.tpu_topology,
        }
        spec["tolerations"] = [
            {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
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


def _trainer_job(cfg: RunConfig, name: str, env: list[dict], remote: bool) -> dict[str, Any]:
    """The indexed trainer job: one pod per host, joined by jax.distributed."""
    c = cfg.cluster
    hosts, chips = slice_shape(c.tpu_type, c.tpu_topology)
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
    command = _stage_command(["asyncrl", "train"])
    pod = _pod_spec(cfg, _container("trainer", c.image, command, env, chips, ports), tpu=True)
    return _job("trainer", 1, hosts, _with_token(pod, c.rollout_token_secret) if remote else pod)


def _rollout_job(cfg: RunConfig, env: list[dict]) -> dict[str, Any]:
    """`cluster.rollout_replicas` single-pod jobs, each a replica serving on 0.0.0.0 (whatever
    `cluster.rollout_bind_host` says: its loopback default is for replicas on one machine)."""
    c = cfg.cluster
    _, chips = slice_shape(c.tpu_type, c.tpu_topology)
    serve = ["--host", "0.0.0.0", "--port", str(c.rollout_port), "--token-file", TOKEN_FILE]
    command = _stage_command(["asyncrl", "rollout-server"], serve)
    ports = [("rollout", c.rollout_port)]
    pod = _pod_spec(cfg, _container("rollout", c.image, command, env, chips, ports), tpu=True)
    return _job("rollout", c.rollout_replicas, 1, _with_token(pod, c.rollout_token_secret))


def render_jobset(cfg: RunConfig, name: str, run_uri: str) -> dict[str, Any]:
    """The JobSet of a training run whose folder is `run_uri` (a gs:// URI on GKE)."""
    c = cfg.cluster
    remote = c.placement == "remote" and c.rollout_replicas > 0
    env = [
        {"name": "ASYNCRL_CONFIG_YAML", "value": to_yaml(cfg)},
        {"name": "ASYNCRL_RUN_DIR", "value": run_uri},
    ]
    jobs = [_trainer_job(cfg, name, env, remote)]
    if remote:
        jobs.append(_rollout_job(cfg, env))
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": c.namespace,
            "labels": {"app": "asyncrl", "asyncrl/run": name},
            "annotations": {
                "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
            },
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": {"maxRestarts": 3},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
            "replicatedJobs": jobs,
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
    pass


@dataclass(slots=True)
class JobSetOutcome:
    name: str
    state: str  # Completed, Failed, TimedOut, Cancelled
    seconds: float
    logs: dict[str, str] = field(default_factory=dict)  # pod -> tail of its log
    message: str = ""


class JobSetRunner:
    """Launch, watch and delete JobSets through the Kubernetes API (`kubernetes` client)."""

    def __init__(self, api_client, namespace: str, poll_s: float = 2.0, log_lines: int = 50):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.poll_s, self.log_lines = namespace, poll_s, log_lines

    def launch(self, jobset: dict[str, Any]) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, jobset
            )
        except ApiException as e:
            raise JobSetError(
                f"creating JobSet {jobset['metadata']['name']} in {self.namespace} failed: "
                f"HTTP {e.status} {e.reason}"
            ) from None
        return jobset["metadata"]["name"]

    def state(self, name: str) -> tuple[str, str]:
        """("Running" | "Completed" | "Failed", message) from the JobSet's status conditions."""
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") in ("Completed", "Failed"):
                return cond["type"], cond.get("message", "")
        return "Running", ""

    def logs(self, name: str) -> dict[str, str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{NAME_LABEL}={name}")
        out = {}
        for pod in pods.items:
            try:
                out[pod.metadata.name] = self.core.read_namespaced_pod_log(
                    pod.metadata.name, self.namespace, tail_lines=self.log_lines
                )
            except Exception as e:  # a pod that never started has no log
                out[pod.metadata.name] = f"(no log: {type(e).__name__})"
        return out

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def run(
        self,
        jobset: dict[str, Any],
        timeout_s: float,
        on_poll: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> JobSetOutcome:
        start = time.monotonic()
        name = self.launch(jobset)
        try:
            while True:
                state, message = self.state(name)
                if on_poll:
                    on_poll(state)
                if state in ("Completed", "Failed"):
                    return JobSetOutcome(
                        name, state, time.monotonic() - start, self.logs(name), message
                    )
                if cancelled():
                    self.delete(name)
                    return JobSetOutcome(name, "Cancelled", time.monotonic() - start)
                if time.monotonic() - start > timeout_s:
                    logs = self.logs(name)
                    self.delete(name)
                    return JobSetOutcome(
                        name, "TimedOut", time.monotonic() - start, logs, f"after {timeout_s} s"
                    )
                time.sleep(self.poll_s)
        except BaseException:
            self.delete(name)  # interrupted: leave nothing running behind
            raise


def run_training_jobset(cfg: RunConfig, run_dir, init_model: str | None):
    """The train stage on GKE with remote placement: the JobSet does the training."""
    raise JobSetError(
        "placement 'remote' (rollout replicas in their own pods) needs the rollout server, "
        "which is not built yet; use placement 'colocated' or 'disaggregated' on one TPU host"
    )
