"""The local JobSet executor's record of one JobSet, and the controller's rules over it (pure).

`RunState` holds a JobSet's child jobs (`JobState`: live pods by completion index, succeeded
indexes, failures, restarts) and its restart counts; the functions here decide, without touching
the API or a process, what the JobSet and Job controllers would: which replicated jobs may start
(`reached`: dependsOn Ready/Complete), whether the success policy is met, which failure policy
action applies (`failure_action`), each pod's object as the controllers create it (`pod_object`:
hostname, subdomain, JobSet/Job labels and annotations, JOB_COMPLETION_INDEX), the headless-service
names of all pods (`hostnames`), and the status written back (`jobset_status`, `terminated`).
"""

from __future__ import annotations

import copy
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from asyncrl.cloud.local_kubelet import PodProcess, exit_code

L = "jobset.sigs.k8s.io/"
INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class JobState:
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
class RunState:
    name: str
    spec: dict[str, Any]
    jobs: list[JobState]
    restarts: int = 0
    counted: int = 0
    terminal: str = ""  # Completed | Failed once finished
    message: str = ""
    written: dict[str, Any] = field(default_factory=dict)


def admit(obj: dict[str, Any]) -> RunState:
    spec = obj["spec"]
    jobs = [
        JobState(rj["name"], i, rj["template"]["spec"])
        for rj in spec["replicatedJobs"]
        for i in range(int(rj.get("replicas", 1)))
    ]
    return RunState(obj["metadata"]["name"], spec, jobs)


def finished(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("terminalState"))


def reset(job: JobState) -> None:
    job.pods, job.done, job.failures, job.failed, job.started = {}, set(), 0, "", False


def reached(run: RunState, rjob: str, status: str) -> bool:
    jobs = [j for j in run.jobs if j.rjob == rjob]
    if status == "Complete":
        return all(j.complete() for j in jobs)
    return all(j.started and (j.ready() or j.complete()) for j in jobs)


def succeeded(run: RunState) -> bool:
    policy = run.spec.get("successPolicy") or {}
    targets = policy.get("targetReplicatedJobs") or [
        rj["name"] for rj in run.spec["replicatedJobs"]
    ]
    jobs = [j for j in run.jobs if j.rjob in targets]
    if policy.get("operator") == "Any":
        return any(j.complete() for j in jobs)
    return all(j.complete() for j in jobs)


def failure_action(rules: list[dict[str, Any]], job: JobState) -> str:
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


def hostnames(run: RunState, address) -> dict[str, str]:
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


def pod_object(run: RunState, job: JobState, index: int, namespace: str) -> dict[str, Any]:
    template = job.template["template"]
    job_name = f"{run.name}-{job.rjob}-{job.index}"
    network = run.spec.get("network") or {}
    spec = copy.deepcopy(template["spec"])
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


def condition(kind: str, value: bool) -> dict[str, str]:
    return {"type": kind, "status": "True" if value else "False"}


def terminated(
    container: dict[str, Any], phase: str, code: int, message: str = "", reason: str = ""
) -> dict[str, Any]:
    reason = reason or ("Completed" if code == 0 else "Error")
    state = {"exitCode": exit_code(code), "reason": reason}
    if message:
        state["message"] = message
    return {
        "phase": phase,
        "conditions": [condition("Ready", False)],
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


def jobset_status(run: RunState) -> dict[str, Any]:
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
