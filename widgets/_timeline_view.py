"""The pipeline timeline as the charts draw it: compute bars, transfer lanes, idle stretches, and labels
that say which hardware each time axis is for and how it relates to the plan's step time.

A predicted timeline is simulated for the plan's cluster and a measured one recorded on the devices the
step ran on; the two are different machines, so each panel has its own time axis and names its hardware.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from alpaviz.core import Plan, Timeline

COMPUTE_KINDS = ("forward", "backward", "weight_grad", "update")  # weight_grad: ZB-H1's W, labelled W
TRANSFER_KINDS = ("send", "recv")


@dataclasses.dataclass(frozen=True)
class GanttBar:
    """One bar of the pipeline chart."""

    stage: int
    microbatch: int
    kind: str
    start_s: float
    end_s: float
    source: str
    chunk: int | None = None  # which of its row's stages ran, when a row holds several (interleaved 1F1B)

    @property
    def label(self) -> str:
        text = self.kind[0].upper() + (str(self.microbatch) if self.microbatch >= 0 else "")
        return text + (f"·{self.chunk}" if self.chunk is not None else "")


def _bars(timeline: Timeline | None, kinds: Sequence[str]) -> tuple[GanttBar, ...]:
    if timeline is None:
        return ()
    return tuple(
        GanttBar(e.stage, e.microbatch, e.kind, e.start_s, e.end_s, timeline.source,
                 e.chunk if timeline.chunks > 1 else None)
        for e in sorted(timeline.events, key=lambda e: (e.stage, e.start_s))
        if e.kind in kinds and (e.kind in COMPUTE_KINDS or e.end_s > e.start_s)
    )


def gantt_bars(timeline: Timeline | None) -> tuple[GanttBar, ...]:
    """Forward, backward (B and W apart under ZB-H1) and update runs."""
    return _bars(timeline, COMPUTE_KINDS)


def transfer_bars(timeline: Timeline | None) -> tuple[GanttBar, ...]:
    """Sends and receives that take time (a receive whose data is already there takes none)."""
    return _bars(timeline, TRANSFER_KINDS)


def idle_gaps(bars: Sequence[GanttBar]) -> tuple[tuple[int, float, float], ...]:
    """(stage, start, end) of every stretch a stage sits idle between the step's first and last bar."""
    if not bars:
        return ()
    first, last = min(b.start_s for b in bars), max(b.end_s for b in bars)
    gaps = []
    for stage in sorted({b.stage for b in bars}):
        cursor = first
        for b in sorted((b for b in bars if b.stage == stage), key=lambda b: b.start_s):
            if b.start_s > cursor:
                gaps.append((stage, cursor, b.start_s))
            cursor = max(cursor, b.end_s)
        if cursor < last:
            gaps.append((stage, cursor, last))
    return tuple(gaps)


def bubble_fractions(*timelines: Timeline | None) -> tuple[float | None, ...]:
    """Each timeline's own bubble share (`Timeline.bubble_fraction`), None where there is no timeline."""
    return tuple(None if t is None else t.bubble_fraction for t in timelines)


@dataclasses.dataclass(frozen=True)
class TimelinePanel:
    """One side of the chart: its bars, its transfers, and the words over its own time axis."""

    name: str
    hardware: str
    bars: tuple[GanttBar, ...]
    transfers: tuple[GanttBar, ...]
    total_s: float
    bubble: float | None
    note: str = ""
    missing: str = ""

    @property
    def title(self) -> str:
        if not self.bars:
            return f"{self.name} ({self.missing or 'not available'})"
        head = f"{self.name} on {self.hardware}" if self.hardware else self.name
        head += f": {self.total_s * 1e3:.4g} ms"
        if self.bubble is not None:
            head += f", bubble {self.bubble:.0%}"
        return head + (f"<br><sup>{self.note}</sup>" if self.note else "")


def timeline_panel(timeline: Timeline | None, name: str, note: str = "", missing: str = "") -> TimelinePanel:
    """A panel for any timeline (e.g. one drawn alone in a notebook)."""
    if timeline is None:
        return TimelinePanel(name, "", (), (), 0.0, None, note, missing)
    return TimelinePanel(name, timeline.hardware, gantt_bars(timeline), transfer_bars(timeline),
                         timeline.total_s, timeline.bubble_fraction, note, missing)


def stage_ratios(predicted: Timeline, measured: Timeline) -> tuple[tuple[int, float], ...]:
    """Per stage, measured busy time over predicted busy time (runs and sends)."""
    out = []
    for stage in range(min(predicted.num_stages, measured.num_stages)):
        want = predicted.busy_s(stage)
        if want > 0:
            out.append((stage, measured.busy_s(stage) / want))
    return tuple(out)


def timeline_panels(plan: Plan, predicted: Timeline | None, measured: Timeline | None,
                    measured_prediction: Timeline | None = None) -> tuple[TimelinePanel, TimelinePanel]:
    """The predicted and the measured panel of the editor's chart.

    The predicted panel says how its end relates to the plan's step time: the stage DP adds each stage's
    once-per-step update in series (a bound that keeps it exact), while the simulated schedule overlaps
    them.  The measured panel gives each stage's measured/predicted ratio, the two being different
    hardware unless the plan was made for the devices it ran on; with `measured_prediction` (the plan priced
    for the devices it ran on) the ratios are taken against that instead, on one hardware.
    """
    note = ""
    if predicted is not None and predicted.events:
        step = plan.predicted.step_time_s
        if abs(predicted.total_s - step) > 0.01 * step:
            note = (f"the plan's step time, {step * 1e3:.4g} ms, is the stage DP's estimate:<br>"
                    f"it adds the stages' once-per-step updates in series, the schedule overlaps them")
    ratio_note = ""
    basis = measured_prediction if measured_prediction is not None else predicted
    if basis is not None and measured is not None:
        ratios = stage_ratios(basis, measured)
        if ratios:
            which = (f"predicted for {measured_prediction.hardware} ({measured_prediction.total_s * 1e3:.4g} ms)"
                     if measured_prediction is not None else "predicted")
            ratio_note = f"measured / {which}<br>per stage: " + ", ".join(f"{s}: {r:.3g}x" for s, r in ratios)
    return (timeline_panel(predicted, "predicted", note, "not available"),
            timeline_panel(measured, "measured", ratio_note, "press Launch"))
