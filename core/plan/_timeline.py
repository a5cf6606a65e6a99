"""The pipeline timeline: what ran (or is predicted to run) where and when.

One shape for both the predicted timeline (simulated from a plan) and the
measured one (recorded by the runtime), so the views draw them side by side.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Literal

EventKind = Literal["forward", "backward", "weight_grad", "update", "send", "recv"]  # weight_grad: ZB-H1's W
TimelineSource = Literal["predicted", "measured"]


@dataclasses.dataclass(frozen=True)
class TimelineEvent:
    """One instruction on one stage's mesh; times in seconds from the step's start.  `stage` is the
    timeline's row, the submesh; under interleaved 1F1B `chunk` says which of its stages ran."""

    stage: int
    microbatch: int
    kind: EventKind
    start_s: float
    end_s: float
    chunk: int = 0

    @property
    def duration_s(self) -> float:
        """How long the event lasts."""
        return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class Timeline:
    """All events of one training step; `hardware` names what the times are for (a predicted timeline is for
    the plan's cluster, a measured one for the devices it ran on), so two are never read on one time axis."""

    events: tuple[TimelineEvent, ...]
    num_stages: int
    num_microbatches: int
    schedule: str
    source: TimelineSource
    hardware: str = ""
    chunks: int = 1  # stages per row (interleaved 1F1B): stage = row + chunk * num_stages

    @property
    def total_s(self) -> float:
        """When the last event ends: the step's length on this timeline."""
        return max((e.end_s for e in self.events), default=0.0)

    def busy_s(self, stage: int) -> float:
        """Seconds `stage` spends working (receives excluded), to read its idle share."""
        return sum(e.duration_s for e in self.events if e.stage == stage and e.kind != "recv")

    @property
    def bubble_fraction(self) -> float:
        """Share of stage-time spent idle: 1 - busy / (stages * total)."""
        total = self.total_s * self.num_stages
        return 0.0 if total == 0 else 1.0 - sum(self.busy_s(s) for s in range(self.num_stages)) / total

    def to_chrome_trace(self) -> str:
        """Chrome / Perfetto trace JSON (open in chrome://tracing or ui.perfetto.dev)."""
        events = [
            {
                "name": f"{e.kind} mb{e.microbatch}",
                "cat": e.kind,
                "ph": "X",
                "pid": 0,
                "tid": e.stage,
                "ts": e.start_s * 1e6,
                "dur": e.duration_s * 1e6,
                "args": {"stage": e.stage, "microbatch": e.microbatch},
            }
            for e in self.events
        ]
        meta = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}}
            for s in range(self.num_stages)
        ]
        return json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"})
