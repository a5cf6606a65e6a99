"""Why this plan: what a re-solve changed, and the plan beside the baselines, split the same way."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from alpaviz.core import Plan, Schedule
from alpaviz.core.plan import format_bytes


@dataclasses.dataclass(frozen=True)
class PlanChange:
    """One line of a plan diff: what, before, after."""

    what: str
    before: str
    after: str


def _stage_text(stage) -> str:
    text = (f"layers {stage.layer_start}-{stage.layer_stop - 1} on {stage.submesh[0]}x{stage.submesh[1]} "
            f"as {stage.logical_mesh[0]}x{stage.logical_mesh[1]}")
    return text + (", recomputes" if stage.remat else "")


NO_CHANGE = "the re-solve kept the same plan"  # what an empty diff says, as HTML and as text


def plan_diff(before: Plan, after: Plan) -> tuple[PlanChange, ...]:
    """What a re-solve changed: step time, memory, microbatches, stages and meshes, strategies."""
    changes = []
    b, a = before.predicted, after.predicted
    if b.step_time_s != a.step_time_s:
        pct = 100 * (a.step_time_s - b.step_time_s) / b.step_time_s if b.step_time_s else 0.0
        changes.append(PlanChange("step time", f"{b.step_time_s * 1e3:.4g} ms",
                                  f"{a.step_time_s * 1e3:.4g} ms ({pct:+.1f}%)"))
    if b.max_memory_bytes != a.max_memory_bytes:
        changes.append(PlanChange("peak memory per device", format_bytes(b.max_memory_bytes),
                                  format_bytes(a.max_memory_bytes)))
    if before.schedule != after.schedule:
        changes.append(PlanChange("schedule", _schedule_text(before.schedule), _schedule_text(after.schedule)))
    if before.stage_cuts != after.stage_cuts:
        changes.append(PlanChange("cuts before layers", ", ".join(map(str, before.stage_cuts)) or "none",
                                  ", ".join(map(str, after.stage_cuts)) or "none"))
    for i in range(max(before.num_stages, after.num_stages)):
        old = _stage_text(before.stages[i]) if i < before.num_stages else "-"
        new = _stage_text(after.stages[i]) if i < after.num_stages else "-"
        if old != new:
            changes.append(PlanChange(f"stage {i}", old, new))
    old_strategies = {n: s for stage in before.stages for n, s in stage.strategies}
    new_strategies = {n: s for stage in after.stages for n, s in stage.strategies}
    moved = sorted(n for n in old_strategies.keys() & new_strategies.keys() if old_strategies[n] != new_strategies[n])
    if moved:
        shown = ", ".join(f"{n}: {old_strategies[n]} -> {new_strategies[n]}" for n in moved[:3])
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        changes.append(PlanChange("operator strategies", f"{len(moved)} changed", shown + more))
    return tuple(changes)


# ---- why this plan: the alternatives side by side -------------------------------
@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One plan's step split the same way as the others', or why it has none."""

    name: str
    step_s: float | None
    parts: tuple[tuple[str, float], ...] = ()
    peak_memory_bytes: float = 0.0
    stages: str = ""
    reason: str = ""


def comparison_rows(entries: Sequence[tuple[str, Plan | str]]) -> tuple[ComparisonRow, ...]:
    rows = []
    for name, plan in entries:
        if isinstance(plan, str):
            rows.append(ComparisonRow(name, None, reason=plan))
            continue
        p = plan.predicted
        parts = (("compute", p.compute_s), ("communication", p.communication_s), ("resharding", p.resharding_s),
                 ("cross-stage", p.cross_stage_s), ("bubble", p.bubble_s))
        stages = "; ".join(_stage_text(s) for s in plan.stages)
        rows.append(ComparisonRow(name, p.step_time_s, parts, p.max_memory_bytes, stages))
    return tuple(rows)


def _schedule_text(schedule: Schedule) -> str:
    return f"{schedule.label} x {schedule.num_microbatches}{schedule.statistics_note}"
