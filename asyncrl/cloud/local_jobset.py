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
This module does the effects (API calls, processes); the record of a JobSet and the pure rules
over it are in jobset_state.py.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

from asyncrl.cloud.jobset_state import (
    JobState,
    RunState,
    admit,
    condition,
    failure_action,
    finished,
    hostnames,
    jobset_status,
    pod_object,
    reached,
    reset,
    succeeded,
    terminated,
)
from asyncrl.cloud.local_kubelet import (
    PodProcess,
    PodStartError,
    exit_code,
    read_log,
    secret_data,
    start_pod,
)

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
GRACE_S = 10.0  # longest wait between SIGTERM and SIGKILL when stopping a pod


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
        self.runs: dict[str, RunState] = {}
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
            if name not in self.runs and not finished(obj):
                with self._lock:
                    self.runs[name] = admit(obj)
            run = self.runs.get(name)
            if run is not None and not run.terminal:
                self._step(run)
                self._write_status(run)

    def _step(self, run: RunState) -> None:
        for job in run.jobs:
            if job.started:
                self._sync_job(run, job)
        failed = next((j for j in run.jobs if j.failed), None)
        if failed is not None:
            self._on_failure(run, failed)
        elif succeeded(run):
            self._stop_pods(run, delete=False)  # what still runs stops; the pods stay listed
            run.terminal, run.message = "Completed", "jobset completed successfully"
        else:
            self._start_due(run)

    def _start_due(self, run: RunState) -> None:
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
            if all(reached(run, dep, status) for dep, status in needs):
                for job in jobs:
                    if not job.started:
                        job.started = True
                        for index in range(job.parallelism):
                            self._start_pod(run, job, index)

    def _sync_job(self, run: RunState, job: JobState) -> None:
        for index, pod in list(job.pods.items()):
            code = pod.poll()
            if code is None:
                ready = pod.probe()
                if ready != pod.ready:
                    pod.ready = ready
                    self._patch_pod(pod, {"conditions": [condition("Ready", ready)]})
                continue
            del job.pods[index]
            phase = "Succeeded" if code == 0 else "Failed"
            self._patch_pod(pod, terminated(pod.container, phase, code))
            if code == 0:
                job.done.add(index)
                continue
            job.failures += 1
            if job.failures > int(job.template.get("backoffLimit", 6)):
                job.failed = f"pod {pod.name} exited with {exit_code(code)}: BackoffLimitExceeded"
            else:
                self._start_pod(run, job, index)

    def _on_failure(self, run: RunState, job: JobState) -> None:
        policy = run.spec.get("failurePolicy") or {}
        limit = int(policy.get("maxRestarts", 0))
        action = failure_action(policy.get("rules") or [], job)
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
                reset(j)
            return self._start_due(run)
        if counts and job.counted >= limit:
            return self._fail(run, "ReachedMaxRestarts", f"{what}; maxRestarts {limit} reached")
        self._stop_job(job, delete=True)
        started = job.started
        reset(job)
        job.restarts += 1
        job.counted += counts
        if started:
            job.started = True
            for index in range(job.parallelism):
                self._start_pod(run, job, index)

    def _fail(self, run: RunState, reason: str, message: str) -> None:
        self._stop_pods(run, delete=False)  # failed pods stay, with their logs
        run.terminal, run.message = "Failed", f"{reason}: {message}"

    # -- pods ------------------------------------------------------------------------------------

    def _start_pod(self, run: RunState, job: JobState, index: int) -> None:
        pod = pod_object(run, job, index, self.namespace)
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
                hosts=hostnames(run, self._address),
                secret=self._secret,
                folder=folder,
                base_env=self.base_env,
                shared=self.shared,
            )
        except (PodStartError, OSError) as e:
            (folder / "log").write_text(f"- {e}\n")
            container = pod["spec"]["containers"][0]
            status = terminated(container, "Failed", 1, str(e), "CreateContainerConfigError")
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

    def _stop_pods(self, run: RunState, delete: bool) -> None:
        for job in run.jobs:
            self._stop_job(job, delete)

    def _stop_job(self, job: JobState, delete: bool) -> None:
        """Stop the job's live pods; with `delete`, delete the job: all its pods, ended ones too."""
        with self._lock:
            pods, job.pods = list(job.pods.values()), {}
        for pod in pods:
            code = pod.stop(min(GRACE_S, pod.spec.get("terminationGracePeriodSeconds", 30)))
            if not delete:
                stopped = terminated(pod.container, "Failed", code, "stopped by the JobSet")
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

    def _write_status(self, run: RunState) -> None:
        status = jobset_status(run)
        if status != run.written:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, run.name, {"status": status}
            )
            run.written = status


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
