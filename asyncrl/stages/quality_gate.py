"""Stage: the held-out quality gate. Evaluate the candidate, compare with the champion, decide.

The candidate is the run's trained model (`train/model`, else `warm_start/model`, or a given
folder). It is evaluated on the fixed held-out split greedily and with `gate.samples_per_task`
samples at `gate.temperature`, through the same engine, agents and environments as training. The
champion's metrics come from the registry; if they were measured on a different evaluation (another
held-out set or sampling), the champion's model is evaluated again here so both sides are measured
the same way. The report (every check) goes to `<run>/quality_gate/report.json`, flat numbers to
`metrics.json`; a passing candidate is promoted when `gate.promote` is on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.gates.champion import Champion, ChampionRegistry
from asyncrl.gates.evaluation import run_episodes
from asyncrl.gates.quality import Estimate, GateReport, decide, quality_metrics, status_counts
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.stages.common import Wiring
from asyncrl.stages.train import RESULT_FILE as TRAIN_RESULT

REPORT_FILE = "report.json"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True, slots=True)
class GateOutcome:
    report: GateReport
    candidate: dict[str, Estimate]
    promoted: bool
    report_path: Path


def eval_key(cfg: RunConfig) -> str:
    """What an evaluation measured: two evaluations with the same key are comparable."""
    e, g = cfg.env, cfg.gate
    spec = (e.tasks, e.heldout_size, e.seed, e.max_steps, e.max_response_tokens, e.max_context)
    spec += (g.samples_per_task, g.temperature, cfg.rollout.max_tokens, cfg.seed)
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]


def champion_uri(cfg: RunConfig) -> str:
    """The registry location; a local one is made absolute (its pointer records model paths)."""
    uri = cfg.gate.champion or str(Path(cfg.pipeline.runs_dir) / "champion")
    return uri if uri.startswith("gs://") else str(Path(uri).absolute())


def candidate_model(run_dir: Path) -> Path:
    for rel in ("train/model", "warm_start/model", "model"):
        if (run_dir / rel).is_dir():
            return run_dir / rel
    raise FileNotFoundError(f"no model under {run_dir} (train/model or warm_start/model)")


def start_solve_rate(run_dir: Path) -> float | None:
    """The greedy held-out solve rate the train stage measured before its first step, if any."""
    path = run_dir / "train" / TRAIN_RESULT
    return json.loads(path.read_text())["initial_solve_rate"] if path.is_file() else None


def evaluate(cfg: RunConfig, model_uri: str) -> tuple[dict[str, Estimate], dict[str, int]]:
    wiring = Wiring.of(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    hf.load_into(model, model_uri)
    engine = wiring.engine(model)
    tasks = wiring.heldout()

    async def both():
        common = dict(
            make_env=wiring.make_env,
            make_agent=wiring.make_agent,
            limits=wiring.limits(),
            concurrency=cfg.rollout.max_concurrency,
            seed=cfg.seed,
        )
        greedy = await run_episodes(
            engine, tasks, sampling=wiring.sampling(0.0), samples=1, tag="gate-greedy", **common
        )
        sampled = await run_episodes(
            engine,
            tasks,
            sampling=wiring.sampling(cfg.gate.temperature),
            samples=cfg.gate.samples_per_task,
            tag="gate-sampled",
            **common,
        )
        return greedy, sampled

    try:
        greedy, sampled = asyncio.run(both())
    finally:
        engine.close()
    return quality_metrics(greedy, sampled, cfg.gate.confidence), status_counts(greedy)


def _champion_metrics(cfg: RunConfig, champ: Champion, key: str) -> dict[str, Estimate]:
    if champ.eval_key == key:
        return {k: Estimate.from_json(v) for k, v in champ.metrics.items()}
    metrics, _ = evaluate(cfg, champ.model)  # measured differently: measure it again, here
    return metrics


def quality_gate(
    cfg: RunConfig,
    run_dir: Path,
    model_dir: Path | None = None,
    run_id: str | None = None,
    promote: bool | None = None,
) -> GateOutcome:
    """Evaluate and decide; promote a passing candidate when `promote` (default gate.promote)."""
    out = run_dir / "quality_gate"
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir or candidate_model(run_dir)
    key = eval_key(cfg)
    candidate, statuses = evaluate(cfg, str(model_dir))
    registry = ChampionRegistry(champion_uri(cfg))
    champ = registry.current()
    champ_metrics = _champion_metrics(cfg, champ, key) if champ else None
    report = decide(
        candidate,
        champ_metrics,
        cfg.gate,
        champ.run_id if champ else None,
        start_solve_rate=start_solve_rate(run_dir),
    )
    run_id = run_id or run_dir.name
    promoted = False
    if report.passed and (cfg.gate.promote if promote is None else promote):
        registry.promote(run_id, model_dir, {k: v.to_json() for k, v in candidate.items()}, key)
        promoted = True
    record = {
        "passed": report.passed,
        "run_id": run_id,
        "model": str(model_dir),
        "champion": report.champion,
        "promoted": promoted,
        "eval_key": key,
        "checks": [asdict(c) for c in report.checks],
        "candidate": {k: v.to_json() for k, v in candidate.items()},
        "champion_metrics": (
            {k: v.to_json() for k, v in champ_metrics.items()} if champ_metrics else None
        ),
        "greedy_statuses": statuses,
    }
    path = out / REPORT_FILE
    path.write_text(json.dumps(record, indent=2))
    (out / METRICS_FILE).write_text(
        json.dumps({k: round(v.value, 6) for k, v in candidate.items()}, indent=2)
    )
    return GateOutcome(report=report, candidate=candidate, promoted=promoted, report_path=path)


def promote_passed(cfg: RunConfig, run_dir: Path) -> bool:
    """Promote the run's gated model if its recorded gate report passed (the pipeline's last
    stage); returns whether it was promoted now."""
    record = json.loads((run_dir / "quality_gate" / REPORT_FILE).read_text())
    if not record["passed"] or record["promoted"] or not cfg.gate.promote:
        return False
    ChampionRegistry(champion_uri(cfg)).promote(
        record["run_id"], Path(record["model"]), record["candidate"], record["eval_key"]
    )
    record["promoted"] = True
    (run_dir / "quality_gate" / REPORT_FILE).write_text(json.dumps(record, indent=2))
    return True


def format_report(outcome: GateOutcome) -> str:
    lines = []
    for c in outcome.report.checks:
        mark = "pass" if c.passed else "FAIL"
        lines.append(f"  [{mark}] {c.name}: {c.value} ({c.bound}) {c.detail}".rstrip())
    verdict = "PASSED" if outcome.report.passed else "FAILED"
    failed = ", ".join(c.name for c in outcome.report.failed)
    lines.append(
        f"quality gate {verdict}"
        + (f": {failed}" if failed else "")
        + (" (promoted to champion)" if outcome.promoted else "")
    )
    return "\n".join(lines)
