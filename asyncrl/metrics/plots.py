"""PNG plots of a run from its JSONL metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from asyncrl.metrics.tracker import read_jsonl


def learning_curve(metrics: Path, out: Path) -> Path:
    """Held-out solve rate against optimizer step and against wall time, side by side."""
    evals = read_jsonl(metrics, kind="eval")
    steps = [r["step"] for r in evals]
    minutes = [r["elapsed_s"] / 60 for r in evals]
    rates = [100 * r["solve_rate"] for r in evals]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    a.plot(steps, rates, marker="o")
    a.set_xlabel("optimizer step")
    a.set_ylabel("held-out solve rate (%)")
    b.plot(minutes, rates, marker="o", color="tab:orange")
    b.set_xlabel("wall time (min)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle("Held-out solve rate during RL (greedy)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
