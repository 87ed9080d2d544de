"""The train stage on a cluster: launch the run's JobSet, watch it, tail its logs, read its result.

`JobSetRunner` creates a JobSet with the `kubernetes` client, polls its status until it completes,
fails for good or times out, prints the new lines of its pods' logs as they come (`stream`), and
deletes it when it ends, is cancelled (SIGTERM, as KFP sends, or KeyboardInterrupt) or times out,
so nothing keeps running (or holds TPUs) after the launcher is gone. It reads only what the
launcher's Role allows (manifests/base/rbac.yaml): JobSets, pods and pods/log.

`run_training_jobset` is the train component's work on GKE (the KFP pod needs no TPU): render the
run's JobSet (jobset.py), run it, and read the `TrainResult` the trainer wrote in the run folder.
A JobSet that does not complete raises `JobSetError` with the tails of its pods' logs.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.cloud.jobset import GROUP, NAME_LABEL, PLURAL, VERSION, JobSetError, jobset_name
from asyncrl.cloud.jobset import render_jobset as render
from asyncrl.config import RunConfig
from asyncrl.run_layout import RunLayout, Stage

State = Literal["Running", "Completed", "Failed", "TimedOut", "Cancelled"]
TIMEOUT_MARGIN_S = 120.0  # the JobSet ends this long before the KFP task's own timeout


class Cancelled(BaseException):
    """SIGTERM reached the launcher (KFP cancels a run by deleting its pod)."""


@dataclass(frozen=True, slots=True)
class JobSetStatus:
    state: State
    message: str = ""
    restarts: int = 0


@dataclass(slots=True)
class JobSetOutcome:
    name: str
    state: State
    seconds: float
    logs: dict[str, str] = field(default_factory=dict)  # pod -> tail of its log
    message: str = ""
    restarts: int = 0

    def tails(self) -> str:
        return "\n".join(f"--- {pod} ---\n{text.rstrip()}" for pod, text in self.logs.items())


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

    def status(self, name: str) -> JobSetStatus:
        """Running, or Completed / Failed with the condition's message, from the JobSet status."""
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        status = obj.get("status") or {}
        restarts = int(status.get("restarts") or 0)
        for cond in status.get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") in ("Completed", "Failed"):
                return JobSetStatus(cond["type"], cond.get("message", ""), restarts)
        return JobSetStatus("Running", "", restarts)

    def pods(self, name: str) -> list[str]:
        """The JobSet's pods (filtered here too: not every API server filters by label)."""
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{NAME_LABEL}={name}"
        )
        return sorted(
            p.metadata.name
            for p in listed.items
            if (p.metadata.labels or {}).get(NAME_LABEL) == name
        )

    def logs(self, name: str, timestamps: bool = False) -> dict[str, str]:
        out = {}
        for pod in self.pods(name):
            try:
                out[pod] = self.core.read_namespaced_pod_log(
                    pod, self.namespace, tail_lines=self.log_lines, timestamps=timestamps
                )
            except Exception as e:  # a pod that never started, or is gone, has no log
                out[pod] = f"(no log: {type(e).__name__})"
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
        on_poll: Callable[[JobSetStatus], None] | None = None,
        stream: Callable[[str], None] | None = None,
    ) -> JobSetOutcome:
        """Launch `jobset` and watch it to its end; it is deleted whatever the end."""
        start = time.monotonic()
        name = self.launch(jobset)
        tail = _LogTail(self, name)
        try:
            while True:
                status = self.status(name)
                if on_poll:
                    on_poll(status)
                if stream:
                    tail.emit(stream)
                seconds = time.monotonic() - start
                if status.state != "Running":
                    logs = self.logs(name)
                    return JobSetOutcome(
                        name, status.state, seconds, logs, status.message, status.restarts
                    )
                if seconds > timeout_s:
                    logs = self.logs(name)
                    return JobSetOutcome(
                        name, "TimedOut", seconds, logs, f"after {timeout_s:.0f} s", status.restarts
                    )
                time.sleep(self.poll_s)
        finally:
            self.delete(name)  # ended, timed out, cancelled or failed: leave nothing running


