"""The kubelet of the local JobSet executor: one pod's container as a process on this machine.

What a kubelet and a container runtime would give the container, minus images and isolation:
- environment: the container's `env`, `valueFrom.fieldRef` resolved against the pod object
  (metadata.name/namespace/labels/annotations, status.podIP, spec.hostname), plus HOSTNAME, over
  the image's environment (`base_env`);
- volumes: an `emptyDir` is a fresh folder, a `secret` its items written as files (mode
  `defaultMode`), read through the API. With no mount namespace, each `mountPath` is replaced by
  its folder in the command and args, and in an env value that is a path under it. Folders in
  `shared` are the same inside and outside (the run folder, which GKE pods see through the Cloud
  Storage FUSE volume); the deepest mount wins, as in a container;
- network: the pod has its own loopback address (Linux routes all of 127/8 to `lo`). The
  headless-service names of the JobSet's pods (`<hostname>.<subdomain>`, with or without
  `.<namespace>.svc.cluster.local`) are replaced by their addresses wherever they appear (what the
  cluster DNS resolves), and the wildcard 0.0.0.0 by the pod's own address (a pod's "all
  interfaces" are its own, not the machine's);
- logs: stdout and stderr, one RFC 3339-stamped line each, in a file that pods/log serves.
Not emulated: images, resources, node selection, security contexts, probes other than tcpSocket.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_LINE = 16 * 1024  # the kubelet splits longer log lines
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PodStartError(RuntimeError):
    """A pod the kubelet cannot start (its status reason: CreateContainerConfigError)."""


@dataclass
class PodProcess:
    name: str
    ip: str
    process: subprocess.Popen
    log: Path
    spec: dict[str, Any]
    ready: bool = False
    stopping: bool = False  # terminated by the controller, not failed by itself
    _pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def container(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def probe(self) -> bool:
        """The readiness probe (tcpSocket) passes now; a pod without one is ready when running."""
        probe = self.spec["containers"][0].get("readinessProbe")
        if probe is None:
            return True
        port = probe.get("tcpSocket", {}).get("port")
        if isinstance(port, str):
            ports = self.spec["containers"][0].get("ports") or []
            port = next((p["containerPort"] for p in ports if p.get("name") == port), None)
        if not isinstance(port, int):
            return False
        try:
            with socket.create_connection((self.ip, port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self, grace_s: float) -> int:
        """SIGTERM to the pod's process group, SIGKILL after `grace_s`; returns the exit code."""
        self.stopping = True
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait()
        if self._pump is not None:
            self._pump.join(5)
        return self.process.returncode


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def exit_code(returncode: int) -> int:
    """A container's exit code as Kubernetes reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def start_pod(
    pod: dict[str, Any],
    *,
    ip: str,
    hosts: Mapping[str, str],
    secret: Callable[[str], Mapping[str, bytes]],
    folder: Path,
    base_env: Mapping[str, str],
    shared: Sequence[Path] = (),
) -> PodProcess:
    """Start the pod's (single) container; PodStartError when its spec cannot be honoured."""
    spec = pod["spec"]
    if len(spec["containers"]) != 1 or spec.get("initContainers"):
        raise PodStartError("the local kubelet runs exactly one container per pod")
    container = spec["containers"][0]
    volumes = _volumes(spec, folder / "volumes", secret)
    mounts = {Path(m["mountPath"]): volumes[m["name"]] for m in container.get("volumeMounts", [])}
    mounts |= {p: p for p in shared}
    rewrite = _rewriter(ip, hosts, mounts, pod["metadata"].get("namespace", "default"))
    env = dict(base_env)
    for item in container.get("env", []):
        value = _env_value(item, pod, ip)
        env[item["name"]] = rewrite(value, whole_path_only=True)
    env["HOSTNAME"] = spec.get("hostname") or pod["metadata"]["name"]
    argv = [rewrite(a) for a in [*container.get("command", []), *container.get("args", [])]]
    if not argv:
        raise PodStartError(
            "the local kubelet has no image entrypoint: the container needs a command"
        )
    log = folder / "log"
    out = subprocess.Popen(
        argv,
        env=env,
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopping the pod stops all of it
    )
    pump = threading.Thread(
        target=_pump, args=(out, log), daemon=True, name=f"log-{pod['metadata']['name']}"
    )
    pump.start()
    return PodProcess(
        name=pod["metadata"]["name"], ip=ip, process=out, log=log, spec=spec, _pump=pump
    )


