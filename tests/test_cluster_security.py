"""Cluster lock-down: every pod we render passes the `restricted` Pod Security Standard, the
NetworkPolicies deny by default and allow exactly the flows the design needs (evaluated flow by
flow against the rendered pods' labels and named ports), the service accounts are split, and
every base image is pinned by digest.

The restricted-profile checker below follows the Pod Security Standards page
(kubernetes.io/docs/concepts/security/pod-security-standards, baseline + restricted, v1.33);
the NetworkPolicy evaluator follows the NetworkPolicy API semantics for one namespace.
"""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from asyncrl.cloud.jobset import (
    COORDINATOR_PORT,
    TPU_SLICE_PORT,
    WORKLOAD_SERVICE_ACCOUNT,
    job_manifests,
    render_jobset,
)
from asyncrl.config import load_config

ROOT = Path(__file__).parent.parent
GKE = ROOT / "configs" / "qwen2.5-0.5b-v6e.yaml"
REMOTE = ("cluster.placement=remote", "cluster.rollout_replicas=2")
K8S_VERSION = "1.33.0"
NAMESPACE = "asyncrl"
POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}

# --- the restricted Pod Security Standard -------------------------------------------------------

VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
APPARMOR_TYPES = {None, "RuntimeDefault", "Localhost"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}


def _selinux_violations(where: str, options: dict | None) -> list[str]:
    options = options or {}
    out = []
    if options.get("type", "") not in SELINUX_TYPES:
        out.append(f"{where}: seLinuxOptions.type {options['type']!r}")
    if options.get("user") or options.get("role"):
        out.append(f"{where}: seLinuxOptions user/role set")
    return out


def _container_violations(c: dict, pod_sc: dict) -> list[str]:
    sc = c.get("securityContext") or {}
    where = f"container {c.get('name')}"
    out = _selinux_violations(where, sc.get("seLinuxOptions"))
    if sc.get("privileged"):
        out.append(f"{where}: privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation is not false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}: capabilities do not drop ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        out.append(f"{where}: adds capabilities {sorted(caps['add'])}")
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
        out.append(f"{where}: runAsNonRoot is not true")
    if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
        out.append(f"{where}: runAsUser 0")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_TYPES:
        out.append(f"{where}: seccompProfile {seccomp!r}, not RuntimeDefault or Localhost")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in APPARMOR_TYPES:
        out.append(f"{where}: appArmorProfile {apparmor!r}")
    if sc.get("procMount", "Default") != "Default":
        out.append(f"{where}: procMount {sc['procMount']!r}")
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where}: windows hostProcess")
    if any(p.get("hostPort") for p in c.get("ports") or []):
        out.append(f"{where}: hostPort")
    return out


def restricted_violations(pod_spec: dict, annotations: dict | None = None) -> list[str]:
    """Every way `pod_spec` breaks the restricted Pod Security Standard (empty: it passes)."""
    out = [f"pod: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod_spec.get(key)]
    pod_sc = pod_spec.get("securityContext") or {}
    if pod_sc.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: windows hostProcess")
    if (pod_sc.get("appArmorProfile") or {}).get("type") not in APPARMOR_TYPES:
        out.append(f"pod: appArmorProfile {pod_sc['appArmorProfile']['type']!r}")
    out += _selinux_violations("pod", pod_sc.get("seLinuxOptions"))
    out += [
        f"pod: sysctl {s['name']}"
        for s in pod_sc.get("sysctls") or []
        if s["name"] not in SAFE_SYSCTLS
    ]
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            out.append(f"volume {volume['name']}: {sorted(kinds - VOLUME_TYPES)} not allowed")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            out.append(f"annotation {key}: {value}")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod_spec.get(kind) or []:
            out += _container_violations(c, pod_sc)
    return out


def _compliant() -> dict:
    return {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "c",
                "image": "x@sha256:" + "0" * 64,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                },
            }
        ],
        "volumes": [{"name": "s", "secret": {"secretName": "s"}}, {"name": "e", "emptyDir": {}}],
    }


