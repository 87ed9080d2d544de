"""The local JobSet executor: JobSet and Job controllers over a Kubernetes API; pods as processes.

It watches the JobSets of one namespace through the `kubernetes` client (against the in-process
API of kube_emulator.py, or any API server) and does what the JobSet controller, the Job
controller and the kubelets (local_kubelet.py) would do for each, taking the JobSet exactly as it
was created:
- child jobs `<jobset>-<replicatedJob>-<i>`, each an Indexed Job of `parallelism` pods named
  `<job>-<index>-<random>` with hostname `<job>-<index>` and subdomain `spec.network.subdomain`;
  the labels and annotations JobSet and Job put on pods (jobset-name, replicatedjob-name,
  job-index, restart-attempt, job-completion-index) and JOB_COMPLETION_INDEX in the environment;
- `dependsOn` (Ready or Complete) and `startupPolicy` InOrder: a replicated job starts once the
  one before it is ready (every job has `parallelism` pods ready or succeeded);
- a pod that fails is replaced until its job's `backoffLimit` is exceeded; the job has then failed
  (reason BackoffLimitExceeded), and the first matching `failurePolicy.rules` entry (or
  RestartJobSet) decides: fail the JobSet, recreate all its jobs, or recreate that job alone,
  within `maxRestarts` unless the action ignores it;
- `successPolicy` (All or Any, over `targetReplicatedJobs`): on success the pods still running
  are stopped (all pods stay listed, with their logs, until the JobSet is deleted);
- status written back: pod phase, readiness, exit codes; JobSet `restarts`,
  `restartsCountTowardsMax`, `replicatedJobsStatus`, `terminalState` and a Completed or Failed
  condition. A JobSet that is deleted has its pods stopped and deleted.
Each pod gets its own loopback address, kept by its hostname across restarts, as DNS would.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.cloud.local_kubelet import (
    PodProcess,
    PodStartError,
    exit_code,
    read_log,
    secret_data,
    start_pod,
)

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
L = "jobset.sigs.k8s.io/"
INDEX = "batch.kubernetes.io/job-completion-index"
GRACE_S = 10.0  # longest wait between SIGTERM and SIGKILL when stopping a pod


@dataclass
class _Job:
    rjob: str
    index: int  # job index within its replicated job
    template: dict[str, Any]  # the Job spec
    pods: dict[int, PodProcess] = field(default_factory=dict)  # completion index -> live pod
    done: set[int] = field(default_factory=set)  # completion indexes that succeeded
    failures: int = 0
    restarts: int = 0
    counted: int = 0  # restarts that count towards maxRestarts
    started: bool = False
    failed: str = ""  # the failure message once the job has failed
    created: list[str] = field(default_factory=list)  # its pods, live or ended (deleted with it)

    @property
    def parallelism(self) -> int:
        return int(self.template.get("parallelism", 1))

    def ready(self) -> bool:
        return len(self.done) + sum(p.ready for p in self.pods.values()) >= self.parallelism

    def complete(self) -> bool:
        return len(self.done) >= int(self.template.get("completions", self.parallelism))


@dataclass
class _Run:
    name: str
    spec: dict[str, Any]
    jobs: list[_Job]
    restarts: int = 0
    counted: int = 0
    terminal: str = ""  # Completed | Failed once finished
    message: str = ""
    written: dict[str, Any] = field(default_factory=dict)


class LocalJobSetExecutor:
    """Runs the JobSets of `namespace` as local processes until `stop()`."""

    def __init__(
        self,
        api_client,
        namespace: str,
        workdir: Path,
        *,
        shared: tuple[Path, ...] = (),
        poll_s: float = 0.2,
        base_env: dict[str, str] | None = None,
    ) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.workdir, self.shared, self.poll_s = namespace, workdir, shared, poll_s
        self.base_env = image_env() if base_env is None else base_env
        self.runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="jobset-executor")
        self._addresses: dict[str, str] = {}
        self._net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
        self._logs: dict[str, Path] = {}
        self.errors: list[str] = []  # reconcile errors, for whoever debugs the executor

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalJobSetExecutor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for run in list(self.runs.values()):
            self._stop_pods(run, delete=False)

    def pods(self, jobset: str, rjob: str | None = None) -> list[PodProcess]:
        """The live pods of a JobSet (of one replicated job), for tests and the operator."""
        with self._lock:
            run = self.runs.get(jobset)
            jobs = run.jobs if run else []
            return [p for j in jobs if rjob in (None, j.rjob) for p in j.pods.values()]

    def log(self, namespace: str, pod: str, tail: int | None, timestamps: bool) -> str | None:
        """pods/log: what the kubelet would serve (kube_emulator.KubeEmulator.serve_logs)."""
        path = self._logs.get(pod)
        if namespace != self.namespace or path is None:
            return None
        return read_log(path, tail, timestamps)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._reconcile()
            except Exception as e:  # an API hiccup: try again next round, but keep the reason
                self.errors.append(f"{type(e).__name__}: {e}")

    # -- reconcile -------------------------------------------------------------------------------

    def _reconcile(self) -> None:
        listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        present = {o["metadata"]["name"]: o for o in listed.get("items", [])}
        for name in [n for n in self.runs if n not in present]:  # deleted: so are its pods
            self._stop_pods(self.runs[name], delete=True)
            with self._lock:
                del self.runs[name]
        for name, obj in present.items():
            if name not in self.runs and not _finished(obj):
                with self._lock:
                    self.runs[name] = _admit(obj)
            run = self.runs.get(name)
            if run is not None and not run.terminal:
                self._step(run)
                self._write_status(run)

    def _step(self, run: _Run) -> None:
        for job in run.jobs:
            if job.started:
                self._sync_job(run, job)
        failed = next((j for j in run.jobs if j.failed), None)
        if failed is not None:
            self._on_failure(run, failed)
        elif _succeeded(run):
            self._stop_pods(run, delete=False)  # what still runs stops; the pods stay listed
            run.terminal, run.message = "Completed", "jobset completed successfully"
        else:
            self._start_due(run)

    def _start_due(self, run: _Run) -> None:
        """Start the replicated jobs whose turn has come (dependsOn / startupPolicy InOrder)."""
        in_order = (run.spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
        names = [rj["name"] for rj in run.spec["replicatedJobs"]]
        for i, rj in enumerate(run.spec["replicatedJobs"]):
            jobs = [j for j in run.jobs if j.rjob == rj["name"]]
            if all(j.started for j in jobs):
                continue
            needs = [(d["name"], d["status"]) for d in rj.get("dependsOn") or []]
            if in_order and i:
                needs.append((names[i - 1], "Ready"))
            if all(_reached(run, dep, status) for dep, status in needs):
                for job in jobs:
                    if not job.started:
                        job.started = True
                        for index in range(job.parallelism):
                            self._start_pod(run, job, index)

    def _sync_job(self, run: _Run, job: _Job) -> None:
        for index, pod in list(job.pods.items()):
            code = pod.poll()
            if code is None:
                ready = pod.probe()
                if ready != pod.ready:
                    pod.ready = ready
                    self._patch_pod(pod, {"conditions": [_cond("Ready", ready)]})
                continue
            del job.pods[index]
            phase = "Succeeded" if code == 0 else "Failed"
            self._patch_pod(pod, _terminated(pod.container, phase, code))
            if code == 0:
                job.done.add(index)
                continue
            job.failures += 1
            if job.failures > int(job.template.get("backoffLimit", 6)):
                job.failed = f"pod {pod.name} exited with {exit_code(code)}: BackoffLimitExceeded"
            else:
                self._start_pod(run, job, index)

    def _on_failure(self, run: _Run, job: _Job) -> None:
        policy = run.spec.get("failurePolicy") or {}
        limit = int(policy.get("maxRestarts", 0))
        action = _action(policy.get("rules") or [], job)
        counts = not action.endswith("IgnoreMaxRestarts")
        what = f"job {run.name}-{job.rjob}-{job.index} failed ({job.failed})"
        if action == "FailJobSet":
            return self._fail(run, "FailedJobs", f"{what}; failure policy: FailJobSet")
        if action.startswith("RestartJobSet"):
            if counts and run.counted >= limit:
                return self._fail(run, "ReachedMaxRestarts", f"{what}; maxRestarts {limit} reached")
            self._stop_pods(run, delete=True)
            run.restarts += 1
            run.counted += counts
            for j in run.jobs:
                _reset(j)
            return self._start_due(run)
        if counts and job.counted >= limit:
            return self._fail(run, "ReachedMaxRestarts", f"{what}; maxRestarts {limit} reached")
        self._stop_job(job, delete=True)
        started = job.started
        _reset(job)
        job.restarts += 1
        job.counted += counts
        if started:
            job.started = True
            for index in range(job.parallelism):
                self._start_pod(run, job, index)

    def _fail(self, run: _Run, reason: str, message: str) -> None:
        self._stop_pods(run, delete=False)  # failed pods stay, with their logs
        run.terminal, run.message = "Failed", f"{reason}: {message}"

    # -- pods ------------------------------------------------------------------------------------

    def _start_pod(self, run: _Run, job: _Job, index: int) -> None:
        pod = _pod_object(run, job, index, self.namespace)
        hostname = pod["spec"]["hostname"]
        ip = self._address(f"{hostname}.{pod['spec'].get('subdomain', '')}")
        folder = self.workdir / pod["metadata"]["name"]
        folder.mkdir(parents=True, exist_ok=True)
        self._logs[pod["metadata"]["name"]] = folder / "log"
        self.core.create_namespaced_pod(self.namespace, pod)
        job.created.append(pod["metadata"]["name"])
        try:
            process = start_pod(
                pod,
                ip=ip,
                hosts=_hosts(run, self._address),
                secret=self._secret,
                folder=folder,
                base_env=self.base_env,
                shared=self.shared,
            )
        except (PodStartError, OSError) as e:
            (folder / "log").write_text(f"- {e}\n")
            container = pod["spec"]["containers"][0]
            status = _terminated(container, "Failed", 1, str(e), "CreateContainerConfigError")
            self._patch(pod["metadata"]["name"], status)
            job.failed = f"pod {pod['metadata']['name']}: CreateContainerConfigError: {e}"
            return
        with self._lock:
            job.pods[index] = process
        self._patch_pod(process, {"phase": "Running", "podIP": ip, "hostIP": ip})

    def _secret(self, name: str) -> dict[str, bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_secret(name, self.namespace)
            )
        except ApiException as e:
            if e.status == 404:
                raise LookupError(name) from None
            raise
        return secret_data(obj)

    def _address(self, fqdn: str) -> str:
        if fqdn not in self._addresses:
            n = len(self._addresses) + 2  # .1 is the machine's own loopback address
            self._addresses[fqdn] = f"{self._net}.{n}"
        return self._addresses[fqdn]

    def _stop_pods(self, run: _Run, delete: bool) -> None:
        for job in run.jobs:
            self._stop_job(job, delete)

    def _stop_job(self, job: _Job, delete: bool) -> None:
        """Stop the job's live pods; with `delete`, delete the job: all its pods, ended ones too."""
        with self._lock:
            pods, job.pods = list(job.pods.values()), {}
        for pod in pods:
            code = pod.stop(min(GRACE_S, pod.spec.get("terminationGracePeriodSeconds", 30)))
            if not delete:
                stopped = _terminated(pod.container, "Failed", code, "stopped by the JobSet")
                self._patch_pod(pod, stopped)
        if delete:
            for name in job.created:
                self._delete_pod(name)
            job.created = []

    def _patch_pod(self, pod: PodProcess, status: dict[str, Any]) -> None:
        self._patch(pod.name, status)

    def _patch(self, name: str, status: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    def _delete_pod(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def _write_status(self, run: _Run) -> None:
        status = _status(run)
        if status != run.written:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, run.name, {"status": status}
            )
            run.written = status


# -- pure helpers ---------------------------------------------------------------------------------


def image_env() -> dict[str, str]:
    """The environment a pod's container starts from (the image's, here this process's): this
    Python environment's scripts first on PATH; no XLA flags, kube config or asyncrl settings of
    the launching process, so a pod sees only what its spec gives it."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "KUBECONFIG") and not k.startswith("ASYNCRL_")
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _admit(obj: dict[str, Any]) -> _Run:
    spec = obj["spec"]
    jobs = [
        _Job(rj["name"], i, rj["template"]["spec"])
        for rj in spec["replicatedJobs"]
        for i in range(int(rj.get("replicas", 1)))
    ]
    return _Run(obj["metadata"]["name"], spec, jobs)


def _finished(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("terminalState"))


def _reset(job: _Job) -> None:
    job.pods, job.done, job.failures, job.failed, job.started = {}, set(), 0, "", False


def _reached(run: _Run, rjob: str, status: str) -> bool:
    jobs = [j for j in run.jobs if j.rjob == rjob]
    if status == "Complete":
        return all(j.complete() for j in jobs)
    return all(j.started and (j.ready() or j.complete()) for j in jobs)


def _succeeded(run: _Run) -> bool:
    policy = run.spec.get("successPolicy") or {}
    targets = policy.get("targetReplicatedJobs") or [
        rj["name"] for rj in run.spec["replicatedJobs"]
    ]
    jobs = [j for j in run.jobs if j.rjob in targets]
    if policy.get("operator") == "Any":
        return any(j.complete() for j in jobs)
    return all(j.complete() for j in jobs)


def _action(rules: list[dict[str, Any]], job: _Job) -> str:
    """The first matching failure policy rule's action; RestartJobSet when none matches."""
    reason = "BackoffLimitExceeded"
    for rule in rules:
        targets = rule.get("targetReplicatedJobs") or []
        reasons = rule.get("onJobFailureReasons") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if targets and job.rjob not in targets:
            continue
        if reasons and reason not in reasons:
            continue
        if patterns and not any(re.search(p, job.failed) for p in patterns):
            continue
        return rule["action"]
    return "RestartJobSet"


def _hosts(run: _Run, address) -> dict[str, str]:
    """Every pod hostname of the JobSet, as its headless service names it, to its address."""
    network = run.spec.get("network") or {}
    if not network.get("enableDNSHostnames", False):
        return {}
    sub = network.get("subdomain") or run.name
    out = {}
    for job in run.jobs:
        for index in range(job.parallelism):
            fqdn = f"{run.name}-{job.rjob}-{job.index}-{index}.{sub}"
            out[fqdn] = address(fqdn)
    return out


def _pod_object(run: _Run, job: _Job, index: int, namespace: str) -> dict[str, Any]:
    template = job.template["template"]
    job_name = f"{run.name}-{job.rjob}-{job.index}"
    network = run.spec.get("network") or {}
    spec = _copy(template["spec"])
    if network.get("enableDNSHostnames", False):
        spec["hostname"] = f"{job_name}-{index}"
        spec["subdomain"] = network.get("subdomain") or run.name
    if job.template.get("completionMode") == "Indexed":
        for container in spec["containers"]:
            container.setdefault("env", []).append(
                {"name": "JOB_COMPLETION_INDEX", "value": str(index)}
            )
    labels = {
        **(template.get("metadata") or {}).get("labels", {}),
        L + "jobset-name": run.name,
        L + "replicatedjob-name": job.rjob,
        L + "job-index": str(job.index),
        L + "restart-attempt": str(run.restarts),
        "batch.kubernetes.io/job-name": job_name,
        INDEX: str(index),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{index}-{secrets.token_hex(3)[:5]}",
            "namespace": namespace,
            "labels": labels,
            "annotations": {INDEX: str(index), L + "jobset-name": run.name},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _copy(obj: Any) -> Any:
    import copy

    return copy.deepcopy(obj)


def _cond(kind: str, value: bool) -> dict[str, str]:
    return {"type": kind, "status": "True" if value else "False"}


def _terminated(
    container: dict[str, Any], phase: str, code: int, message: str = "", reason: str = ""
) -> dict[str, Any]:
    reason = reason or ("Completed" if code == 0 else "Error")
    state = {"exitCode": exit_code(code), "reason": reason}
    if message:
        state["message"] = message
    return {
        "phase": phase,
        "conditions": [_cond("Ready", False)],
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": state},
            }
        ],
    }


