"""Learning lab: one warm start, then RL variants (or more SFT) from it, each measured honestly.

Three subcommands over `configs/local.yaml` plus dotted overrides:

    warm OUT [key=value ...]            the warm-start stage into run folder OUT, then `eval`
    rl WARM OUT [key=value ...]         the train stage from WARM's warm-start model into OUT,
                                        then `eval` of the trained model
    eval MODEL [key=value ...]          evaluate an HF model folder

`eval` runs greedy episodes on `--heldout` held-out tasks per family (the Wilson interval of the
greedy solve rate is what the demo's claim rests on) and `--samples` episodes at T = 1 on the first
`--train-tasks` training tasks per family (pass@1 and pass@k at T = 1: how much signal GRPO has).
Each subcommand prints one JSON line: the rates with their 95% intervals, per family, the greedy
failure breakdown and the seconds it took. RL runs use a step budget (`learner.steps`); the
script sets `learner.time_budget_s=0` (no wall-clock budget) unless told otherwise.

    .venv/bin/python benchmarks/learning.py warm /tmp/lab/ws warm_start.verbose_fraction=0
    .venv/bin/python benchmarks/learning.py rl /tmp/lab/ws /tmp/lab/rl1 learner.steps=30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from asyncrl.config import RunConfig, load_config
from asyncrl.envs.tasks import heldout, task_stream
from asyncrl.gates.evaluation import EvalSummary, evaluate_heldout
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.run_layout import RunLayout
from asyncrl.wiring.episodes import Wiring

CONFIG = "configs/local.yaml"


def config(overrides: list[str]) -> RunConfig:
    return load_config(CONFIG, ["learner.time_budget_s=0", *overrides])


def _rates(summary: EvalSummary, greedy_only: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for r in (summary.overall, *summary.families):
        picked = {"greedy": r.greedy} if greedy_only else {"t1": r.sampled, "pass@k": r.pass_k}
        for name, e in picked.items():
            out[f"{name}/{r.family}"] = e.text() if e is not None else None
    if greedy_only:
        out["failed"] = dict(summary.overall.greedy_failures)
    return out


async def _evaluate(cfg: RunConfig, model_dir: str, heldout_n: int, train_n: int, k: int):
    wiring = Wiring.of(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    hf.load_into(model, model_dir)
    engine = wiring.engine(model)
    common = dict(
        make_env=wiring.make_env,
        make_agent=wiring.make_agent,
        limits=wiring.limits(),
        confidence=0.95,
        concurrency=cfg.rollout.max_concurrency,
        seed=cfg.seed,
    )
    try:
        engine.warmup()
        tasks = heldout(cfg.env.tasks, heldout_n, cfg.env.seed)
        held = await evaluate_heldout(
            engine, tasks, sampling=wiring.sampling(0.0), samples=0, tag="lab-heldout", **common
        )
        out = _rates(held, greedy_only=True)
        if train_n and k:
            train = list(task_stream(cfg.env.tasks, "train", train_n, cfg.env.seed))
            sampled = await evaluate_heldout(
                engine, train, sampling=wiring.sampling(1.0), samples=k, tag="lab-train", **common
            )
            out.update(_rates(sampled, greedy_only=False))
        return out
    finally:
        engine.close()


def evaluate(cfg: RunConfig, model_dir: str, args) -> dict[str, object]:
    start = time.monotonic()
    out = asyncio.run(_evaluate(cfg, model_dir, args.heldout, args.train_tasks, args.samples))
    return {"model": model_dir, **out, "eval_s": round(time.monotonic() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=("warm", "rl", "eval"))
    p.add_argument("paths", nargs="+", help="folders, then key=value overrides")
    p.add_argument("--heldout", type=int, default=256, help="held-out tasks per family (greedy)")
    p.add_argument("--train-tasks", type=int, default=64, help="training tasks per family (T=1)")
    p.add_argument("--samples", type=int, default=4, help="T=1 samples per training task")
    args = p.parse_args()
    paths = [x for x in args.paths if "=" not in x]
    overrides = [x for x in args.paths if "=" in x]
    cfg = config(overrides)
    start = time.monotonic()
    result: dict[str, object] = {"command": args.command, "overrides": overrides}
    if args.command == "warm":
        from asyncrl.stages.warm_start import warm_start

        layout = RunLayout.of(paths[0]).create()
        ws = warm_start(cfg, layout)
        result.update(stage_s=ws.seconds, final_loss=round(ws.final_loss, 4))
        result.update(evaluate(cfg, str(layout.warm_start_model), args))
    elif args.command == "rl":
        from asyncrl.stages.train import train

        init = str(RunLayout.of(paths[0]).warm_start_model)
        layout = RunLayout.of(paths[1]).create()
        tr = train(cfg, layout, init_model=init)
        result.update(stage_s=tr.seconds, steps=tr.steps, no_signal=tr.groups_no_signal)
        result.update(stage_initial=tr.initial_solve_rate, stage_final=tr.final_solve_rate)
        result.update(evaluate(cfg, str(layout.train_model), args))
    else:
        result.update(evaluate(cfg, paths[0], args))
    result["total_s"] = round(time.monotonic() - start, 1)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
