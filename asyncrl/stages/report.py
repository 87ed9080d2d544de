"""Stage: the run report, in Markdown and HTML, linking everything the run produced.

Reads only what the stages wrote into the run folder (their JSON results, the metrics, plots and
trace) and lays it out: headline numbers, the held-out learning curve and other plots, the trace
summary (where time went), the recovery-test verdict and the gate report with every check, beside
the champion it was gated against. A stage that did not run is said to be missing, not silently
left out. The HTML is one self-contained page: plots embedded as data URIs, no relative links
(files are named by their path in the run folder), laid out for narrow screens too, so it reads
the same when KFP serves it from an artifact store.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from asyncrl.metrics.intervals import is_rate, percent
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
    return "n/a" if x is None else percent(x)


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
        f"Trace: `{rel}` (open it in https://ui.perfetto.dev)",
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
    rows.append("")
    if gate.champion is None or gate.champion_metrics is None:
        rows.append("Champion: none (first run: nothing to regress against)")
        return rows
    rows += [
        f"Champion gated against: `{gate.champion}`",
        "",
        "| rate | candidate | champion | difference |",
        "|---|---|---|---|",
    ]
    for key, e in sorted(gate.candidate.items()):
        c = gate.champion_metrics.get(key)
        rate = is_rate(key)
        if c is None:
            diff = "n/a"
        else:
            diff = (
                f"{100 * (e.value - c.value):+.1f} points" if rate else f"{e.value - c.value:+.3g}"
            )
        champion = c.text(rate) if c else "n/a"
        rows.append(f"| {key} | {e.text(rate)} | {champion} | {diff} |")
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
    listed = [f"- `{p.relative_to(layout.root)}`" for p in files if p.exists()]
    out.append(("Files (paths in the run folder)", listed))
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
    layout.write_text(layout.report_html, _html(sections, layout))
    paths = ReportPaths(markdown=str(layout.report_md), html=str(layout.report_html))
    layout.write(paths)
    return paths


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0 auto;padding:0 12px;max-width:1100px;"
    "line-height:1.45}img{max-width:100%;height:auto}.table{overflow-x:auto}"
    "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #bbb;padding:3px 8px;"
    "text-align:left}pre{overflow-x:auto;background:#f4f4f4;padding:8px;font-size:12px}"
    "code{background:#f4f4f4;padding:0 3px;word-break:break-all}"
)


def _inline(text: str) -> str:
    """Escaped text with Markdown's `code` and **bold** spans."""
    out = []
    for n, part in enumerate(text.split("`")):
        if n % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        bold = part.split("**")
        out.append(
            "".join(
                f"<strong>{html.escape(b)}</strong>" if i % 2 else html.escape(b)
                for i, b in enumerate(bold)
            )
        )
    return "".join(out)


def _image(layout: RunLayout, rel: str, alt: str) -> str:
    """A plot embedded as a data URI (the page has no relative links to break)."""
    data = base64.b64encode((layout.root / rel).read_bytes()).decode("ascii")
    return f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(alt)}'></figure>"


def _table(rows: list[list[str]]) -> str:
    head, *body = rows
    cells = "".join(f"<th>{_inline(c)}</th>" for c in head)
    lines = [f"<tr>{cells}</tr>"]
    lines += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return f"<div class='table'><table>{''.join(lines)}</table></div>"


def _html(sections: list[tuple[str, list[str]]], layout: RunLayout) -> str:
    body = ["<h1>asyncrl run report</h1>"]
    for title, lines in sections:
        body.append(f"<h2>{html.escape(title)}</h2>")
        in_code, table, items = False, [], []
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
                body.append(_table(table))
                table = []
            if line.startswith("- "):
                items.append(f"<li>{_inline(line[2:])}</li>")
                continue
            if items:
                body.append(f"<ul>{''.join(items)}</ul>")
                items = []
            if line.startswith("![") and "](" in line:
                alt, src = line[2:].split("](", 1)
                body.append(_image(layout, src[:-1], alt))
            elif line:
                body.append(f"<p>{_inline(line)}</p>")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>asyncrl report {html.escape(layout.run_id)}</title><style>{STYLE}</style>"
        "</head><body>" + "\n".join(body) + "</body></html>\n"
    )