def _set(path: str, value):
    def mutate(spec):
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set("hostNetwork", True), "pod: hostNetwork"),
        (_set("hostPID", True), "pod: hostPID"),
        (_set("hostIPC", True), "pod: hostIPC"),
        (_set("containers.0.securityContext.privileged", True), "privileged"),
        (_set("containers.0.securityContext.allowPrivilegeEscalation", None), "Escalation"),
        (_set("containers.0.securityContext.allowPrivilegeEscalation", True), "Escalation"),
        (_set("containers.0.securityContext.capabilities.drop", ["NET_RAW"]), "drop ALL"),
        (_set("containers.0.securityContext.capabilities.add", ["SYS_ADMIN"]), "adds cap"),
        (_set("securityContext.runAsNonRoot", None), "runAsNonRoot is not true"),
        (_set("containers.0.securityContext.runAsNonRoot", False), "runAsNonRoot is not true"),
        (_set("containers.0.securityContext.runAsUser", 0), "runAsUser 0"),
        (_set("securityContext.seccompProfile", None), "seccompProfile None"),
        (
            _set("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}),
            "seccompProfile 'Unconfined'",
        ),
        (
            _set("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}),
            "appArmorProfile 'Unconfined'",
        ),
        (_set("containers.0.securityContext.procMount", "Unmasked"), "procMount"),
        (_set("containers.0.ports", [{"containerPort": 80, "hostPort": 80}]), "hostPort"),
        (_set("volumes", [{"name": "h", "hostPath": {"path": "/"}}]), "['hostPath'] not allowed"),
        (_set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]), "sysctl"),
        (
            _set("securityContext.seLinuxOptions", {"type": "spc_t"}),
            "seLinuxOptions.type 'spc_t'",
        ),
    ],
)
def test_the_restricted_checker_catches_each_rule(mutate, expected):
    assert restricted_violations(_compliant()) == []
    spec = _compliant()
    mutate(spec)
    found = restricted_violations(spec)
    assert len(found) == 1 and expected in found[0], found


def test_the_restricted_checker_reads_apparmor_annotations():
    key = "container.apparmor.security.beta.kubernetes.io/c"
    assert restricted_violations(_compliant(), {key: "runtime/default"}) == []
    assert restricted_violations(_compliant(), {key: "unconfined"}) == [
        f"annotation {key}: unconfined"
    ]


# --- every pod we render -----------------------------------------------------------------------


def _manifest_docs() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _pod_templates(doc: dict) -> list[tuple[dict, dict]]:
    """(metadata, spec) of the pods a workload object creates."""
    kind, spec = doc["kind"], doc.get("spec") or {}
    if kind == "Pod":
        return [(doc["metadata"], spec)]
    if kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template = spec["template"]
    return [(template.get("metadata") or {}, template["spec"])]


def _jobset_pods(overrides=()) -> dict[str, tuple[dict, dict]]:
    jobset = render_jobset(load_config(GKE, overrides), "run-1", "gs://bucket/runs/run-1")
    return {
        rj["name"]: (rj["template"]["spec"]["template"]["metadata"], rj["template"]["spec"])
        for rj in jobset["spec"]["replicatedJobs"]
    }


def _rendered_pods() -> dict[str, tuple[dict, dict]]:
    pods = {}
    for label, overrides in (("colocated", ()), ("remote", REMOTE)):
        for role, (meta, job) in _jobset_pods(overrides).items():
            pods[f"jobset {label} {role}"] = (meta, job["template"]["spec"])
    for doc in _manifest_docs():
        if doc["kind"] in POD_KINDS:
            for meta, spec in _pod_templates(doc):
                pods[f"manifest {doc['kind']}/{doc['metadata']['name']}"] = (meta, spec)
    return pods


def test_every_rendered_pod_passes_the_restricted_profile():
    pods = _rendered_pods()
    assert {"jobset remote trainer", "jobset remote rollout", "jobset colocated trainer"} <= set(
        pods
    )
    for name, (meta, spec) in pods.items():
        assert restricted_violations(spec, meta.get("annotations")) == [], name


