"""report.html: the summary table and every plot, linked by relative path (the folder can be moved)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from html import escape

from psrl.report.summary import RunSummary

_STYLE = """
body { font-family: sans-serif; max-width: 1150px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: left; }
td.value { font-family: monospace; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; }
.problems { color: #a40; }
"""


def render_html(
    run_name: str,
    run_path: str,
    summary: RunSummary,
    plots: Sequence[tuple[str, str, str]],
    skipped: Sequence[tuple[str, str]],
    problems: Sequence[str],
) -> str:
    """``plots``: (file name, title, caption); ``skipped``: (title, why there is no plot)."""
    rows = "\n".join(
        f"<tr><th>{escape(label)}</th><td class='value'>{escape(value)}</td></tr>" for label, value in summary.rows()
    )
    figures = "\n".join(
        f"<figure id='{escape(name)}'><a href='{escape(name)}'><img src='{escape(name)}' alt='{escape(title)}'></a>"
        f"<figcaption><b>{escape(title)}.</b> {escape(caption)}</figcaption></figure>"
        for name, title, caption in plots
    )
    index = "".join(f"<li><a href='{escape(name)}'>{escape(title)}</a></li>" for name, title, _ in plots)
    missing = "".join(f"<li>{escape(title)}: {escape(reason)}</li>" for title, reason in skipped)
    trouble = "".join(f"<li>{escape(problem)}</li>" for problem in problems)
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>psrl report: {escape(run_name)}</title>
<style>{_STYLE}</style></head><body>
<h1>psrl run report: {escape(run_name)}</h1>
<p>Run directory <code>{escape(run_path)}</code>; report created {created}.</p>
<h2>Summary</h2>
<table>{rows}</table>
<h2>Plots</h2>
<ul>{index}</ul>
{f"<p>Not drawn:</p><ul>{missing}</ul>" if missing else ""}
{figures}
{f"<h2>Problems reading the run</h2><ul class='problems'>{trouble}</ul>" if trouble else ""}
</body></html>
"""
