"""`asyncrl compare RUN...`: runs side by side, read from their run folders (local or gs://).

For each run it reads only validated stage results (run_layout.py) and the train stage's metrics:
the config differences between the runs, the held-out rates with their intervals (warm start,
RL start and end, the gate's candidate), the gate's checks, steps per minute, policy lag and wall
time. `overlay_plot` draws every run's learning curve on one figure, with intervals. A gs:// run
is read through the storage client into a temporary folder: only the small files, never the
checkpoints or the models.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncrl import storage
from asyncrl.config import RunConfig, load_config_text
from asyncrl.metrics.intervals import Estimate, is_rate, percent
from asyncrl.metrics.tracker import read_jsonl
from asyncrl.run_layout import RESULT_FILES, LayoutError, RunLayout, Stage
from asyncrl.stages.quality_gate import GateResult
from asyncrl.stages.train import TrainResult
from asyncrl.stages.warm_start import WarmStartResult

MAX_RUNS = 8  # columns that still fit a terminal
MAX_FILE_BYTES = 64 << 20  # a result or metrics file of a run; larger is refused, not downloaded
SMALL_FILES = ("config.yaml", *RESULT_FILES.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What `compare` shows of one run; None where the run did not get that far."""

    name: str
    location: str
    config: dict
    warm_start: WarmStartResult | None
    train: TrainResult | None
    gate: GateResult | None
    curve: tuple[dict, ...]  # the train stage's evaluation rows, in step order

    @property
    def steps_per_min(self) -> float | None:
        if self.train is None or self.train.seconds <= 0:
            return None
        return self.train.steps / (self.train.seconds / 60)


def _download_small(uri: str, into: Path) -> None:
    """The config, the stage results and the train metrics of a gs:// run, nothing larger."""
    if not storage.exists(storage.join(uri, "config.yaml")):
        raise LayoutError(f"{uri}: not a run folder (no config.yaml)")
    for name in (*SMALL_FILES, f"{Stage.TRAIN.value}/metrics.jsonl"):
        source = storage.join(uri, name)
        if storage.exists(source):
            target = into / storage.check_relative(name, uri)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(storage.read_bytes(source, max_bytes=MAX_FILE_BYTES))


@contextlib.contextmanager
def _local(location: str) -> Iterator[RunLayout]:
    if storage.is_gcs(location):
        with tempfile.TemporaryDirectory(prefix="asyncrl-compare-") as tmp:
            folder = Path(tmp) / storage.split_gcs(location)[1].rstrip("/").rpartition("/")[2]
            folder.mkdir()
            _download_small(location, folder)
            yield RunLayout.of(folder)
        return
    path = Path(location)
    if not path.is_dir() or not (path / "config.yaml").is_file():
        raise LayoutError(f"{location}: not a run folder (no config.yaml)")
    yield RunLayout.of(path)


def load_run(location: str) -> RunSummary:
    """One run's summary; a malformed result file is a LayoutError naming it."""
    with _local(location) as layout:
        cfg = load_config_text(layout.config.read_text())
        metrics = layout.train_metrics
        try:
            curve = tuple(read_jsonl(metrics, kind="eval")) if metrics.is_file() else ()
        except (ValueError, UnicodeDecodeError) as e:
            raise LayoutError(f"{metrics}: not a metrics file ({e})") from None
        for row in curve:  # the plot reads these as numbers
            if not _finite(row.get("step")) or not _finite(row.get("solve_rate", 0.0)):
                raise LayoutError(f"{metrics}: an eval row without a numeric step and solve_rate")
        return RunSummary(
            name=layout.run_id,
            location=location,
            config=_flat(cfg),
            warm_start=layout.maybe(WarmStartResult),
            train=layout.maybe(TrainResult),
            gate=layout.maybe(GateResult),
            curve=tuple(sorted(curve, key=lambda r: r.get("step", 0))),
        )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flat(cfg: RunConfig) -> dict:
    out: dict = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    data = cfg.to_dict()
    data.pop("pipeline", None)  # where a run went, not what it trained
    walk(data, "")
    return out


