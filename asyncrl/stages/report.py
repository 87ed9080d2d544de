"""Stage: the run report, in Markdown and HTML, linking everything the run produced.

Reads only what the stages wrote into the run folder (their JSON results, the metrics, plots and
trace) and lays it out: headline numbers, the held-out learning curve and other plots, the trace
summary (where time went), the recovery-test verdict and the gate report with every check. A stage
that did not run is said to be missing, not silently left out. The HTML embeds the plots by
relative link, so the folder can be copied (or served as a KFP HTML artifact) as a whole.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from asyncrl.run_layout import LayoutError, RunLayout, Stage
from asyncrl.stages.promote import PromotionResult
from asyncrl.stages.quality_gate import GateResult
from asyncrl.stages.recovery_test import RecoveryVerdict
from asyncrl.stages.train import TrainResult
from asyncrl.stages.warm_start import WarmStartResult

T = TypeVar("T")
PLOTS = (
    ("train/learning_curve.png", "Held-out solve rate vs step and wall time"),
    ("train/reward_curve.png", "Training reward"),
    ("train/policy_lag.png", "Policy lag of trained trajectories"),
    ("train/queue_occupancy.png", "Queue occupancy"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportPaths:
    STAGE: ClassVar[Stage] = Stage.REPORT
    markdown: str
    html: str


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _result(layout: RunLayout, cls: type[T], lines: list[str]) -> T | None:
    """A stage's result; a malformed one is named in `lines`, a missing one is just None."""
    try:
        return layout.read(cls)
    except LayoutError as e:
        if layout.result_path(cls.STAGE).exists():  # type: ignore[attr-defined]
            lines.append(f"- unreadable result: {e}")
        return None


def _summary(layout: RunLayout, ws, tr, gate, promo) -> list[str]:
    head = [f"Run folder: `{layout.root}`"]
    if ws:
        head.append(
            f"- Warm start: {ws.steps} SFT steps in {ws.seconds:.0f} s; held-out solve "
            f"rate {_pct(ws.heldout_solve_rate)}"
        )
    else:
        head.append("- Warm start: did not run")
    if tr:
        head.append(
            f"- RL: {tr.steps} steps in {tr.seconds:.0f} s; held-out solve rate "
            f"{_pct(tr.initial_solve_rate)} → {_pct(tr.final_solve_rate)}; policy lag "
            f"mean {tr.policy_lag_mean:.2f}, max {tr.policy_lag_max}; groups trained "
            f"{tr.groups_trained}, dropped stale {tr.groups_dropped_stale}, failed "
            f"{tr.groups_failed}, without signal {tr.groups_no_signal}; learner idle "
            f"{_pct(tr.learner_idle_fraction)}"
        )
    else:
        head.append("- RL: did not run")
    if gate:
        head.append(f"- Quality gate: **{'PASS' if gate.passed else 'FAIL'}**")
    if promo:
        head.append(f"- Promotion: {promo.decision.value} ({promo.registry})")
    return head


def _trace(layout: RunLayout) -> list[str] | None:
    if not layout.trace.exists():
        return None
    from asyncrl.tracing.reader import TraceError, format_summary, read_packets, summarize

    rel = layout.trace.relative_to(layout.root)
    try:
        packets, _ = read_packets(layout.trace)
    except TraceError as e:  # a damaged trace is reported, not a reason to write no report
        return [f"Trace `{rel}` is unreadable: {e}"]
    return [
        f"Trace: [`{rel}`]({rel}) (open in https://ui.perfetto.dev)",
        "```",
        format_summary(summarize(packets)),
        "```",
    ]