def test_workload_pods_hold_no_api_token_and_a_read_only_root():
    for name, (_, spec) in _rendered_pods().items():
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["serviceAccountName"] == WORKLOAD_SERVICE_ACCOUNT, name
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_rendered_job_templates_validate_strictly():
    for overrides in ((), REMOTE):
        jobset = render_jobset(load_config(GKE, overrides), "run-1", "gs://b/r")
        for job in job_manifests(jobset):
            kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_every_pipeline_task_runs_as_non_root():
    """The compiled KFP IR carries only the identity part of a task pod's security context
    (kfp-kubernetes 2.17 exposes runAsUser/runAsGroup/runAsNonRoot); the KFP backend's compiler
    adds seccomp RuntimeDefault, allowPrivilegeEscalation false and drop ALL to every executor."""
    spec = list(yaml.safe_load_all((ROOT / "pipelines/compiled/asyncrl-gke.yaml").read_text()))
    pipeline, platform = spec
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(pipeline["deploymentSpec"]["executors"])
    for name, executor in executors.items():
        context = executor.get("securityContext") or {}
        assert context.get("runAsNonRoot") is True, name
        assert int(context.get("runAsUser", 0)) != 0, name


# --- service accounts and RBAC -----------------------------------------------------------------


def test_only_the_launcher_account_has_api_rights():
    docs = _manifest_docs()
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts[WORKLOAD_SERVICE_ACCOUNT]["automountServiceAccountToken"] is False
    launcher = load_config(GKE).cluster.service_account
    assert launcher in accounts and launcher != WORKLOAD_SERVICE_ACCOUNT
    bound = {
        s["name"]
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in d["subjects"]
    }
    assert bound == {launcher}
    (role,) = [d for d in docs if d["kind"] == "Role"]
    rights = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert rights == {
        *(("jobset.x-k8s.io", "jobsets", v) for v in ("create", "get", "watch", "delete")),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
    }
    assert not {"ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in docs}


# --- network policies --------------------------------------------------------------------------


POD_CIDR_IP = "10.8.0.5"  # an address in a typical GKE pod range


class Pod:
    def __init__(self, labels, ports=None, namespace=NAMESPACE):
        self.labels, self.ports, self.namespace = labels, ports or {}, namespace
        self.namespace_labels = {"kubernetes.io/metadata.name": namespace}
        self.ip = POD_CIDR_IP  # ipBlocks match pod addresses too (as Calico applies them)


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "Exists": has,
            "DoesNotExist": not has,
            "In": has and value in e.get("values", []),
            "NotIn": not has or value not in e.get("values", []),
        }[e["operator"]]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict, other) -> bool:
    if "ipBlock" in peer:
        ip = ipaddress.ip_address(other.ip if isinstance(other, Pod) else other)
        block = peer["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(e) for e in block.get("except") or []
        )
    if not isinstance(other, Pod):
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != NAMESPACE:
        return False
    return _selects(peer.get("podSelector") or {}, other.labels)


def _port_matches(rules, port: int, protocol: str, destination) -> bool:
    if not rules:
        return True
    for rule in rules:
        if rule.get("protocol", "TCP") != protocol:
            continue
        wanted = rule.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):
            if isinstance(destination, Pod) and destination.ports.get(wanted) == port:
                return True
        elif wanted <= port <= rule.get("endPort", wanted):
            return True
    return False


