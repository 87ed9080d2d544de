"""The JSON half of a checkpoint: everything besides arrays that a resumed run needs.

`PipelineState` records the policy version, the data cursor (rollout/cursor.py), how sampling
randomness is derived (per group from the seed and the group id, so it needs no saved generator
state), the loop's counters, the held-out evaluation history the gate reads, and the resolved
config with its hash. `incompatibilities` says which settings differ between a checkpoint and the
config trying to resume it, for the keys that change what a checkpoint means (the model, the
tokenizer, the task stream, the group shape, the loss); other keys (steps, budgets, evaluation
cadence) may change between a run and its resumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.rollout.cursor import DataCursor

FORMAT = 1
RNG_SCHEME = "member seed = sha256(seed/group_id/member/attempt); epoch order = Random(seed/epoch)"
# Dotted keys (or whole sections) that must match for a checkpoint to be resumed.
BINDING = (
    "seed",
    "model",
    "tokenizer",
    "env.tasks",
    "env.seed",
    "env.train_size",
    "rollout.group_size",
    "learner.batch_size",
    "learner.loss",
    "learner.mode",
)


@dataclass(slots=True)
class PipelineState:
    version: int = 0
    cursor: DataCursor = field(default_factory=DataCursor)
    evals: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    def to_json(self, cfg: RunConfig) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "cursor": self.cursor.to_json(),
            "rng": {"seed": cfg.seed, "scheme": RNG_SCHEME},
            "evals": self.evals,
            "counters": self.counters,
            "config": cfg.to_dict(),
            "config_hash": cfg.hash(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PipelineState:
        if data.get("format") != FORMAT:
            raise ValueError(f"pipeline state format {data.get('format')!r}, expected {FORMAT}")
        return cls(
            version=int(data["version"]),
            cursor=DataCursor.from_json(data["cursor"]),
            evals=list(data["evals"]),
            counters=dict(data["counters"]),
        )


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    value: Any = tree
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            out |= _leaves(v, f"{prefix}.{k}")
        return out
    return {prefix: value}


def incompatibilities(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """ "key: checkpoint X, config Y" for every binding setting that differs."""
    diffs = []
    for key in BINDING:
        old, new = _leaves(_get(saved, key), key), _leaves(_get(current, key), key)
        for leaf in sorted(set(old) | set(new)):
            if old.get(leaf) != new.get(leaf):
                diffs.append(f"{leaf}: checkpoint {old.get(leaf)!r}, config {new.get(leaf)!r}")
    return diffs
