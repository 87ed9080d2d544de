"""Cost of tracing: microseconds per span, and the end-to-end overhead on the demo's RL loop.

1. Span cost: N begin/end pairs (with a small argument dict) on the Perfetto tracer, against the
   same loop with the no-op tracer (the baseline, measured in the same run). The serializing
   writer thread runs concurrently, as in a real run; the figure includes its share of the GIL.
2. End to end: the train stage of `configs/local.yaml` (the warm-start model is not needed: a
   fresh model has the same per-step cost) for `--steps` RL steps, traced and untraced, twice
   each in alternation; reports train-loop seconds per step. Target: ≤ 5 µs per span and ≤ 1%
   end to end.

    .venv/bin/python benchmarks/tracing.py [--steps 12] [--spans 200000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from asyncrl import tracing


def span_cost(n: int, tracer) -> float:
    """Microseconds per begin/end pair."""
    track = tracer.track("learner")
    args = {"step": 1}
    t0 = time.perf_counter()
    for _ in range(n):
        tracer.begin(track, "span", args)
        tracer.end(track)
    return (time.perf_counter() - t0) / n * 1e6


def end_to_end(steps: int, traced: bool, root: Path) -> float:
    from asyncrl.config import load_config
    from asyncrl.metrics.tracker import read_jsonl
    from asyncrl.stages.train import train

    cfg = load_config(
        "configs/local.yaml",
        [
            f"learner.steps={steps}",
            "learner.time_budget_s=0",
            "learner.eval_every=0",
            "env.heldout_size=1",
            "checkpoint.every_steps=0",
            f"tracing.enabled={'true' if traced else 'false'}",
            "tracing.tensorboard=false",
        ],
    )
    run = Path(tempfile.mkdtemp(dir=root))
    train(cfg, run)
    rows = read_jsonl(run / "train" / "metrics.jsonl", kind="train")
    # Seconds per step between the first and the last step (excludes compile and evaluation).
    return (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / max(len(rows) - 1, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--spans", type=int, default=200_000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip-end-to-end", action="store_true")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="asyncrl-tracing-bench-"))
    null_us = span_cost(args.spans, tracing.NullTracer())
    tracer = tracing.PerfettoTracer(root / "bench.perfetto-trace", chunk_events=2048)
    traced_us = span_cost(args.spans, tracer)
    tracer.close()
    result = {
        "spans": args.spans,
        "us_per_span_perfetto": round(traced_us, 3),
        "us_per_span_null": round(null_us, 3),
        "trace_bytes_per_span": round(
            (root / "bench.perfetto-trace").stat().st_size / args.spans, 1
        ),
    }
    print(json.dumps(result), flush=True)
    if not args.skip_end_to_end:
        untraced, traced = [], []
        for _ in range(2):
            untraced.append(end_to_end(args.steps, False, root))
            traced.append(end_to_end(args.steps, True, root))
        base, with_trace = min(untraced), min(traced)
        result |= {
            "rl_steps": args.steps,
            "s_per_step_untraced": round(base, 3),
            "s_per_step_traced": round(with_trace, 3),
            "overhead_fraction": round(with_trace / base - 1, 4),
        }
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
