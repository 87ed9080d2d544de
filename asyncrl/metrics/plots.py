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
