"""Stage: the run report, in Markdown and HTML, linking everything the run produced.

Reads only what the stages wrote into the run folder (their JSON results, the metrics, plots and
trace) and lays it out: headline numbers, the held-out learning curve and other plots, the trace
summary (where time went), the recovery-test verdict and the gate report with every check. A stage
that did not run is said to be missing, not silently left out. The HTML embeds the plots by
relative link, so the folder can be copied (or served as a KFP HTML artifact) as a whole.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS = (
    ("train/learning_curve.png", "Held-out solve rate vs step and wall time"),
    ("train/reward_curve.png", "Training reward"),
    ("train/policy_lag.png", "Policy lag of trained trajectories"),
    ("train/queue_occupancy.png", "Queue occupancy"),
)


@dataclass(frozen=True, slots=True)
class ReportPaths:
    markdown: Path
    html: Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _sections(run_dir: Path) -> list[tuple[str, list[str]]]:
    ws = _load(run_dir / "warm_start" / "warm_start.json")
    tr = _load(run_dir / "train" / "train.json")
    rec = _load(run_dir / "recovery_test" / "verdict.json")
    gate = _load(run_dir / "quality_gate" / "report.json")
    out: list[tuple[str, list[str]]] = []
    head = [f"Run folder: `{run_dir}`"]
    if ws:
        head.append(
            f"- Warm start: {ws['steps']} SFT steps in {ws['seconds']:.0f} s; held-out solve "
            f"rate {_pct(ws['heldout_solve_rate'])}"
        )
    else:
        head.append("- Warm start: did not run")
    if tr:
        head.append(
            f"- RL: {tr['steps']} steps in {tr['seconds']:.0f} s; held-out solve rate "
            f"{_pct(tr['initial_solve_rate'])} → {_pct(tr['final_solve_rate'])}; policy lag "
            f"mean {tr['policy_lag_mean']:.2f}, max {tr['policy_lag_max']}; stale groups dropped "
            f"{tr['groups_dropped_stale']}; learner idle {_pct(tr['learner_idle_fraction'])}"
        )
    else:
        head.append("- RL: did not run")
    if gate:
        head.append(f"- Quality gate: **{'PASS' if gate['passed'] else 'FAIL'}**")
    out.append(("Summary", head))
    plots = [f"![{title}]({rel})" for rel, title in PLOTS if (run_dir / rel).exists()]
    out.append(("Plots", plots or ["(no plots: the train stage did not run)"]))
    trace = run_dir / "train" / "trace.perfetto-trace"
    if trace.exists():
        from asyncrl.tracing.reader import format_summary, read_packets, summarize

        packets, _ = read_packets(trace)
        lines = [
            "Trace: [`train/trace.perfetto-trace`](train/trace.perfetto-trace) "
            "(open in https://ui.perfetto.dev)",
            "```",
            format_summary(summarize(packets)),
            "```",
        ]
        out.append(("Where the time went", lines))
    if rec:
        rows = [
            "| phase | kill at | checkpoint | resumed | bits | cursor | lost steps | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in rec["phases"]:
            rows.append(
                f"| {p['phase']} | {p['kill_step']} | {p['checkpoint_at_kill']} | "
                f"{p['resumed_step']} | {'same' if p['bit_identical'] else 'DIFF'} | "
                f"{'ok' if p['cursor_ok'] else 'BAD'} | {p['lost_steps']} | "
                f"{'pass' if p['passed'] else 'FAIL ' + p['detail']} |"
            )
        rows.append(f"\nRecovery test: **{'PASS' if rec['passed'] else 'FAIL'}**")
        out.append(("Recovery test", rows))
    else:
        out.append(("Recovery test", ["did not run"]))
    if gate:
        rows = ["| check | value | bound | verdict |", "|---|---|---|---|"]
        for c in gate["checks"]:
            verdict = "pass" if c["passed"] else "FAIL"
            rows.append(f"| {c['name']} | {c['value']} | {c['bound']} | {verdict} |")
        out.append(("Quality gate", rows))
    else:
        out.append(("Quality gate", ["did not run"]))
    links = [
        f"- [{name}]({name})"
        for name in (
            "config.yaml",
            "train/metrics.jsonl",
            "warm_start/metrics.jsonl",
            "recovery_test/verdict.json",
            "quality_gate/report.json",
            "train/tensorboard",
        )
        if (run_dir / name).exists()
    ]
    out.append(("Files", links))
    return out


def write_report(run_dir: Path) -> ReportPaths:
    sections = _sections(run_dir)
    md = ["# asyncrl run report", ""]
    for title, lines in sections:
        md += [f"## {title}", "", *lines, ""]
    md_path = run_dir / REPORT_MD
    md_path.write_text("\n".join(md))
    html_path = run_dir / REPORT_HTML
    html_path.write_text(_html(sections))
    return ReportPaths(markdown=md_path, html=html_path)


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
