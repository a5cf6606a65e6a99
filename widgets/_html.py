"""Every piece of HTML the editor, the app and the report show, escaped here and nowhere else.

The views hand over data (header items, diff rows, sharding rows); this module turns them into markup,
so both front ends look and escape alike.
"""

from __future__ import annotations

import html
from typing import Sequence

from alpaviz.core.plan import format_bytes
from alpaviz.widgets._figures import PALETTE
from alpaviz.widgets._layer_view import OPERATOR_COLUMNS, OperatorRow
from alpaviz.widgets._plan_compare import NO_CHANGE, ComparisonRow, PlanChange
from alpaviz.widgets._view_model import HeaderItem, ShardingRow

ERROR_COLOUR, OK_COLOUR, BUSY_COLOUR = "#b00020", "#2a7a2a", "#4C78A8"


def message_html(ok: bool, text: str) -> str:
    """The status line: green when the last action worked, red (and bold red) when it did not."""
    colour = OK_COLOUR if ok else ERROR_COLOUR
    style = "" if ok else f' style="color:{ERROR_COLOUR}"'
    return f'<span style="color:{colour}"><b{style}>{html.escape(text)}</b></span>'


def busy_html(what: str) -> str:
    """The status line while the session works on `what`."""
    return f'<span style="color:{BUSY_COLOUR}"><b>&#x23F3; {html.escape(what)}...</b></span>'


def bold_html(text: str) -> str:
    """The plan's one-line headline, or a section title inside a tab: bold."""
    return f"<b>{html.escape(text)}</b>"


def stage_text_html(text: str) -> str:
    """A stage row's description beside its submesh and remat choices."""
    return html.escape(text)


def layer_chip_html(layer: int, stage: int, colour: str) -> str:
    """One layer in the stage-cut row, in its stage's colour."""
    return (f'<div style="background:{colour};color:white;padding:4px 8px;border-radius:3px">'
            f'L{layer} (stage {stage})</div>')


def plan_text_html(text: str) -> str:
    """The editor's view as text, folded: to copy into a note or a bug report."""
    return (f'<details><summary>the plan as text</summary><pre class="alpaviz-plan-text">{html.escape(text)}'
            "</pre></details>")


def no_sharding_html() -> str:
    """What the mesh picture shows for a tensor with no blocks."""
    return "<i>no sharding</i>"


def header_html(items: Sequence[HeaderItem]) -> str:
    """The header as a row of cards."""
    cards = "".join(
        f'<div style="border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:130px">'
        f'<div style="color:#666;font-size:11px">{html.escape(i.label)}</div>'
        f'<div style="font-size:20px;font-weight:600">{html.escape(i.value)}</div>'
        f'<div style="color:#666;font-size:11px">{html.escape(i.detail)}</div></div>'
        for i in items
    )
    return f'<div style="display:flex;flex-wrap:wrap;gap:8px">{cards}</div>'


def plan_diff_html(changes: Sequence[PlanChange]) -> str:
    """The diff as a small table (or a sentence when nothing changed)."""
    if not changes:
        return f"<i>{NO_CHANGE}</i>"
    rows = "".join(f"<tr><td>{html.escape(c.what)}</td><td>{html.escape(c.before)}</td>"
                   f"<td>{html.escape(c.after)}</td></tr>" for c in changes)
    return ("<table style='border-collapse:collapse'><tr><th align=left>changed</th><th align=left>before</th>"
            f"<th align=left>after</th></tr>{rows}</table>")


