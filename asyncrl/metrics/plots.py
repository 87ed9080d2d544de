"""PNG plots of a run from its JSONL metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from asyncrl.metrics.intervals import wilson
from asyncrl.metrics.tracker import read_jsonl

# Rates drawn on the learning curve: (row key, label); greedy is always there. {t}: the sampling
# temperature, {k}: samples per task, as the evaluation rows record them.
CURVES = (
    ("solve_rate", "greedy (pass@1, T=0)"),
    ("pass@1_sampled", "pass@1, T={t:g}"),
    ("pass@k", "pass@{k}, T={t:g}"),
)


def interval_series(rows: list[dict], key: str) -> tuple[list[float], list[float], list[float]]:
    """A rate in % per row with its interval: the row's own `<key>_low`/`<key>_high`, else (an
    evaluation logged before rows carried intervals) the 95% Wilson interval of the solve rate
    over the row's `episodes`."""
    values, lows, highs = [], [], []
    for r in rows:
        value = float(r[key])
        if f"{key}_low" in r:
            low, high = float(r[f"{key}_low"]), float(r[f"{key}_high"])
        else:
            n = int(r.get("episodes", 0))
            e = wilson(round(value * n), n, 0.95)
            low, high = e.low, e.high
        values.append(100 * value)
        lows.append(100 * low)
        highs.append(100 * high)
    return values, lows, highs


def learning_curve(metrics: Path, out: Path) -> Path:
    """Held-out rates against optimizer step and against wall time, side by side, each with its
    confidence interval: error bars on the greedy solve rate, bands on the sampled rates."""
    evals = read_jsonl(metrics, kind="eval")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for (key, label), colour in zip(CURVES, ("tab:blue", "tab:green", "tab:red"), strict=True):
        rows = [r for r in evals if r.get(key) is not None]
        if not rows:
            continue
        values, lows, highs = interval_series(rows, key)
        label = label.format(t=rows[-1].get("temperature", 1.0), k=int(rows[-1].get("samples", 0)))
        for ax, x in ((a, [r["step"] for r in rows]), (b, [r["elapsed_s"] / 60 for r in rows])):
            style = dict(color=colour, label=label if ax is a else None)
            if key == "solve_rate":
                below = [v - lo for v, lo in zip(values, lows, strict=True)]
                above = [hi - v for v, hi in zip(values, highs, strict=True)]
                ax.errorbar(x, values, yerr=[below, above], marker="o", capsize=3, **style)
            else:
                ax.plot(x, values, marker=".", **style)
                ax.fill_between(x, lows, highs, color=colour, alpha=0.2)
    a.set_xlabel("optimizer step")
    a.set_ylabel("held-out rate (%)")
    b.set_xlabel("wall time (min)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    tasks = int(evals[-1].get("tasks", evals[-1].get("episodes", 0))) if evals else 0
    level = float(evals[-1].get("confidence", 0.95)) if evals else 0.95
    fig.suptitle(f"Held-out rates during RL ({tasks} tasks; {100 * level:.0f}% intervals)")
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def reward_curve(metrics: Path, out: Path) -> Path:
    """Training reward (per step) against optimizer step and wall time."""
    rows = read_jsonl(metrics, kind="train")
    steps = [r["step"] for r in rows]
    minutes = [r["elapsed_s"] / 60 for r in rows]
    reward = [r.get("reward", float("nan")) for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    a.plot(steps, reward, lw=1)
    a.set_xlabel("optimizer step")
    a.set_ylabel("mean reward of the trained batch")
    b.plot(minutes, reward, lw=1, color="tab:orange")
    b.set_xlabel("wall time (min)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle("Training reward")
    return _save(fig, out)


def lag_histogram(lags: dict[int, int], out: Path) -> Path:
    """Trajectories per policy lag (versions between sampling and training)."""
    fig, ax = plt.subplots(figsize=(5, 4))
    keys = sorted(lags)
    ax.bar([str(k) for k in keys], [lags[k] for k in keys])
    ax.set_xlabel("policy lag (versions)")
    ax.set_ylabel("trained trajectories")
    ax.set_title("Policy lag of trained trajectories")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, out)


def queue_occupancy(metrics: Path, out: Path) -> Path:
    """Ready groups, half-filled groups and active episodes at each train step."""
    rows = read_jsonl(metrics, kind="train")
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    for key, label in (
        ("ready_groups", "ready groups"),
        ("half_filled_groups", "half-filled groups"),
        ("active_episodes", "active episodes"),
    ):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], label=label, lw=1)
    ax.set_xlabel("optimizer step")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title("Queue occupancy")
    return _save(fig, out)
