"""Stages: provision (before everything) and teardown (after everything, even after a failure).

Provision makes the run folder, records the resolved config, checks the model (`model_check`)
and acquires the devices: on the `local` backend that means the CPU's (virtual) devices, nothing to
create; on `gke` it creates or reuses the TPU node pool (`asyncrl.cloud.provision`). Everything it
created is written to `<run>/provision.json`, and teardown deletes exactly that, nothing else, and
records `<run>/teardown.json`. Both are safe to retry.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asyncrl.config import RunConfig, to_yaml
from asyncrl.stages.run_dir import CONFIG_FILE

PROVISION_FILE = "provision.json"
TEARDOWN_FILE = "teardown.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisionResult:
    run_id: str
    run_dir: str
    backend: str
    devices: str  # what the run will use, in words
    created: list[dict] = field(default_factory=list)  # resources teardown must delete
    model_check_ok: bool = True


def local_path(uri: str) -> Path:
    """A run folder URI as a path this process can write: gs://b/p is /gcs/b/p on GKE pods (the
    Cloud Storage FUSE CSI volume), a local path is itself."""
    if uri.startswith("gs://"):
        return Path("/gcs") / uri[len("gs://") :]
    return Path(uri)


def run_folder(cfg: RunConfig, job_id: str) -> Path:
    """The run's folder: `pipeline.run_id` when set, else the pipeline job's id, under runs_dir."""
    return (local_path(cfg.pipeline.runs_dir) / (cfg.pipeline.run_id or job_id)).absolute()


def provision(cfg: RunConfig, job_id: str) -> ProvisionResult:
    from asyncrl.stages.model_check import model_check

    run_dir = run_folder(cfg, job_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(to_yaml(cfg))
    created: list[dict] = []
    if cfg.cluster.backend == "gke":
        from asyncrl.cloud.provision import provision_node_pool

        record = provision_node_pool(cfg)
        created = [record] if record.get("created") else []
        devices = f"{cfg.cluster.tpu_type} {cfg.cluster.tpu_topology} node pool {record['name']}"
    else:
        devices = f"local CPU ({os.cpu_count()} cores, placement {cfg.cluster.placement})"
    check = model_check(cfg, run_dir)
    result = ProvisionResult(
        run_id=run_dir.name,
        run_dir=str(run_dir),
        backend=cfg.cluster.backend,
        devices=devices,
        created=created,
        model_check_ok=check.ok,
    )
    (run_dir / PROVISION_FILE).write_text(json.dumps(asdict(result), indent=2))
    if not check.ok:
        raise RuntimeError(f"model check failed: see {run_dir}/model_check.json")
    return result


def teardown(cfg: RunConfig, run_dir: Path, pipeline_state: str = "") -> dict:
    """Delete what provision created for this run (nothing on the local backend)."""
    record_path = run_dir / PROVISION_FILE
    created = json.loads(record_path.read_text())["created"] if record_path.exists() else []
    deleted = []
    for resource in created:
        if resource.get("kind") == "node_pool":
            from asyncrl.cloud.provision import delete_node_pool

            delete_node_pool(cfg, resource)
            deleted.append(resource)
    result = {"pipeline_state": pipeline_state, "deleted": deleted, "created": created}
    if run_dir.exists():
        (run_dir / TEARDOWN_FILE).write_text(json.dumps(result, indent=2))
    return result