def comparison_html(rows: Sequence[ComparisonRow]) -> str:
    """A table: step time and its parts in ms, peak memory, the ratio to the fastest, the stages."""
    if not rows:
        return ("<i>press Compare to price the solver's best with one stage fewer and one more, the Megatron grid "
                "and data parallelism beside this plan</i>")
    best = min((r.step_s for r in rows if r.step_s is not None), default=None)
    names = [n for n, _ in next((r.parts for r in rows if r.parts), ())]
    head = "".join(f"<th>{html.escape(n)} ms</th>" for n in names)
    body = ""
    for r in rows:
        if r.step_s is None:
            body += (f"<tr><td>{html.escape(r.name)}</td><td colspan={len(names) + 4}>"
                     f"{html.escape(r.reason)}</td></tr>")
            continue
        cells = "".join(f"<td>{v * 1e3:.4g}</td>" for _, v in r.parts)
        body += (f"<tr><td>{html.escape(r.name)}</td><td>{r.step_s * 1e3:.4g}</td><td>{r.step_s / best:.3f}</td>"
                 f"{cells}<td>{html.escape(format_bytes(r.peak_memory_bytes))}</td>"
                 f"<td>{html.escape(r.stages)}</td></tr>")
    return ("<table style='border-collapse:collapse'><tr><th>plan</th><th>step ms</th><th>vs fastest</th>"
            f"{head}<th>peak memory</th><th>stages</th></tr>{body}</table>")


def operator_table_html(rows: Sequence[OperatorRow], limit: int = 200) -> str:
    """The table as HTML (the `limit` costliest rows, and how many more there are)."""
    if not rows:
        return "<i>no operator matches</i>"
    head = "".join(f"<th>{c}</th>" for c in OPERATOR_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r.cells) + "</tr>" for r in rows[:limit])
    more = f"<div><i>{len(rows) - limit} more: narrow the search</i></div>" if len(rows) > limit else ""
    return (f'<table style="border-collapse:collapse;font-size:12px"><tr>{head}</tr>{body}</table>{more}')


def mesh_html(row: ShardingRow) -> str:
    """A grid of the logical mesh; each cell names the device and the block it holds.

    Devices holding the same block share a colour, as in `jax.debug.visualize_array_sharding`.
    """
    colours: dict[tuple, str] = {}
    cells: dict[tuple[int, int], str] = {}
    for block in row.blocks:
        colour = colours.setdefault(block.slices, PALETTE[len(colours) % len(PALETTE)])
        cells[block.coord] = (
            f'<td style="background:{colour};color:white;padding:4px 8px;border:1px solid white;'
            f'font-family:monospace;font-size:11px">{html.escape(block.label)}</td>'
        )
    rows = "".join(
        "<tr>" + "".join(cells.get((i, j), "<td></td>") for j in range(row.mesh_shape[1])) + "</tr>"
        for i in range(row.mesh_shape[0])
    )
    caption = (f"{html.escape(row.tensor)} {row.shape} as {row.name} = {html.escape(row.partition_spec)} on mesh "
               f"{row.mesh_shape[0]}x{row.mesh_shape[1]}: block {row.shard_shape}")
    return f'<div><div style="font-size:12px">{caption}</div><table style="border-collapse:collapse">{rows}</table></div>'


def _ranking_table(rows: Sequence[tuple[str, float]]) -> str:
    if not rows:
        return ""
    best = min(seconds for _, seconds in rows)
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{seconds * 1e3:.3f}</td><td>{seconds / best:.2f}x</td></tr>"
        for name, seconds in rows
    )
    return (
        "<table class='cmp'><tr><th>plan</th><th>predicted step (ms)</th><th>vs best</th></tr>"
        f"{body}</table>"
    )


def report_section_html(title: str, text: str, summary: str, ranking: Sequence[tuple[str, float]],
                        figure_divs: Sequence[str]) -> str:
    """One plan of the report: its title, text, summary, ranking of alternatives and figures (already HTML)."""
    return (f"<section><h2>{html.escape(title)}</h2><p>{html.escape(text)}</p><pre>{html.escape(summary)}</pre>"
            f"{_ranking_table(ranking)}" + "".join(figure_divs) + "</section>")


REPORT_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px}"
    "pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}"
    "table.cmp{border-collapse:collapse;margin:8px 0}"
    "table.cmp td,table.cmp th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
)


def report_page_html(title: str, body: str) -> str:
    """A whole offline page around the report's sections."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{REPORT_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def snapshot_html(header: str, section: str) -> str:
    """The editor's static snapshot: its header above one report section."""
    return f"<div>{header}{section}</div>"
