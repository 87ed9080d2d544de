"""The JSON half of a checkpoint: everything besides arrays that a resumed run needs.

`TrainRecord` holds the training loop's whole state (`LoopState`: policy version, data cursor,
counters, lag histogram), how sampling randomness is derived (per group from the seed and the group
id, so it needs no saved generator state), the held-out evaluation history the gate reads, and the
resolved config with its hash. Reading validates every field: a malformed record is a
`CheckpointError` naming the field, never a traceback deep in a resumed run.

`incompatibilities` says which settings differ between a checkpoint and the config trying to resume
it, for the keys that change what a checkpoint means (the model, the
tokenizer, the task stream, the group shape, the loss); other keys (steps, budgets, evaluation
cadence) may change between a run and its resumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.checkpoint.manager import CheckpointError
from asyncrl.config import RunConfig
from asyncrl.learner.state import LoopState, StateError
from asyncrl.records import RecordError, decode

FORMAT = 2
_EVALS = tuple[dict[str, float], ...]  # per evaluation: metric name -> finite number
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


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainRecord:
    """The JSON half of a checkpoint: the loop state, the evaluation history and the config."""

    state: LoopState = field(default_factory=LoopState)
    evals: tuple[Mapping[str, float], ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    config_hash: str = ""

    @classmethod
    def of(cls, state: LoopState, evals: tuple, cfg: RunConfig) -> TrainRecord:
        return cls(state=state, evals=tuple(evals), config=cfg.to_dict(), config_hash=cfg.hash())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "state": self.state.to_json(),
            "rng": {"scheme": RNG_SCHEME},
            "evals": [dict(e) for e in self.evals],
            "config": dict(self.config),
            "config_hash": self.config_hash,
        }

    @classmethod
    def from_json(cls, data: object, where: str = "checkpoint") -> TrainRecord:
        """The saved record, checked; CheckpointError names what is wrong and where."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{where}: pipeline record is not an object")
        if data.get("format") != FORMAT:
            raise CheckpointError(
                f"{where}: pipeline record format {data.get('format')!r:.40}, expected {FORMAT}"
            )
        try:
            state = LoopState.from_json(data.get("state"))
        except StateError as e:
            raise CheckpointError(f"{where}: {e}") from None
        try:
            evals = decode(_EVALS, data.get("evals"), "evals")  # type: ignore[arg-type]
        except RecordError as e:
            raise CheckpointError(f"{where}: {e}") from None
        config = data.get("config")
        if not isinstance(config, Mapping):
            raise CheckpointError(f"{where}: config: expected an object")
        digest = data.get("config_hash")
        if not isinstance(digest, str):
            raise CheckpointError(f"{where}: config_hash: expected a string")
        return cls(state=state, evals=evals, config=config, config_hash=digest)


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
