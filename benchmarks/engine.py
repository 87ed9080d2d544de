"""Engine throughput: decode tokens/s at several concurrencies, against two baselines in one run.

For each model and concurrency C, C multi-turn episodes run at once against an engine with C slots:
each turn generates `--tokens` tokens, appends `--tool-tokens` tokens of "tool output" and sends the
next turn with the same session (so the engine reuses the cached prefix). Printed beside it:
  naive  one request at a time (an engine with one slot, episodes run sequentially);
  bound  C / (mean batched decode-step time), the step timed inside the same run.
Targets (issue 3): at C=64, ≥ 80% of the bound and ≥ 5× the naive baseline.

    .venv/bin/python benchmarks/engine.py --models tiny,small --concurrency 1,8,32,64
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

import numpy as np

from asyncrl.config import load_config
from asyncrl.model import build_model
from asyncrl.sampling.engine import Engine
from asyncrl.types import GenerateRequest, SamplingParams


@dataclasses.dataclass
class Result:
    tokens: int
    seconds: float
    step_seconds: float
    steps: int

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    @property
    def bound(self) -> float:
        return 0.0


async def _episode(engine: Engine, i: int, args, rng: np.random.Generator) -> int:
    prompt = tuple(int(x) for x in rng.integers(1, 250, args.prompt_tokens))
    produced = 0
    for turn in range(args.turns):
        params = SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i * 1000 + turn)
        out = await engine.generate(GenerateRequest(prompt=prompt, params=params, session=f"e{i}"))
        produced += len(out.tokens)
        tool = tuple(int(x) for x in rng.integers(1, 250, args.tool_tokens))
        prompt = (*prompt, *out.tokens, *tool)
    return produced


def measure(model, cfg, slots: int, episodes: int, concurrent: bool, args) -> tuple[float, float]:
    """(decoded tokens/s, batched-step bound tokens/s) of `episodes` episodes on `slots` slots."""
    rollout = dataclasses.replace(cfg.rollout, engine_slots=slots, engine_queue=max(64, episodes))
    engine = Engine(model, rollout, max_len=cfg.env.max_context, seed=1)
    engine.warmup()
    rng = np.random.default_rng(0)

    async def run() -> int:
        if concurrent:
            counts = await asyncio.gather(
                *[_episode(engine, i, args, rng) for i in range(episodes)]
            )
            return sum(counts)
        return sum([await _episode(engine, i, args, rng) for i in range(episodes)])

    try:
        t0 = time.perf_counter()
        tokens = asyncio.run(run())
        wall = time.perf_counter() - t0
        stats = engine.stats
        step = stats.step_seconds / max(stats.steps, 1)
        return tokens / wall, slots / step
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--tool-tokens", type=int, default=12)
    parser.add_argument("--naive-episodes", type=int, default=4)
    args = parser.parse_args()
    print(
        f"{'model':6} {'C':>3} {'engine tok/s':>13} {'naive tok/s':>12} {'bound tok/s':>12} "
        f"{'× naive':>8} {'% bound':>8}"
    )
    for preset in args.models.split(","):
        cfg = load_config("configs/local.yaml", [f"model.preset={preset}"])
        model = build_model(cfg.model, seed=0)
        naive, _ = measure(model, cfg, 1, args.naive_episodes, False, args)
        for c in [int(x) for x in args.concurrency.split(",")]:
            tps, bound = measure(model, cfg, c, c, True, args)
            print(
                f"{preset:6} {c:>3} {tps:>13.0f} {naive:>12.0f} {bound:>12.0f} "
                f"{tps / naive:>8.1f} {100 * tps / bound:>7.0f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