def _recovery(rec: RecoveryVerdict) -> list[str]:
    rows = [
        "| phase | kill at | checkpoint | resumed | bits | cursor | lost steps | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in rec.phases:
        rows.append(
            f"| {p.phase} | {p.kill_step} | {p.checkpoint_at_kill} | "
            f"{p.resumed_step} | {'same' if p.bit_identical else 'DIFF'} | "
            f"{'ok' if p.cursor_ok else 'BAD'} | {p.lost_steps} | "
            f"{'pass' if p.passed else 'FAIL ' + p.detail} |"
        )
    rows.append(f"\nRecovery test: **{'PASS' if rec.passed else 'FAIL'}**")
    return rows


def _gate(gate: GateResult) -> list[str]:
    rows = ["| check | value | bound | verdict |", "|---|---|---|---|"]
    for c in gate.checks:
        rows.append(f"| {c.name} | {c.value} | {c.bound} | {'pass' if c.passed else 'FAIL'} |")
    return rows


def _sections(layout: RunLayout) -> list[tuple[str, list[str]]]:
    problems: list[str] = []
    ws = _result(layout, WarmStartResult, problems)
    tr = _result(layout, TrainResult, problems)
    rec = _result(layout, RecoveryVerdict, problems)
    gate = _result(layout, GateResult, problems)
    promo = _result(layout, PromotionResult, problems)
    out = [("Summary", _summary(layout, ws, tr, gate, promo) + problems)]
    plots = [f"![{title}]({rel})" for rel, title in PLOTS if (layout.root / rel).exists()]
    out.append(("Plots", plots or ["(no plots: the train stage did not run)"]))
    trace = _trace(layout)
    if trace:
        out.append(("Where the time went", trace))
    out.append(("Recovery test", _recovery(rec) if rec else ["did not run"]))
    out.append(("Quality gate", _gate(gate) if gate else ["did not run"]))
    files = [layout.config, layout.train_metrics, layout.dir(Stage.WARM_START) / "metrics.jsonl"]
    files += [layout.result_path(s) for s in (Stage.RECOVERY_TEST, Stage.QUALITY_GATE)]
    files.append(layout.dir(Stage.TRAIN) / "tensorboard")
    links = [f"- [{p.relative_to(layout.root)}]({p.relative_to(layout.root)})" for p in files]
    out.append(("Files", [link for link, p in zip(links, files, strict=True) if p.exists()]))
    return out


def write_report(layout: RunLayout) -> ReportPaths:
    """Write report.md and report.html into the run folder (refused when it is not a run)."""
    if not layout.config.is_file():
        raise LayoutError(f"{layout.root} is not a run folder (it has no config.yaml)")
    sections = _sections(layout)
    md = ["# asyncrl run report", ""]
    for title, lines in sections:
        md += [f"## {title}", "", *lines, ""]
    layout.write_text(layout.report_md, "\n".join(md))
    layout.write_text(layout.report_html, _html(sections))
    paths = ReportPaths(markdown=str(layout.report_md), html=str(layout.report_html))
    layout.write(paths)
    return paths


def _html(sections: list[tuple[str, list[str]]]) -> str:
    body = ["<h1>asyncrl run report</h1>"]
    for title, lines in sections:
        body.append(f"<h2>{html.escape(title)}</h2>")
        in_code = False
        table: list[list[str]] = []
        for line in [*lines, ""]:
            if line.startswith("```"):
                body.append("</pre>" if in_code else "<pre>")
                in_code = not in_code
                continue
            if in_code:
                body.append(html.escape(line))
                continue
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                if not all(set(c) <= {"-"} for c in cells):
                    table.append(cells)
                continue
            if table:
                rows = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                    for r in table
                )
                body.append(f"<table border='1' cellpadding='4'>{rows}</table>")
                table = []
            if line.startswith("![") and "](" in line:
                alt, src = line[2:].split("](", 1)
                body.append(f"<p><img src='{html.escape(src[:-1])}' alt='{html.escape(alt)}'></p>")
            elif line.startswith("- [") and "](" in line:
                text, href = line[3:].split("](", 1)
                body.append(
                    f"<li><a href='{html.escape(href[:-1])}'>{html.escape(text[:-1])}</a></li>"
                )
            elif line:
                body.append(f"<p>{html.escape(line)}</p>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>asyncrl report</title>"
        "</head><body>" + "\n".join(body) + "</body></html>\n"
    )
