"""Stage: promote. A candidate whose gate result passed becomes the champion; nothing else does.

The gate decides (stages/quality_gate.py) and writes its `GateResult`; this stage reads that
result, validated, and promotes the gated model into the champion registry when it passed and
`gate.promote` is on. It is safe to retry: a run already promoted is recorded as such, not promoted
twice (the registry never overwrites an entry). The report stage only reads what this one wrote.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from asyncrl.config import RunConfig
from asyncrl.gates.champion import ChampionRegistry
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.stages.quality_gate import GateResult, champion_uri


class Decision(enum.StrEnum):
    PROMOTED = "promoted"
    ALREADY_CHAMPION = "already_champion"  # a retried stage: the first attempt promoted it
    GATE_FAILED = "gate_failed"
    DISABLED = "disabled"  # gate.promote is off


@dataclass(frozen=True, slots=True, kw_only=True)
class PromotionResult:
    STAGE: ClassVar[Stage] = Stage.PROMOTE
    decision: Decision
    run_id: str
    model: str
    registry: str

    @property
    def promoted(self) -> bool:
        return self.decision in (Decision.PROMOTED, Decision.ALREADY_CHAMPION)


def promote(cfg: RunConfig, layout: RunLayout) -> PromotionResult:
    """Promote the run's gated model if its gate result passed; the decision is recorded."""
    gate = layout.read(GateResult)
    registry = ChampionRegistry(champion_uri(cfg))
    current = registry.current()
    if not gate.passed:
        decision = Decision.GATE_FAILED
    elif not cfg.gate.promote:
        decision = Decision.DISABLED
    elif current is not None and current.run_id == gate.run_id:
        decision = Decision.ALREADY_CHAMPION
    else:
        metrics = {k: v.to_json() for k, v in gate.candidate.items()}
        registry.promote(gate.run_id, Path(gate.model), metrics, gate.eval_key)
        decision = Decision.PROMOTED
    result = PromotionResult(
        decision=decision, run_id=gate.run_id, model=gate.model, registry=registry.uri
    )
    layout.write(result)
    return result
