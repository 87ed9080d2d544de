"""The pipeline on this machine: the same pipeline function, executed by `kfp.local`.

`kfp.local.SubprocessRunner(use_venv=False)` runs each component in a subprocess of this Python
environment (where asyncrl is installed), in pipeline order, with the exit handler. Everything a
run writes goes under `runs/<run id>/` (the KFP task outputs under `runs/<run id>/kfp/`).
A config with `cluster.backend: gke` runs against a local cluster (cloud/local_cluster.py) that
this process holds for the run: the tasks provision through its loopback GKE API and the train
task launches the run's JobSet on its Kubernetes API, where the local JobSet executor runs the
pods as processes (state and pod logs under `runs/<run id>/cluster/`). The
outcome is read from what the stages wrote, not from log lines: the teardown record holds the
pipeline's final state, and each stage's result file says how far the run got.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import RunConfig, to_yaml
from asyncrl.run_layout import RunLayout, Stage, new_run_id


@dataclass(frozen=True, slots=True)
class LocalRun:
    run_dir: Path
    succeeded: bool
    final_state: str  # the pipeline's state as its exit handler saw it
    stages_done: tuple[str, ...]
    gate_passed: bool | None
    teardown_ran: bool


def run_local(cfg: RunConfig, cluster=None) -> LocalRun:
    """Run the pipeline through kfp.local. With backend gke: against `cluster` (a LocalCluster),
    else a local cluster of its own for the run."""
    from kfp import local

    from asyncrl.pipeline.definition import build_pipeline

    run_id = cfg.pipeline.run_id or new_run_id()
    cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, run_id=run_id))
    layout = RunLayout.at(cfg.pipeline.runs_dir, run_id).create()
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(layout.kfp_root),
        raise_on_error=False,
    )
    with contextlib.ExitStack() as stack:
        if cfg.cluster.backend == "gke":
            from asyncrl.cloud.local_cluster import cluster_for, environment

            if cluster is None:
                cluster = stack.enter_context(cluster_for(cfg, layout.root / "cluster"))
            stack.enter_context(environment(cluster.env()))  # the tasks inherit it
        build_pipeline(cfg)(config_yaml=to_yaml(cfg))
    return outcome(layout)


def outcome(layout: RunLayout) -> LocalRun:
    """How far the run got, from the stages' validated results (a malformed one is not done)."""
    from asyncrl.stages.promote import PromotionResult
    from asyncrl.stages.provision import ProvisionResult, TeardownResult
    from asyncrl.stages.quality_gate import GateResult
    from asyncrl.stages.recovery_test import RecoveryVerdict
    from asyncrl.stages.report import ReportPaths
    from asyncrl.stages.train import TrainResult
    from asyncrl.stages.warm_start import WarmStartResult

    kinds = (ProvisionResult, WarmStartResult, TrainResult, RecoveryVerdict, GateResult)
    kinds += (PromotionResult, ReportPaths)
    done = tuple(k.STAGE.value for k in kinds if layout.done(k))
    teardown = layout.maybe(TeardownResult)
    state = teardown.pipeline_state if teardown else "UNKNOWN"
    gate = layout.maybe(GateResult)
    return LocalRun(
        run_dir=layout.root,
        succeeded=state == "SUCCEEDED" and Stage.REPORT.value in done,
        final_state=state,
        stages_done=done,
        gate_passed=gate.passed if gate else None,
        teardown_ran=teardown is not None,
    )