def _side_allows(policies, subject: Pod, kind: str, other, port, protocol, destination):
    field, peer_key = ("egress", "to") if kind == "Egress" else ("ingress", "from")
    selecting = [
        p
        for p in policies
        if subject.namespace == NAMESPACE
        and kind in p["spec"]["policyTypes"]
        and _selects(p["spec"]["podSelector"], subject.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(field) or []:
            peers = rule.get(peer_key)
            if (not peers or any(_peer_matches(p, other) for p in peers)) and _port_matches(
                rule.get("ports"), port, protocol, destination
            ):
                return True
    return False


def flow_allowed(policies, source: Pod, destination, port: int, protocol: str = "TCP") -> bool:
    """Whether the policies let `source` open a connection to `destination` (a Pod or an IP)."""
    out = _side_allows(policies, source, "Egress", destination, port, protocol, destination)
    if not isinstance(destination, Pod):
        return out
    return out and _side_allows(
        policies, destination, "Ingress", source, port, protocol, destination
    )


def _policies() -> list[dict]:
    return [d for d in _manifest_docs() if d["kind"] == "NetworkPolicy"]


def _pods_from_jobset(*overrides: str) -> dict[str, Pod]:
    out = {}
    for role, (meta, job) in _jobset_pods((*REMOTE, *overrides)).items():
        container = job["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        out[role] = Pod(meta["labels"] | {"jobset.sigs.k8s.io/jobset-name": "run-1"}, ports)
    return out


def test_the_namespace_is_default_deny():
    policies = _policies()
    deny = [
        p
        for p in policies
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert len(deny) == 1
    for p in policies:
        assert p["metadata"]["namespace"] == NAMESPACE
        kubernetes_validate.validate(p, K8S_VERSION, strict=True)
        for rule in p["spec"].get("ingress") or []:  # no rule admits every peer
            assert rule.get("from"), p["metadata"]["name"]
        for rule in p["spec"].get("egress") or []:
            assert rule.get("to"), p["metadata"]["name"]


GOOGLE_API, PUBLIC = "199.36.153.9", "8.8.8.8"
METADATA, GKE_METADATA = "169.254.169.254", "169.254.169.252"
DNS = Pod({"k8s-app": "kube-dns"}, {"dns": 53}, namespace="kube-system")
KFP_API = Pod({"app": "ml-pipeline"}, {"http": 8888}, namespace="kubeflow")
PIPELINE = Pod({"workflows.argoproj.io/workflow": "asyncrl-x1", "app": "asyncrl"})
STRAY = Pod({"app": "something-else"}, {"http": 8080})


ROLLOUT_PORT = load_config(GKE).cluster.rollout_port


def _flows():
    pods = _pods_from_jobset()
    trainer, rollout = pods["trainer"], pods["rollout"]
    allowed = [
        (trainer, trainer, COORDINATOR_PORT),
        (trainer, trainer, TPU_SLICE_PORT),
        (trainer, rollout, ROLLOUT_PORT),
        (trainer, GOOGLE_API, 443),
        (trainer, METADATA, 80),
        (trainer, GKE_METADATA, 988),
        (rollout, GOOGLE_API, 443),
        (rollout, METADATA, 80),
        (PIPELINE, KFP_API, 8888),
        (PIPELINE, "34.118.0.10", 443),  # a public control-plane endpoint
        (PIPELINE, METADATA, 80),
    ]
    denied = [
        (trainer, trainer, 22),
        (trainer, rollout, 22),
        (trainer, rollout, COORDINATOR_PORT),
        (trainer, PUBLIC, 443),
        (trainer, POD_CIDR_IP, 443),
        (trainer, METADATA, 443),
        (trainer, KFP_API, 8888),
        (trainer, PIPELINE, 8080),
        (rollout, trainer, COORDINATOR_PORT),
        (rollout, rollout, ROLLOUT_PORT),
        (rollout, PUBLIC, 443),
        (rollout, KFP_API, 8888),
        (PIPELINE, trainer, COORDINATOR_PORT),
        (PIPELINE, rollout, ROLLOUT_PORT),
        (PIPELINE, PUBLIC, 80),
        (STRAY, trainer, COORDINATOR_PORT),
        (STRAY, rollout, ROLLOUT_PORT),
        (STRAY, PUBLIC, 443),
        (STRAY, GOOGLE_API, 443),
        (STRAY, METADATA, 80),
        (trainer, STRAY, 8080),
        (KFP_API, rollout, ROLLOUT_PORT),  # from another namespace
        (KFP_API, PIPELINE, 8080),
    ]
    return allowed, denied


def test_network_policies_allow_exactly_the_needed_flows():
    policies = _policies()
    allowed, denied = _flows()
    for source, destination, port in allowed:
        assert flow_allowed(policies, source, destination, port), (source.labels, destination, port)
    for source, destination, port in denied:
        assert not flow_allowed(policies, source, destination, port), (
            source.labels,
            destination,
            port,
        )
    for pod in (*_pods_from_jobset().values(), PIPELINE, STRAY):  # DNS for everyone, UDP and TCP
        assert flow_allowed(policies, pod, DNS, 53, "UDP") and flow_allowed(policies, pod, DNS, 53)
        assert not flow_allowed(policies, pod, DNS, 8080)


def test_the_rollout_rule_follows_the_configured_port():
    pods = _pods_from_jobset("cluster.rollout_port=9123")
    trainer, rollout = pods["trainer"], pods["rollout"]
    assert flow_allowed(_policies(), trainer, rollout, 9123)
    assert not flow_allowed(_policies(), trainer, rollout, ROLLOUT_PORT)


def test_without_the_policies_every_flow_is_open():
    """The evaluator is not trivially denying: with no policies each denied flow is allowed."""
    _, denied = _flows()
    assert all(flow_allowed([], s, d, p) for s, d, p in denied)


def test_policy_port_names_exist_on_the_pods_they_select():
    pods = _pods_from_jobset()
    for policy in _policies():
        for direction in ("ingress", "egress"):
            for rule in policy["spec"].get(direction) or []:
                names = [p["port"] for p in rule.get("ports") or [] if isinstance(p["port"], str)]
                if not names:
                    continue
                if direction == "ingress":
                    targets = [
                        p
                        for p in pods.values()
                        if _selects(policy["spec"]["podSelector"], p.labels)
                    ]
                else:
                    targets = [
                        p for p in pods.values() if any(_peer_matches(x, p) for x in rule["to"])
                    ]
                assert targets, policy["metadata"]["name"]
                for target in targets:
                    assert set(names) <= set(target.ports), (policy["metadata"]["name"], names)


# --- image pins --------------------------------------------------------------------------------


def _pins():
    spec = importlib.util.spec_from_file_location("image_pins", ROOT / "images" / "pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DIGEST = "sha256:" + "ab" * 32


def test_pin_check_accepts_digests_and_refuses_tags_and_placeholders(tmp_path):
    pins = _pins()
    ok = {"PYTHON_BASE": f"python:3.11.7-slim-bookworm@{DIGEST}"}
    assert pins.pin_problems(ok) == []
    assert "PYTHON_BASE" in pins.pin_problems({"PYTHON_BASE": "python:3.11.7-slim-bookworm"})[0]
    placeholder = pins.pin_problems({"PYTHON_BASE": "python:3.11@sha256:UNRESOLVED"})
    assert len(placeholder) == 1 and "not pinned by a sha256 digest" in placeholder[0]
    dockerfile = "ARG PYTHON_BASE\nFROM ${PYTHON_BASE} AS build\nFROM build\nFROM ${PYTHON_BASE}\n"
    assert pins.dockerfile_problems("x", dockerfile, ok) == []
    assert pins.dockerfile_problems("x", "FROM python:3.11\n", ok) == [
        "x: FROM python:3.11 is not pinned by digest"
    ]
    assert "no 'ARG PYTHON_BASE'" in pins.dockerfile_problems("x", "FROM ${PYTHON_BASE}\n", ok)[0]
    assert "not in base-images.txt" in pins.dockerfile_problems("x", "ARG B\nFROM $B\n", ok)[0]
    table = tmp_path / "t.txt"
    table.write_text(f"PYTHON_BASE python@{DIGEST}\nPYTHON_BASE python@{DIGEST}\n")
    with pytest.raises(ValueError, match="line 2"):
        pins.problems(table, [])


def test_every_dockerfile_names_its_base_through_the_pin_table():
    """The Dockerfiles are wired to the table; what remains is the table's own pins, which the
    build refuses while any digest is UNRESOLVED (`python3 images/pins.py check`)."""
    pins = _pins()
    table = pins.load(pins.TABLE.read_text())
    dockerfiles = sorted((ROOT / "images").glob("*.Dockerfile"))
    assert dockerfiles
    for path in dockerfiles:
        assert pins.dockerfile_problems(path.name, path.read_text(), table) == []
    unresolved = [name for name, ref in table.items() if not pins.PINNED.fullmatch(ref)]
    assert pins.problems() == pins.pin_problems(table)
    assert all(table[name].endswith("@sha256:UNRESOLVED") for name in unresolved)
    assert pins.main(["check"]) == (1 if unresolved else 0)


def test_manifest_images_are_pinned_by_digest():
    pins = _pins()
    for doc in _manifest_docs():
        if doc["kind"] in POD_KINDS:
            for _, spec in _pod_templates(doc):
                for c in [*spec.get("initContainers", []), *spec["containers"]]:
                    assert pins.PINNED.fullmatch(c["image"]), (doc["metadata"]["name"], c["image"])