def config_differences(runs: Sequence[RunSummary]) -> list[tuple[str, list[str]]]:
    """Dotted keys whose values differ between the runs, with each run's value."""
    keys = sorted(set().union(*(r.config for r in runs)))
    rows = []
    for key in keys:
        values = [r.config.get(key, "—") for r in runs]
        if any(v != values[0] for v in values[1:]):
            rows.append((key, [_short(v) for v in values]))
    return rows


def _short(value: object, width: int = 24) -> str:
    text = str(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(value: float | None) -> str:
    return "—" if value is None else percent(value)


def _estimate(e: Estimate | None, rate: bool = True) -> str:
    return "—" if e is None else e.text(rate)


def _number(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table_rows(runs: Sequence[RunSummary]) -> list[tuple[str, list[str]]]:
    """(label, one cell per run) for everything compare prints."""
    rows: list[tuple[str, list[str]]] = [("run", [r.name for r in runs])]
    rows += [(f"config: {k}", v) for k, v in config_differences(runs)]
    rows.append(
        (
            "warm start (greedy)",
            [_pct(r.warm_start and r.warm_start.heldout_solve_rate) for r in runs],
        )
    )
    rows.append(
        (
            "RL start → end (greedy)",
            [
                "—"
                if r.train is None
                else f"{_pct(r.train.initial_solve_rate)} → {_pct(r.train.final_solve_rate)}"
                for r in runs
            ],
        )
    )
    keys = sorted({k for r in runs if r.gate for k in r.gate.candidate if "/" not in k})
    for key in keys:
        rows.append(
            (
                f"gate: {key}",
                [
                    _estimate(r.gate.candidate.get(key) if r.gate else None, is_rate(key))
                    for r in runs
                ],
            )
        )
    checks = sorted({c.name for r in runs if r.gate for c in r.gate.checks})
    for name in checks:
        cells = []
        for r in runs:
            found = [c for c in (r.gate.checks if r.gate else ()) if c.name == name]
            cells.append("—" if not found else ("pass" if found[0].passed else "FAIL"))
        rows.append((f"check: {name}", cells))
    rows.append(
        (
            "gate verdict",
            ["—" if r.gate is None else ("passed" if r.gate.passed else "failed") for r in runs],
        )
    )
    rows.append(("RL steps", [_number(r.train and r.train.steps, "d") for r in runs]))
    rows.append(("steps/min", [_number(r.steps_per_min, ".2f") for r in runs]))
    rows.append(
        (
            "policy lag mean / max",
            [
                "—"
                if r.train is None
                else f"{r.train.policy_lag_mean:.2f} / {r.train.policy_lag_max}"
                for r in runs
            ],
        )
    )
    rows.append(
        ("RL wall time (min)", [_number(r.train and r.train.seconds / 60, ".1f") for r in runs])
    )
    return rows


def render_table(runs: Sequence[RunSummary]) -> str:
    rows = table_rows(runs)
    widths = [max(len(label) for label, _ in rows)]
    for i in range(len(runs)):
        widths.append(max(len(cells[i]) for _, cells in rows))
    lines = []
    for n, (label, cells) in enumerate(rows):
        parts = [
            label.ljust(widths[0]),
            *(c.ljust(w) for c, w in zip(cells, widths[1:], strict=True)),
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def overlay_plot(runs: Sequence[RunSummary], out: Path) -> Path:
    """Every run's greedy held-out solve rate against optimizer step, with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncrl.metrics.plots import interval_series

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        rows = [row for row in r.curve if row.get("solve_rate") is not None]
        if not rows:
            continue
        values, lows, highs = interval_series(rows, "solve_rate")
        steps = [row["step"] for row in rows]
        (line,) = ax.plot(steps, values, marker="o", label=r.name)
        ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out greedy solve rate (%)")
    ax.set_title("Learning curves (bands: intervals)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def compare(locations: Sequence[str], plot: Path | None) -> tuple[str, list[RunSummary]]:
    """The table's text and the runs; writes the overlay plot to `plot` when given."""
    if not 1 <= len(locations) <= MAX_RUNS:
        raise LayoutError(f"compare takes 1 to {MAX_RUNS} run folders, got {len(locations)}")
    runs = [load_run(str(loc)) for loc in locations]
    if plot is not None:
        overlay_plot(runs, plot)
    return render_table(runs), runs
