"""TPU slices on GKE: for each generation and topology, the machine type, chips per host and hosts.

The one table that config validation (`ClusterConfig`), provisioning (node pool machine type and
node count), the node selectors, the chip limits and the JobSet (one trainer pod, and one
`jax.distributed` process, per host) read. A host here is a TPU VM: one Kubernetes node. (Cloud
TPU's v5e and v6e pages also count 8-chip "hosts" in a separate column; 4x4 on v6e is 2 such
hosts but 4 VMs, and 4 VMs is what GKE schedules.) It lives with the configuration, the lowest
layer, so that validation can read it; it imports nothing.

Sources (read 2026-12): GKE, "Plan TPUs in GKE",
https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (the accelerator labels and
single- vs multi-host node pools); Cloud TPU, https://cloud.google.com/tpu/docs/v6e (topology,
chips, VMs and the GKE machine type of every v6e slice), https://cloud.google.com/tpu/docs/v5e
(1-, 4- and 8-chip VM types ct5lp-hightpu-1t/4t/8t) with
https://cloud.google.com/tpu/docs/tpus-in-gke (a v5e 4x4 slice is four 4-chip VMs), and
https://cloud.google.com/tpu/docs/v5p (every v5p VM is a 4-chip ct5p-hightpu-4t).

One row per (generation, topology), so the pair names its slice. GKE also offers v6e 2x4 as two
4-chip ct6e-standard-4t VMs; this table takes the single-host ct6e-standard-8t for 2x4 (one host,
no `jax.distributed`), and 4x4 is the smallest multi-host v6e slice here.
"""

from __future__ import annotations

from dataclasses import dataclass

# GKE's node label value (cloud.google.com/gke-tpu-accelerator) of each generation.
ACCELERATOR = {"v5e": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    tpu_type: str  # v5e, v5p, v6e
    topology: str  # chips along each axis, as GKE's cloud.google.com/gke-tpu-topology label
    machine_type: str  # the node pool's GKE machine type
    chips_per_host: int  # google.com/tpu chips of one node (the pod's limit)
    hosts: int  # nodes of the slice: trainer pods and jax.distributed processes

    @property
    def chips(self) -> int:
        return self.chips_per_host * self.hosts

    @property
    def accelerator(self) -> str:
        return ACCELERATOR[self.tpu_type]


def _rows(tpu_type: str, machine_type: str, per_host: int, shapes: dict[str, int]):
    return tuple(
        Slice(
            tpu_type=tpu_type,
            topology=topology,
            machine_type=machine_type,
            chips_per_host=per_host,
            hosts=hosts,
        )
        for topology, hosts in shapes.items()
    )


SLICES: tuple[Slice, ...] = (
    *_rows("v5e", "ct5lp-hightpu-1t", 1, {"1x1": 1}),
    *_rows("v5e", "ct5lp-hightpu-4t", 4, {"2x2": 1}),
    *_rows("v5e", "ct5lp-hightpu-8t", 8, {"2x4": 1}),
    *_rows("v5e", "ct5lp-hightpu-4t", 4, {"4x4": 4, "4x8": 8, "8x8": 16, "8x16": 32, "16x16": 64}),
    *_rows(
        "v5p",
        "ct5p-hightpu-4t",
        4,
        {"2x2x1": 1, "2x2x2": 2, "2x2x4": 4, "2x4x4": 8, "4x4x4": 16, "4x4x8": 32, "4x8x8": 64},
    ),
    *_rows("v6e", "ct6e-standard-1t", 1, {"1x1": 1}),
    *_rows("v6e", "ct6e-standard-4t", 4, {"2x2": 1}),
    *_rows("v6e", "ct6e-standard-8t", 8, {"2x4": 1}),
    *_rows("v6e", "ct6e-standard-4t", 4, {"4x4": 4, "4x8": 8, "8x8": 16, "8x16": 32, "16x16": 64}),
)
_BY_PAIR = {(s.tpu_type, s.topology): s for s in SLICES}


def topologies(tpu_type: str) -> tuple[str, ...]:
    """The topologies of `tpu_type` in the table, smallest first."""
    return tuple(s.topology for s in SLICES if s.tpu_type == tpu_type)


def single_host(tpu_type: str, chips_per_host: int) -> Slice | None:
    """The single-host slice of `tpu_type` whose one host has `chips_per_host` chips (a rollout
    replica's node: the machine type of a trainer host of that size); None if there is none."""
    for s in SLICES:
        if s.tpu_type == tpu_type and s.hosts == 1 and s.chips_per_host == chips_per_host:
            return s
    return None


def find(tpu_type: str, topology: str) -> Slice | None:
    return _BY_PAIR.get((tpu_type, topology))


def slice_of(tpu_type: str, topology: str) -> Slice:
    """The slice of (tpu_type, topology); a ValueError names the allowed values otherwise."""
    found = find(tpu_type, topology)
    if found is not None:
        return found
    if tpu_type not in ACCELERATOR:
        raise ValueError(f"unknown TPU type {tpu_type!r}; known: {', '.join(ACCELERATOR)}")
    known = ", ".join(topologies(tpu_type))
    raise ValueError(f"{tpu_type} has no {topology!r} slice on GKE; known: {known}")


def slice_shape(tpu_type: str, topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of a slice; a ValueError for one not in the table."""
    s = slice_of(tpu_type, topology)
    return s.hosts, s.chips_per_host