class _LogTail:
    """New log lines of a JobSet's pods since the last call (by their timestamps)."""

    def __init__(self, runner: JobSetRunner, name: str) -> None:
        self.runner, self.name = runner, name
        self.seen: dict[str, str] = {}  # pod -> timestamp of the last line shown

    def emit(self, say: Callable[[str], None]) -> None:
        for pod, text in self.runner.logs(self.name, timestamps=True).items():
            if text.startswith("(no log"):
                continue
            last = self.seen.get(pod, "")
            for line in text.splitlines():
                stamp, _, rest = line.partition(" ")
                if stamp > last:
                    say(f"[{pod}] {rest}")
                    self.seen[pod] = last = stamp


@contextlib.contextmanager
def sigterm_cancels() -> Iterator[None]:
    """SIGTERM raises `Cancelled` in the main thread while inside (elsewhere: no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(signum, frame):
        raise Cancelled(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def kube_api_client():
    """The Kubernetes API of this process: the kube config KUBECONFIG names, else ~/.kube/config
    when there is one, else the pod's service account (a KFP pod on GKE)."""
    from kubernetes import client, config

    from asyncrl.stages.launch import kube_config_file

    configuration = client.Configuration()
    path = kube_config_file()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def jobset_timeout(cfg: RunConfig) -> float:
    """Seconds the launcher waits for a JobSet: `cluster.jobset_timeout_s`, or the KFP task's own
    limit less TIMEOUT_MARGIN_S (at least half of it), so the launcher deletes the JobSet itself."""
    if cfg.cluster.jobset_timeout_s is not None:
        return cfg.cluster.jobset_timeout_s
    return max(cfg.pipeline.timeout_s - TIMEOUT_MARGIN_S, cfg.pipeline.timeout_s / 2)


def run_training_jobset(
    cfg: RunConfig,
    layout: RunLayout,
    init_model: str | None,
    api_client=None,
    *,
    timeout_s: float | None = None,
    max_restarts: int | None = None,
    poll_s: float = 5.0,
    say: Callable[[str], None] = print,
):
    """The train stage through the run's JobSet; returns the trainer's `TrainResult`. The wait
    bound and restarts come from the config (`jobset_timeout`, `cluster.max_restarts`) unless
    `timeout_s` / `max_restarts` are given."""
    from asyncrl.stages.train import TrainResult

    jobset = render(cfg, jobset_name(layout.run_id), layout.location, init_model, max_restarts)
    runner = JobSetRunner(api_client or kube_api_client(), cfg.cluster.namespace, poll_s)
    if timeout_s is None:
        timeout_s = jobset_timeout(cfg)
    layout.result_path(Stage.TRAIN).unlink(missing_ok=True)  # an older launch's must not count
    restarts = [0]

    def progress(status: JobSetStatus) -> None:
        if status.restarts != restarts[0]:
            restarts[0] = status.restarts
            say(f"JobSet {jobset['metadata']['name']} restarted ({status.restarts} so far)")

    say(f"launching JobSet {jobset['metadata']['name']} in namespace {cfg.cluster.namespace}")
    with sigterm_cancels():
        outcome = runner.run(jobset, timeout_s, on_poll=progress, stream=say)
    say(f"JobSet {outcome.name}: {outcome.state} after {outcome.seconds:.0f} s")
    if outcome.state != "Completed":
        raise JobSetError(
            f"JobSet {outcome.name} {outcome.state} ({outcome.message}) after "
            f"{outcome.restarts} restarts; pod log tails:\n{outcome.tails()}"
        )
    result = layout.maybe(TrainResult)
    if result is None:
        raise JobSetError(
            f"JobSet {outcome.name} completed but {layout.result_path(Stage.TRAIN)} holds no "
            f"valid train result; pod log tails:\n{outcome.tails()}"
        )
    return result
