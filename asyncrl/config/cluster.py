"""Configuration of where a run executes: backend, placement, meshes, the TPU slice, node pools,
rollout replicas and the JobSet's restart and wait bounds (`ClusterConfig`).

Owns what a cluster setting may be: (tpu_type, tpu_topology) a row of config/topology.py's table,
the replicas' single-host slice and node pool name, a bind address that is an IP, a Secret name that
Kubernetes accepts. Secrets are never values here: the token Secret and service accounts are named
by reference, and the cluster resolves them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.errors import INT32_MAX, MAX_SECONDS, bounds, require, seconds
from asyncrl.config.topology import Slice, find, single_host, slice_of, topologies

Placement = Literal["colocated", "disaggregated", "remote"]
Backend = Literal["local", "gke"]
TpuType = Literal["none", "v5e", "v5p", "v6e"]

_TOPOLOGY = re.compile(r"^\d+x\d+(x\d+)?$")
_NODE_POOL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # GKE's node pool names
# A Kubernetes object name that must be a DNS-1123 subdomain (Secrets among them).
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_ALLOWED = (
    "a Kubernetes object name (DNS-1123 subdomain): at most 253 characters of a-z, 0-9, '-' "
    "and '.', starting and ending with a-z or 0-9"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    # Where execution happens: this machine ("local") or a GKE cluster ("gke").
    backend: Backend = "local"
    # How rollout and training share devices (DESIGN.md, "Topologies").
    placement: Placement = "colocated"
    # Devices for the rollout engine and for the learner when disaggregated (0 = all / the rest).
    rollout_devices: int = 0
    train_devices: int = 0
    # Mesh axes of the train mesh; their product must equal its device count (1 = unsharded).
    mesh_data: int = 1
    mesh_fsdp: int = -1
    mesh_tensor: int = 1
    # TPU generation and slice topology for GKE, a pair of config/topology.py's table, which gives
    # the machine type, chips per host and hosts ("2x4" on v6e: one host of 8 chips; "4x4": four
    # hosts of 4, a multi-host trainer).
    tpu_type: TpuType = "none"
    tpu_topology: str = ""
    # Rollout replicas (separate processes or pods) when placement is "remote".
    rollout_replicas: int = 0
    # On GKE each remote replica is one pod on one single-host TPU node of its own node pool,
    # `<node_pool>-rollout` (the trainer's pool is all the trainer's: its JobSet job holds it
    # exclusively). Its topology, a single-host tpu_type slice of config/topology.py; "" = the
    # one whose host equals a trainer host (same machine type, so the same reservation serves).
    rollout_tpu_topology: str = ""
    # Address and port a replica binds (`asyncrl rollout-server --host/--port` override them).
    # Loopback by default; a replica in a pod binds 0.0.0.0 so the trainer can reach it.
    rollout_bind_host: str = "127.0.0.1"
    rollout_port: int = 8470
    # Kubernetes Secret holding the shared token of trainer and replicas (mounted as a file; the
    # token itself is never a config value).
    rollout_token_secret: str = "asyncrl-rollout-token"
    # Connections a replica serves at once; beyond it a peer gets `busy` (0 = room for every
    # episode the trainer runs at once: 2 x rollout.max_concurrency + 16).
    rollout_max_connections: int = field(default=0, metadata=bounds(0, 65536))
    # Seconds a peer has to send its whole request line to a replica.
    rollout_read_timeout_s: float = field(default=30.0, metadata=seconds())
    # Weight versions kept in the weights root after a publish (the one just sent included).
    rollout_keep_versions: int = field(default=2, metadata=bounds(1, 1000))
    # The trainer probes a dead replica (a restarted pod keeps its DNS name) first after about
    # this many seconds, then with doubling waits up to rollout_probe_max_backoff_s, each drawn
    # in (1/2, 1] of its value; a replica that passes (token, model, current weights) serves again.
    rollout_probe_interval_s: float = field(default=5.0, metadata=seconds(0.01))
    rollout_probe_max_backoff_s: float = field(default=60.0, metadata=seconds(0.01))
    # GCP project, location and cluster for the gke backend.
    project: str = ""
    location: str = ""
    cluster_name: str = ""
    # Node pool to create or reuse; spot capacity or a named reservation.
    node_pool: str = ""
    spot: bool = False
    reservation: str = ""
    # Kubernetes namespace and service account (by name; Workload Identity binds it to GCS).
    namespace: str = "asyncrl"
    service_account: str = "asyncrl-runner"
    # Container image of all stages, by tag or digest.
    image: str = "asyncrl-runtime:0.1.0"
    # Restarts of the whole JobSet after a trainer pod fails (its failurePolicy.maxRestarts); each
    # restart resumes from the run's newest checkpoint. 0 = the first trainer failure is final.
    max_restarts: int = field(default=3, metadata=bounds(0, INT32_MAX, "JobSet restarts"))
    # Seconds the train stage's launcher waits for its JobSet before deleting it; null = the
    # KFP task's own limit (pipeline.timeout_s) less 120 s, and at least half of it, so the
    # launcher, not the task's kill, ends the JobSet. When given it must be below that limit.
    jobset_timeout_s: float | None = field(default=None, metadata=seconds(1.0))

    def __post_init__(self) -> None:
        require(
            self.rollout_devices >= 0, "rollout_devices", self.rollout_devices, "an integer >= 0"
        )
        require(self.train_devices >= 0, "train_devices", self.train_devices, "an integer >= 0")
        require(self.mesh_data >= 1, "mesh_data", self.mesh_data, "an integer >= 1")
        require(self.mesh_tensor >= 1, "mesh_tensor", self.mesh_tensor, "an integer >= 1")
        require(
            self.mesh_fsdp >= 1 or self.mesh_fsdp == -1,
            "mesh_fsdp",
            self.mesh_fsdp,
            "an integer >= 1, or -1 for all remaining devices",
        )
        require(self.rollout_replicas >= 0, "rollout_replicas", self.rollout_replicas, ">= 0")
        require(
            self.placement != "remote" or self.rollout_replicas >= 1,
            "rollout_replicas",
            self.rollout_replicas,
            "at least 1 when placement is 'remote'",
        )
        self._check_rollout_serving()
        self._check_jobset()
        require(
            not self.tpu_topology or bool(_TOPOLOGY.match(self.tpu_topology)),
            "tpu_topology",
            self.tpu_topology,
            "a topology such as '2x2', '2x4' or '2x2x2'",
        )
        if self.backend == "gke":
            for name in ("project", "location", "cluster_name", "node_pool", "tpu_topology"):
                value = getattr(self, name)
                require(bool(value), name, value, "a non-empty value when backend is 'gke'")
            require(self.tpu_type != "none", "tpu_type", self.tpu_type, "v5e, v5p or v6e on gke")
        if self.tpu_type != "none" and self.tpu_topology:
            offered = ", ".join(topologies(self.tpu_type))
            require(
                find(self.tpu_type, self.tpu_topology) is not None,
                "tpu_topology",
                self.tpu_topology,
                f"a {self.tpu_type} slice GKE offers (config/topology.py): {offered}",
            )
        self._check_rollout_pool()
        require(
            self.placement != "disaggregated" or self.hosts == 1,
            "placement",
            self.placement,
            f"'remote' or 'colocated' on a {self.hosts}-host slice ('disaggregated' splits one "
            "host's devices)",
        )

    @property
    def hosts(self) -> int:
        """Hosts of the TPU slice (trainer processes; config/topology.py); 1 without a TPU."""
        if self.tpu_type == "none" or not self.tpu_topology:
            return 1
        return slice_of(self.tpu_type, self.tpu_topology).hosts

    @property
    def rollout_node_pool(self) -> str:
        """The node pool of the remote rollout replicas on GKE (derived from `node_pool`)."""
        return f"{self.node_pool}-rollout"

    @property
    def rollout_slice(self) -> Slice | None:
        """The single-host slice each remote replica runs on; None without a TPU slice."""
        if self.tpu_type == "none" or not self.tpu_topology:
            return None
        if self.rollout_tpu_topology:
            return find(self.tpu_type, self.rollout_tpu_topology)
        return single_host(self.tpu_type, slice_of(self.tpu_type, self.tpu_topology).chips_per_host)

    def _check_rollout_pool(self) -> None:
        if self.tpu_type == "none" or find(self.tpu_type, self.tpu_topology) is None:
            require(
                not self.rollout_tpu_topology,
                "rollout_tpu_topology",
                self.rollout_tpu_topology,
                "'' unless tpu_type and tpu_topology name a TPU slice",
            )
            return
        offered = [t for t in topologies(self.tpu_type) if slice_of(self.tpu_type, t).hosts == 1]
        rollout = self.rollout_slice
        require(
            rollout is not None and rollout.hosts == 1,
            "rollout_tpu_topology",
            self.rollout_tpu_topology,
            f"a single-host {self.tpu_type} slice (config/topology.py): {', '.join(offered)}; "
            "or '' for the one of a trainer host's size",
        )
        if self.backend == "gke" and self.placement == "remote":
            pool = self.rollout_node_pool
            require(
                len(pool) <= 40 and bool(_NODE_POOL.match(pool)),
                "node_pool",
                self.node_pool,
                "a GKE node pool name of lowercase letters, digits and '-', starting with a "
                "letter, short enough that '<node_pool>-rollout' (the replicas' pool) has at "
                "most 40 characters",
            )

    def _check_rollout_serving(self) -> None:
        require(
            is_ip(self.rollout_bind_host),
            "rollout_bind_host",
            self.rollout_bind_host,
            "an IP address: 127.0.0.1 (loopback), 0.0.0.0 (all interfaces, as in a pod) or ::",
        )
        require(1 <= self.rollout_port <= 65535, "rollout_port", self.rollout_port, "1 to 65535")
        require(
            len(self.rollout_token_secret) <= 253
            and bool(_DNS1123.match(self.rollout_token_secret)),
            "rollout_token_secret",
            self.rollout_token_secret,
            _DNS1123_ALLOWED,
        )
        require(
            self.rollout_max_connections >= 0,
            "rollout_max_connections",
            self.rollout_max_connections,
            "an integer >= 1, or 0 for 2 x rollout.max_concurrency + 16",
        )
        require(
            self.rollout_read_timeout_s > 0,
            "rollout_read_timeout_s",
            self.rollout_read_timeout_s,
            "a number of seconds > 0",
        )
        require(
            self.rollout_keep_versions >= 1,
            "rollout_keep_versions",
            self.rollout_keep_versions,
            "an integer >= 1",
        )
        require(
            self.rollout_probe_interval_s > 0,
            "rollout_probe_interval_s",
            self.rollout_probe_interval_s,
            "a number of seconds > 0",
        )
        require(
            self.rollout_probe_max_backoff_s >= self.rollout_probe_interval_s,
            "rollout_probe_max_backoff_s",
            self.rollout_probe_max_backoff_s,
            f"seconds >= rollout_probe_interval_s ({self.rollout_probe_interval_s:g})",
        )

    def _check_jobset(self) -> None:
        require(
            0 <= self.max_restarts <= INT32_MAX,
            "max_restarts",
            self.max_restarts,
            f"an integer in [0, {INT32_MAX}] (JobSet restarts)",
        )
        t = self.jobset_timeout_s
        require(
            t is None or 1 <= t <= MAX_SECONDS,  # NaN fails both comparisons
            "jobset_timeout_s",
            t,
            f"a number of seconds in [1, {MAX_SECONDS:.0f}] (30 days at most), or null for "
            "pipeline.timeout_s less 120 s",
        )


def is_ip(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 address (what a replica may bind)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