def _pump(process: subprocess.Popen, log: Path) -> None:
    with log.open("ab") as f:
        for line in iter(process.stdout.readline, b""):
            stamp = (
                dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
            )
            f.write(stamp.encode() + b" " + line.rstrip(b"\n")[:MAX_LINE] + b"\n")
            f.flush()


def read_log(log: Path, tail: int | None, timestamps: bool) -> str:
    """The pod's log as pods/log returns it: the last `tail` lines, stamps kept or cut."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    if not timestamps:
        lines = [line.split(" ", 1)[1] if " " in line else "" for line in lines]
    return "".join(f"{line}\n" for line in lines)


def _volumes(spec, root: Path, secret) -> dict[str, Path]:
    out = {}
    for volume in spec.get("volumes", []):
        path = root / volume["name"]
        path.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            _write_secret(volume["secret"], path, secret)
        elif "emptyDir" not in volume:
            kinds = sorted(set(volume) - {"name"})
            raise PodStartError(
                f"volume {volume['name']}: {kinds} not supported by the local kubelet"
            )
        out[volume["name"]] = path
    return out


def _write_secret(source: dict[str, Any], path: Path, secret) -> None:
    try:
        data = secret(source["secretName"])
    except LookupError:
        raise PodStartError(f'secret "{source["secretName"]}" not found') from None
    mode = source.get("defaultMode", 0o644)
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        if item["key"] not in data:
            raise PodStartError(f"secret {source['secretName']}: no key {item['key']!r}")
        target = path / item["path"]
        target.write_bytes(data[item["key"]])
        target.chmod(mode & 0o777 | 0o400)  # the kubelet's owner is root; here the owner is us


def secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret object's data, decoded (stringData taken as written)."""
    out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out |= {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
    return out


def _env_value(item: dict[str, Any], pod: dict[str, Any], ip: str) -> str:
    if "value" in item:
        return str(item["value"])
    ref = (item.get("valueFrom") or {}).get("fieldRef")
    if ref is None:
        raise PodStartError(f"env {item['name']}: only value and fieldRef are supported locally")
    path, meta = ref["fieldPath"], pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", ""),
        "status.podIP": ip,
        "spec.hostname": pod["spec"].get("hostname", ""),
    }
    if path in simple:
        return simple[path]
    match = _FIELD.match(path)
    if match is None:
        raise PodStartError(f"env {item['name']}: fieldPath {path!r} is not supported locally")
    return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))


def _rewriter(ip: str, hosts: Mapping[str, str], mounts: Mapping[Path, Path], namespace: str):
    """(text, whole_path_only) -> text with cluster names, the wildcard address and mount paths
    replaced by what they are on this machine."""
    names = {}
    for fqdn, address in hosts.items():
        for suffix in ("", ".svc", ".svc.cluster.local"):
            names[f"{fqdn}.{namespace}{suffix}"] = address
        names[fqdn] = address
    host_re = _alternation(names, r"(?<![\w.-])", r"(?![\w.-])")
    # Longest first: the deepest mount of a path wins.
    mount_re = _alternation(
        {str(p): str(q) for p, q in mounts.items()}, r"(?<![\w.-])", r"(?=/|$|[^\w.-])"
    )
    wildcard = re.compile(r"(?<![\w.])0\.0\.0\.0(?![\w.])")

    def rewrite(text: str, whole_path_only: bool = False) -> str:
        if host_re is not None:
            text = host_re[0].sub(lambda m: host_re[1][m.group(0)], text)
        text = wildcard.sub(ip, text)
        if mount_re is not None and (not whole_path_only or text.startswith("/")):
            pattern, table = mount_re
            if whole_path_only:
                match = pattern.match(text)
                return table[match.group(0)] + text[match.end() :] if match else text
            text = pattern.sub(lambda m: table[m.group(0)], text)
        return text

    return rewrite


def _alternation(table: Mapping[str, str], before: str, after: str):
    """(regex matching any key of `table`, longest key first, between `before` and `after`;
    the table), or None for an empty table."""
    if not table:
        return None
    keys = sorted(table, key=len, reverse=True)
    pattern = re.compile(before + "(?:" + "|".join(re.escape(k) for k in keys) + ")" + after)
    return pattern, dict(table)
