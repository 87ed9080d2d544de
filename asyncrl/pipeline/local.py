"""The pipeline on this machine: the same pipeline function, executed by `kfp.local`.

`kfp.local.SubprocessRunner(use_venv=False)` runs each component in a subprocess of this Python
environment (where asyncrl is installed), in pipeline order, with the exit handler. Everything a
run writes goes under `runs/<run id>/` (the KFP task outputs under `runs/<run id>/kfp/`). The
outcome is read from what the stages wrote, not from log lines: the teardown record holds the
pipeline's final state, and each stage's result file says how far the run got.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import RunConfig, to_yaml
from asyncrl.stages.provision import TEARDOWN_FILE, run_folder

STAGE_RESULTS = {
    "provision": "provision.json",
    "warm_start": "warm_start/warm_start.json",
    "train": "train/train.json",
    "recovery_test": "recovery_test/verdict.json",
    "quality_gate": "quality_gate/report.json",
    "report": "report.html",
}


@dataclass(frozen=True, slots=True)
class LocalRun:
    run_dir: Path
    succeeded: bool
    final_state: str  # the pipeline's state as its exit handler saw it
    stages_done: tuple[str, ...]
    gate_passed: bool | None
    teardown_ran: bool


def run_local(cfg: RunConfig) -> LocalRun:
    from kfp import local

    from asyncrl.pipeline.definition import build_pipeline
    from asyncrl.stages.run_dir import new_run_id

    run_id = cfg.pipeline.run_id or new_run_id()
    cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, run_id=run_id))
    run_dir = run_folder(cfg, "")
    run_dir.mkdir(parents=True, exist_ok=True)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(run_dir / "kfp"),
        raise_on_error=False,
    )
    build_pipeline(cfg)(config_yaml=to_yaml(cfg))
    return outcome(run_dir)


def outcome(run_dir: Path) -> LocalRun:
    done = tuple(s for s, rel in STAGE_RESULTS.items() if (run_dir / rel).exists())
    teardown = run_dir / TEARDOWN_FILE
    state = json.loads(teardown.read_text())["pipeline_state"] if teardown.exists() else "UNKNOWN"
    gate_file = run_dir / STAGE_RESULTS["quality_gate"]
    gate = json.loads(gate_file.read_text())["passed"] if gate_file.exists() else None
    return LocalRun(
        run_dir=run_dir,
        succeeded=state == "SUCCEEDED" and "report" in done,
        final_state=state,
        stages_done=done,
        gate_passed=gate,
        teardown_ran=teardown.exists(),
    )
