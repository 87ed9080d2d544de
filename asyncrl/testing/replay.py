"""A recorded training run replayed on one process (test support, not product code):

    python -m asyncrl.testing.replay CONFIG RECORDS OUT [--init-model DIR]

CONFIG: the run's config (YAML); RECORDS: the run's step records (`wiring/step_record.py`, written
with ASYNCRL_RECORD_STEPS=1). Builds the learner exactly as the train stage does
(`wiring/training.learner_for`: the same model, seed and starting checkpoint, the config's mesh over
this process's devices), trains on each recorded batch in the recorded order, and writes what it
computed (the loss and the parameters after each step) under OUT in the same format, so a test can
compare the two step by step. For the same mesh, give this process as many devices as the recorded
trainer had in all (XLA_FLAGS). Replica sampling is not deterministic across runs, which is why
the batches are replayed, not regenerated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrl.config import RunConfig, load_config


def replay(cfg: RunConfig, records: Path, out: Path, init_model: str | None = None) -> int:
    """Train on every recorded batch in order, writing each step's loss and parameters under
    `out`; returns the number of steps replayed."""
    from asyncrl.wiring import step_record
    from asyncrl.wiring.devices import make_placement
    from asyncrl.wiring.episodes import Wiring
    from asyncrl.wiring.training import learner_for

    recorded = step_record.read(records)
    if not recorded or [r.step for r in recorded] != list(range(1, len(recorded) + 1)):
        raise ValueError(f"{records}: expected the records of steps 1..N, got {len(recorded)}")
    source = init_model or cfg.model.checkpoint
    learner = learner_for(cfg, Wiring.of(cfg), make_placement(cfg), source)
    for r in recorded:
        metrics = learner.rl_step(r.batch)
        step_record.write(out, learner.step, r.batch, metrics["loss"], learner.params_copy())
    return len(recorded)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m asyncrl.testing.replay")
    parser.add_argument("config")
    parser.add_argument("records", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--init-model")
    args = parser.parse_args()
    steps = replay(load_config(args.config), args.records, args.out, args.init_model)
    print(f"REPLAYED {steps}", flush=True)