def _status(run: _Run) -> dict[str, Any]:
    by_name: dict[str, dict[str, Any]] = {}
    for job in run.jobs:
        s = by_name.setdefault(
            job.rjob,
            {
                "name": job.rjob,
                "ready": 0,
                "succeeded": 0,
                "failed": 0,
                "active": 0,
                "suspended": 0,
                "jobRestarts": [],
            },
        )
        s["ready"] += job.started and job.ready() and not job.complete()
        s["succeeded"] += job.complete()
        s["failed"] += bool(job.failed)
        s["active"] += bool(job.pods)
        s["jobRestarts"].append(job.restarts)
    status: dict[str, Any] = {
        "restarts": run.restarts,
        "restartsCountTowardsMax": run.counted,
        "replicatedJobsStatus": list(by_name.values()),
    }
    if run.terminal:
        status["terminalState"] = run.terminal
        status["conditions"] = [
            {"type": run.terminal, "status": "True", "reason": run.terminal, "message": run.message}
        ]
    return status


@contextlib.contextmanager
def running_executor(
    api_client, namespace: str, workdir: Path, **kw
) -> Iterator[LocalJobSetExecutor]:
    executor = LocalJobSetExecutor(api_client, namespace, workdir, **kw).start()
    try:
        yield executor
    finally:
        executor.stop()
