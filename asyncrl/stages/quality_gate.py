"""Stage: the held-out quality gate. Evaluate the candidate, compare with the champion, decide.

The candidate is the run's trained model (`train/model`, else `warm_start/model`, or a given
folder). It is evaluated on the fixed held-out split greedily and with `gate.samples_per_task`
samples at `gate.temperature`, through the same engine, agents and environments as training. The
champion's metrics come from the registry; if they were measured on a different evaluation (another
held-out set or sampling), the champion's model is evaluated again here so both sides are measured
the same way. The result (every check, `GateResult`) goes to `<run>/quality_gate/report.json`,
flat numbers to `metrics.json`. The gate only decides: promoting a passing candidate is the promote
stage's job (stages/promote.py), which reads this result.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from asyncrl.config import RunConfig
from asyncrl.gates.champion import Champion, ChampionRegistry
from asyncrl.gates.evaluation import run_episodes
from asyncrl.gates.quality import Check, Estimate, decide, quality_metrics, status_counts
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.stages.train import TrainResult
from asyncrl.wiring.episodes import Wiring

METRICS_FILE = "metrics.json"


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


def candidate_model(layout: RunLayout) -> Path:
    """The run's newest model: the trained one, else the warm start."""
    for path in (layout.train_model, layout.warm_start_model):
        if path.is_dir():
            return path
    raise FileNotFoundError(
        f"no model in run folder {layout.root} (train/model or warm_start/model)"
    )


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
    # Per family too (`solve_rate/<family>`, ...): informational, never gated.
    return quality_metrics(greedy, sampled, cfg.gate.confidence, tasks), status_counts(greedy)


def _champion_metrics(cfg: RunConfig, champ: Champion, key: str) -> dict[str, Estimate]:
    if champ.eval_key == key:
        return {k: Estimate.from_json(v) for k, v in champ.metrics.items()}
    metrics, _ = evaluate(cfg, champ.model)  # measured differently: measure it again, here
    return metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class GateResult:
    """The gate's decision and everything it measured (`<run>/quality_gate/report.json`)."""

    STAGE: ClassVar[Stage] = Stage.QUALITY_GATE
    passed: bool
    run_id: str
    model: str
    champion: str | None
    eval_key: str
    checks: tuple[Check, ...]
    candidate: dict[str, Estimate]
    champion_metrics: dict[str, Estimate] | None
    greedy_statuses: dict[str, int]

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)


def quality_gate(
    cfg: RunConfig, layout: RunLayout, model_dir: Path | None = None, run_id: str | None = None
) -> GateResult:
    """Evaluate the candidate and decide; promotion is the next stage's (stages/promote.py)."""
    out = layout.dir(Stage.QUALITY_GATE)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir or candidate_model(layout)
    key = eval_key(cfg)
    candidate, statuses = evaluate(cfg, str(model_dir))
    champ = ChampionRegistry(champion_uri(cfg)).current()
    champ_metrics = _champion_metrics(cfg, champ, key) if champ else None
    train = layout.maybe(TrainResult)
    report = decide(
        candidate,
        champ_metrics,
        cfg.gate,
        champ.run_id if champ else None,
        start_solve_rate=train.initial_solve_rate if train else None,
    )
    result = GateResult(
        passed=report.passed,
        run_id=run_id or layout.run_id,
        model=str(Path(model_dir).absolute()),
        champion=report.champion,
        eval_key=key,
        checks=report.checks,
        candidate=candidate,
        champion_metrics=champ_metrics,
        greedy_statuses=dict(statuses),
    )
    layout.write(result)
    flat = {k: round(v.value, 6) for k, v in candidate.items()}
    layout.write_text(out / METRICS_FILE, json.dumps(flat, indent=2))
    return result


def format_report(result: GateResult) -> str:
    lines = []
    for c in result.checks:
        mark = "pass" if c.passed else "FAIL"
        lines.append(f"  [{mark}] {c.name}: {c.value} ({c.bound}) {c.detail}".rstrip())
    verdict = "PASSED" if result.passed else "FAILED"
    failed = ", ".join(c.name for c in result.failed)
    lines.append(f"quality gate {verdict}" + (f": {failed}" if failed else ""))
    return "\n".join(lines)
