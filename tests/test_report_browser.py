"""The run report in a real headless Chromium: every plot is an image that decoded (natural width
> 0), every table of the Markdown report is a table of the page, nothing overflows a phone-width
window, and a screenshot is saved under the run folder. Skipped, saying why, without Chromium
(`make test` installs Debian's `chromium` where it can)."""

import html
import json
import re
import shutil
import subprocess

import pytest

from asyncrl.run_layout import RunLayout

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
NARROW = (412, 915)  # a phone's CSS viewport
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    images: [...document.images].map((i) => ({alt: i.alt, width: i.naturalWidth})),
    tables: [...document.querySelectorAll("table")].map((t) => t.rows.length),
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  });
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def browser():
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip(
            f"no headless browser ({', '.join(BROWSERS)}) on PATH: `make browser` installs one"
        )
    return found


def _chromium(browser, *args):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def _markdown_tables(text: str) -> list[int]:
    """Rows of each table in the Markdown (separator lines not counted)."""
    tables, rows = [], 0
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows += 0 if re.fullmatch(r"\|[-|\s]*\|", line.strip()) else 1
        elif rows:
            tables.append(rows)
            rows = 0
    return tables


def test_the_report_renders_in_a_browser_with_every_plot_and_table(passing_run, browser, tmp_path):
    result = passing_run.result
    layout = RunLayout.of(result.run_dir)
    page = layout.report_html.read_text()
    probed = tmp_path / "report.html"  # the page as shipped, plus the probe; nothing else
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    width, height = NARROW
    dom = _chromium(
        browser,
        f"--window-size={width},{height}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probe_url := probed.as_uri(),
    ).stdout
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match, f"the probe did not run in {probe_url}"
    seen = json.loads(html.unescape(match.group(1)))
    markdown = layout.report_md.read_text()
    plots = re.findall(r"^!\[", markdown, re.M)
    assert len(seen["images"]) == len(plots) > 0
    assert all(i["width"] > 0 for i in seen["images"]), seen["images"]
    assert seen["tables"] == _markdown_tables(markdown)
    assert seen["scrollWidth"] <= seen["innerWidth"]  # wide tables scroll inside their box
    shot = layout.root / "report-screenshot.png"
    _chromium(
        browser,
        f"--window-size={width},{height * 3}",
        f"--screenshot={shot}",
        layout.report_html.as_uri(),
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
