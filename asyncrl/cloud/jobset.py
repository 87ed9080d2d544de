"""The rollout/trainer JobSet: render it from the config, launch it, watch it, clean it up.

`render_jobset` is pure: a `jobset.x-k8s.io/v1alpha2` JobSet with two replicated jobs,
- `trainer`: one Job over the TPU slice's hosts (an indexed Job: one pod per host, all started
  together), pods pinned to the node pool's accelerator and topology, `google.com/tpu` limits, and
  the `jax.distributed` wiring in the environment: the coordinator address (pod 0 of the trainer
  job, reached through the JobSet's headless service), the number of processes and each pod's
  process id (its completion index);
- `rollout`: `cluster.rollout_replicas` rollout engine replicas (placement `remote`);
with exclusive placement per node pool, the run folder and checkpoints as gs:// URIs, the
Kubernetes service account by name, non-root pods with a read-only root filesystem and no added
capabilities. `JobSetRunner` launches it with the `kubernetes` client, watches its status until it
completes, fails or times out, collects a tail of each pod's log, and deletes it on cancellation
or timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig, to_yaml

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
ACCELERATOR = {"v5e": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}
CHIPS_PER_HOST = {"v5e": 4, "v5p": 4, "v6e": 4}
COORDINATOR_PORT = 8476


def slice_shape(tpu_type: str, topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of a slice; raises ValueError for an unknown generation."""
    if tpu_type not in CHIPS_PER_HOST:
        raise ValueError(f"unknown TPU type {tpu_type!r}; known: {', '.join(CHIPS_PER_HOST)}")
    chips = 1
    for part in topology.split("x"):
        chips *= int(part)
    per_host = min(CHIPS_PER_HOST[tpu_type], chips)
    return max(chips // per_host, 1), per_host


def _stage_command(command: str) -> list[str]:
    """Write the config from the environment to scratch, then run the asyncrl command on it. The
    run folder gs://b/p is read and written at /gcs/b/p (Cloud Storage FUSE)."""
    script = (
        'printf "%s" "$ASYNCRL_CONFIG_YAML" > /tmp/config.yaml && '
        f'exec asyncrl {command} /tmp/config.yaml --run-dir "/gcs/${{ASYNCRL_RUN_DIR#gs://}}"'
    )
    return ["sh", "-c", script]


def _security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _container(name, image, command, env, tpu_chips: int, cfg: RunConfig) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "4", "memory": "16Gi"}}
    if tpu_chips:
        resources["limits"] = {"google.com/tpu": str(tpu_chips)}
        resources["requests"]["google.com/tpu"] = str(tpu_chips)
    return {
        "name": name,
        "image": image,
        "command": command,
        "env": env,
        "resources": resources,
        "securityContext": _security(),
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
    }


def _pod_spec(cfg: RunConfig, container: dict, tpu: bool) -> dict[str, Any]:
    c = cfg.cluster
    spec: dict[str, Any] = {
        "serviceAccountName": c.service_account,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
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


def render_jobset(cfg: RunConfig, name: str, run_uri: str) -> dict[str, Any]:
    """The JobSet of a training run whose folder is `run_uri` (a gs:// URI on GKE)."""
    c = cfg.cluster
    hosts, chips = slice_shape(c.tpu_type, c.tpu_topology)
    config_text = to_yaml(cfg)
    trainer_env = [
        {"name": "ASYNCRL_CONFIG_YAML", "value": config_text},
        {"name": "ASYNCRL_RUN_DIR", "value": run_uri},
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
    trainer_cmd = _stage_command("train")
    trainer = _container("trainer", c.image, trainer_cmd, trainer_env, chips, cfg)
    trainer["ports"] = [{"containerPort": COORDINATOR_PORT, "name": "coordinator"}]
    jobs = [_job("trainer", 1, hosts, _pod_spec(cfg, trainer, tpu=True))]
    if c.placement == "remote" and c.rollout_replicas:
        rollout_env = [
            {"name": "ASYNCRL_CONFIG_YAML", "value": config_text},
            {"name": "ASYNCRL_RUN_DIR", "value": run_uri},
        ]
        rollout_cmd = _stage_command("rollout-server")
        rollout = _container("rollout", c.image, rollout_cmd, rollout_env, chips, cfg)
        jobs.append(_job("rollout", c.rollout_replicas, 1, _pod_spec(cfg, rollout, tpu=True)))
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
