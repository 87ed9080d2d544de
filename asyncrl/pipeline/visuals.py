"""What each stage shows in the Kubeflow UI: its scalar metrics and one HTML page.

Built only from the stage's typed result (the file `run_layout.py` names, as the stage returned
it) and the run config, never from log lines. A rate is logged with its interval as three metrics,
`<name>`, `<name>_low` and `<name>_high`: for the held-out greedy rates of the warm start and of
RL's start and end, the Wilson interval over the held-out episodes at the gate's confidence level
(`env.heldout_size` tasks per family, one greedy episode each, as `Wiring.heldout` evaluates);
for the gate, the estimates the gate itself computed. Non-finite values are left out (KFP's
metrics are JSON numbers). The pages are self-contained, the learning curve an embedded PNG,
because KFP serves an HTML artifact from its artifact store, where relative links break.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.metrics.intervals import Estimate, is_rate, wilson

if TYPE_CHECKING:  # a component imports this module before its stage sets up the devices
    from asyncrl.config import RunConfig
    from asyncrl.stages.quality_gate import GateResult
    from asyncrl.stages.recovery_test import RecoveryVerdict
    from asyncrl.stages.train import TrainResult
    from asyncrl.stages.warm_start import WarmStartResult

Metrics = dict[str, float]


def heldout(rate: float, cfg: RunConfig, families: int | None = None) -> Estimate:
    """A greedy held-out rate with its interval (`families`: how many families it covers)."""
    n = cfg.env.heldout_size * (len(cfg.env.tasks) if families is None else families)
    return wilson(round(rate * n), n, cfg.gate.confidence)


def _rate(name: str, e: Estimate) -> Metrics:
    return {name: e.value, f"{name}_low": e.low, f"{name}_high": e.high}


def _finite(values: Mapping[str, float]) -> Metrics:
    return {k: float(v) for k, v in values.items() if math.isfinite(float(v))}


def warm_start_metrics(r: WarmStartResult, cfg: RunConfig) -> Metrics:
    out = _rate("heldout_solve_rate", heldout(r.heldout_solve_rate, cfg))
    for family, rate in r.heldout_by_family:
        out |= _rate(f"heldout_solve_rate/{family}", heldout(rate, cfg, families=1))
    out |= {"steps": r.steps, "final_loss": r.final_loss, "seconds": r.seconds}
    return _finite(out)


def train_metrics(r: TrainResult, cfg: RunConfig) -> Metrics:
    out = _rate("initial_solve_rate", heldout(r.initial_solve_rate, cfg))
    out |= _rate("final_solve_rate", heldout(r.final_solve_rate, cfg))
    per_min = r.steps / (r.seconds / 60) if r.seconds > 0 else math.nan
    out |= {
        "steps": r.steps,
        "steps_per_min": per_min,
        "policy_lag_mean": r.policy_lag_mean,
        "policy_lag_max": r.policy_lag_max,
        "learner_idle_fraction": r.learner_idle_fraction,
        "groups_trained": r.groups_trained,
        "groups_dropped_stale": r.groups_dropped_stale,
        "seconds": r.seconds,
    }
    return _finite(out)


def recovery_metrics(v: RecoveryVerdict) -> Metrics:
    out: Metrics = {
        "passed": float(v.passed),
        "phases": len(v.phases),
        "phases_passed": sum(p.passed for p in v.phases),
        "final_step": v.final_step,
        "seconds": v.seconds,
    }
    for p in v.phases:
        out[f"{p.phase}_lost_steps"] = p.lost_steps
    return _finite(out)


def gate_metrics(g: GateResult) -> Metrics:
    out: Metrics = {}
    for name, e in g.candidate.items():
        out |= _rate(name, e)
    for name, e in (g.champion_metrics or {}).items():
        out |= _rate(f"champion/{name}", e)
    out |= {"gate_passed": float(g.passed), "checks_failed": len(g.failed)}
    return _finite(out)


# -- pages ---------------------------------------------------------------------------------------


def _page(title: str, body: Iterable[str]) -> str:
    from asyncrl.stages.report import STYLE  # the run report's look

    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>" + "\n".join(body) + "</body></html>\n"
    )


def _table(head: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    def row(cells: Iterable[object], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + "</tr>"

    lines = [row(head, "th"), *(row(r, "td") for r in rows)]
    return f"<div class='table'><table>{''.join(lines)}</table></div>"


def _estimate(e: Estimate | None, name: str = "solve_rate") -> str:
    rate = is_rate(name) or name.startswith("failed/")  # the gate's per-cause failure rates
    return "—" if e is None else e.text(rate)


def skipped_html(stage: str) -> str:
    return _page(f"asyncrl {stage}", ["<p>Skipped: not in <code>pipeline.stages</code>.</p>"])


def warm_start_html(r: WarmStartResult, cfg: RunConfig) -> str:
    rows = [("all families", _estimate(heldout(r.heldout_solve_rate, cfg)))]
    rows += [(f, _estimate(heldout(rate, cfg, families=1))) for f, rate in r.heldout_by_family]
    facts = (
        f"{r.steps} SFT steps on {r.demonstrations} demonstrations "
        f"({r.skipped_too_long} too long, left out); final loss {r.final_loss:.4g}; "
        f"{r.seconds:.0f} s."
    )
    level = f"{100 * cfg.gate.confidence:.0f}%"
    return _page(
        "asyncrl warm start",
        [
            f"<p>{html.escape(facts)}</p>",
            _table(("held-out greedy solve rate", f"rate [{level} interval]"), rows),
        ],
    )


def train_html(r: TrainResult, cfg: RunConfig) -> str:
    start, end = heldout(r.initial_solve_rate, cfg), heldout(r.final_solve_rate, cfg)
    rows = [
        ("held-out greedy solve rate", f"{_estimate(start)} → {_estimate(end)}"),
        ("optimizer steps", r.steps),
        ("policy lag mean / max", f"{r.policy_lag_mean:.2f} / {r.policy_lag_max}"),
        (
            "groups trained / stale / failed",
            f"{r.groups_trained} / {r.groups_dropped_stale} / {r.groups_failed}",
        ),
        ("learner idle", f"{100 * r.learner_idle_fraction:.0f}%"),
        ("wall time", f"{r.seconds:.0f} s"),
    ]
    curve = Path(r.curve)
    if curve.is_file():
        data = base64.b64encode(curve.read_bytes()).decode("ascii")
        figure = f"<figure><img src='data:image/png;base64,{data}' alt='learning curve'></figure>"
    else:
        figure = f"<p>No learning curve at {html.escape(r.curve)}.</p>"
    return _page("asyncrl train", [figure, _table(("", "RL"), rows)])


def recovery_html(v: RecoveryVerdict) -> str:
    head = ("phase", "kill at", "checkpoint", "resumed", "bits", "cursor", "lost steps", "verdict")
    rows = [
        (
            p.phase,
            p.kill_step,
            "—" if p.checkpoint_at_kill is None else p.checkpoint_at_kill,
            "—" if p.resumed_step is None else p.resumed_step,
            "same" if p.bit_identical else "DIFFERENT",
            "ok" if p.cursor_ok else "BAD",
            p.lost_steps,
            "pass" if p.passed else f"FAIL {p.detail}".strip(),
        )
        for p in v.phases
    ]
    verdict = "passed" if v.passed else "FAILED"
    summary = f"Recovery test {verdict}: {sum(p.passed for p in v.phases)}/{len(v.phases)} phases."
    return _page("asyncrl recovery test", [f"<p>{summary}</p>", _table(head, rows)])


def gate_html(g: GateResult) -> str:
    verdict = "PASSED" if g.passed else "FAILED: " + ", ".join(c.name for c in g.failed)
    checks = [
        (
            c.name,
            "—" if c.value is None else f"{c.value:.4g}",
            c.bound,
            "pass" if c.passed else "FAIL",
            c.detail,
        )
        for c in g.checks
    ]
    champion = g.champion_metrics or {}
    measured = [(k, _estimate(e, k), _estimate(champion.get(k), k)) for k, e in g.candidate.items()]
    against = g.champion or "none (first run)"
    return _page(
        "asyncrl quality gate",
        [
            f"<p><strong>Quality gate {html.escape(verdict)}</strong>. "
            f"Candidate {html.escape(g.run_id)}, champion {html.escape(against)}.</p>",
            _table(("check", "value", "bound", "verdict", "detail"), checks),
            _table(("metric", "candidate", "champion"), measured),
        ],
    )
