"""Stages: provision (before everything) and teardown (after everything, even after a failure).

Provision makes the run folder, records the resolved config, checks the model (`model_check`)
and acquires the devices: on the `local` backend that means the CPU's (virtual) devices, nothing to
create; on `gke` the pipeline hands in a `Provisioner` (cloud/provision.py) that creates or reuses
the TPU node pool. Everything it created is recorded in the `ProvisionResult`, and teardown
releases exactly that, nothing else, and records a `TeardownResult`. Both are safe to retry.

A run id names one run: provisioning an existing run folder is a resume, allowed only when the
folder's config has the same hash as this config; otherwise it is refused, naming what differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar, Protocol

from asyncrl.config import ConfigError, RunConfig, load_config_text, to_yaml
from asyncrl.run_layout import LayoutError, RunLayout, Stage


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """Something provision acquired for the run (a node pool), as teardown needs to release it."""

    kind: str
    name: str
    created: bool  # made for this run (teardown deletes it), not found already there
    status: str = ""


class Provisioner(Protocol):
    def acquire(self, cfg: RunConfig) -> tuple[Resource, ...]:
        """Every resource the run needs (a TPU node pool; a rollout pool with remote replicas),
        in order; all or nothing: one that fails leaves none of its own creations behind."""
        ...

    def release(self, cfg: RunConfig, resource: Resource) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisionResult:
    STAGE: ClassVar[Stage] = Stage.PROVISION
    run_id: str
    run_dir: str
    backend: str
    devices: str  # what the run will use, in words
    created: tuple[Resource, ...] = ()  # resources teardown must release
    model_check_ok: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class TeardownResult:
    STAGE: ClassVar[Stage] = Stage.TEARDOWN
    pipeline_state: str
    released: tuple[Resource, ...] = ()


def claim(layout: RunLayout, cfg: RunConfig) -> RunLayout:
    """Create the run folder with this config, or reuse it for a resume of the same config.

    A reused run id whose recorded config differs is refused (ConfigError naming the keys)."""
    layout.create()
    if layout.config.exists():
        try:
            old = load_config_text(layout.config.read_text())
        except (ConfigError, OSError, UnicodeDecodeError) as e:
            raise LayoutError(
                f"{layout.config}: the run's recorded config is unreadable ({e})"
            ) from None
        if old.hash() != cfg.hash():
            diffs = _differences(old.to_dict(), cfg.to_dict())
            raise ConfigError(
                "pipeline.run_id",
                f"{layout.run_id!r} is an existing run with another config "
                f"({', '.join(diffs[:5])}); use a new run id, or the same config to resume it",
            )
        return layout
    layout.write_text(layout.config, to_yaml(cfg))
    return layout


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if not prefix and key == "pipeline":
            continue  # where and how the run goes, not what it trains: not in the config hash
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r:.40} → {b!r:.40}")
    return out


def provision(
    cfg: RunConfig, layout: RunLayout, provisioner: Provisioner | None = None
) -> ProvisionResult:
    from asyncrl.stages.model_check import model_check

    claim(layout, cfg)
    created: tuple[Resource, ...] = ()
    if cfg.cluster.backend == "gke":
        if provisioner is None:
            raise ValueError("cluster.backend gke needs a provisioner (the pipeline passes one)")
        resources = provisioner.acquire(cfg)
        created = tuple(r for r in resources if r.created)
        pools = ", ".join(r.name for r in resources)
        devices = f"{cfg.cluster.tpu_type} {cfg.cluster.tpu_topology} node pools {pools}"
    else:
        devices = f"local CPU ({os.cpu_count()} cores, placement {cfg.cluster.placement})"
    check = model_check(cfg, layout)
    result = ProvisionResult(
        run_id=layout.run_id,
        run_dir=layout.location,
        backend=cfg.cluster.backend,
        devices=devices,
        created=created,
        model_check_ok=check.ok,
    )
    layout.write(result)
    if not check.ok:
        raise RuntimeError(f"model check failed: see {layout.result_path(Stage.MODEL_CHECK)}")
    return result


def teardown(
    cfg: RunConfig,
    layout: RunLayout,
    pipeline_state: str = "",
    provisioner: Provisioner | None = None,
) -> TeardownResult:
    """Release what provision created for this run (nothing on the local backend)."""
    record = layout.maybe(ProvisionResult)
    released = []
    for resource in reversed(record.created) if record else ():  # the last acquired first
        if provisioner is None:
            raise ValueError(f"cannot release {resource.kind} {resource.name}: no provisioner")
        provisioner.release(cfg, resource)
        released.append(resource)
    result = TeardownResult(pipeline_state=pipeline_state, released=tuple(released))
    if layout.root.is_dir():
        layout.write(result)
    return result
