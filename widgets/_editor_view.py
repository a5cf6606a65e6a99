"""The editor's presenter: one frozen view of a session and what the user has selected.

Data (the session's plan and pins) -> this view -> a layout: the notebook's widgets (`_editor.py`), the
web app's (`_app.py`) or plain text (`view_text`, which the golden tests read). Both front ends map the
same view, so they cannot drift; nothing here imports a widget library.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from alpaviz.widgets import _plan_compare as compare
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._figures import stage_colour
from alpaviz.widgets._session import EditorSession

SOLVER_CHOICE = vm.SOLVER_CHOICE
GRAPH_LEVELS = (("layers", "layer"), ("operators", "op"))
ALL_LAYERS = -1
OPERATOR_GRAPH_LIMIT = 300  # operators drawn at most in the operator graph, in both front ends


@dataclasses.dataclass(frozen=True)
class Selection:
    """What the user looks at, apart from the plan: kept by the controller, never by a widget."""

    tab: int = 0
    graph_level: str = "layer"  # "layer" or "op"
    graph_layer: int = ALL_LAYERS  # the operator graph's layer, ALL_LAYERS for every one
    table_layer: int = 0
    op_search: str = ""
    tensor: str = ""  # a key of EditorView.tensor_keys; "" opens on the largest split tensor
    operator: str | None = None  # an operator's name, or text typed that names none yet; None: the costliest


@dataclasses.dataclass(frozen=True)
class LayerChip:
    """One layer in the stage-cut row, coloured by its stage."""

    layer: int
    stage: int
    colour: str


@dataclasses.dataclass(frozen=True)
class StageRow:
    """One stage's submesh and recomputation choices (labels; the controller maps them back to pins)."""

    index: int
    submesh_labels: tuple[str, ...]
    submesh: str
    remat_labels: tuple[str, ...]
    remat: str
    text: str


@dataclasses.dataclass(frozen=True)
class WhatIfFields:
    """The what-if controls' values, as the user typed them where a field is refused."""

    microbatches: int
    schedule: str
    preset: str
    hosts: int
    intra_bw: float
    inter_bw: float


@dataclasses.dataclass(frozen=True)
class EditorView:
    """Everything both front ends show, as data: what `_editor.py` and `_app.py` map onto widgets."""

    headline: str
    header: tuple[vm.HeaderItem, ...]
    ok: bool
    message: str
    whatif: WhatIfFields
    whatif_problems: tuple[tuple[str, str], ...]  # (field of WHATIF_FIELDS, what is wrong)
    chips: tuple[LayerChip, ...]
    cuts: tuple[vm.CutSlot, ...]  # the gaps between chips: a click cycles pinned cut, pinned no-cut, free
    stages: tuple[StageRow, ...]
    tensor_keys: tuple[str, ...]
    tensor: str
    operator_labels: tuple[str, ...]
    operator_label: str
    strategy_choices: tuple[tuple[str, str], ...]  # (label, value); SOLVER_CHOICE unpins
    strategy: str
    table_layers: tuple[int, ...]
    graph_layers: tuple[int, ...]
    selection: Selection
    comparison: tuple[compare.ComparisonRow, ...]
    diff: tuple[compare.PlanChange, ...] | None  # None before the first re-solve

    @property
    def problem_of(self) -> Mapping[str, str]:
        """What-if field -> what is wrong with it."""
        return dict(self.whatif_problems)

    @property
    def controls(self) -> tuple[tuple[str, tuple | None, Any], ...]:
        """(control, options, value) for every control that shows the selection, in the names both front
        ends give their widgets; options are (label, value) pairs, None for a free-text or toggle control."""
        s = self.selection
        return (
            ("graph_level", None, s.graph_level),
            ("op_search", None, s.op_search),
            ("graph_layer", tuple(("all" if i < 0 else f"L{i}", i) for i in self.graph_layers), s.graph_layer),
            ("table_layer", tuple((f"L{i}", i) for i in self.table_layers), s.table_layer),
            ("tensor_select", tuple((key, key) for key in self.tensor_keys), self.tensor),
            ("op_select", tuple((label, label) for label in self.operator_labels), self.operator_label),
            ("strategy_select", self.strategy_choices, self.strategy),
        )


@dataclasses.dataclass(frozen=True)
class PlanRows:
    """The rows a plan and its pins give, worked out once per plan and shared by every view of it."""

    sharding: Mapping[str, vm.ShardingRow]  # "stage i: tensor" -> row
    strategies: Mapping[str, vm.StrategyRow]  # operator -> row
    operator_labels: Mapping[str, str]  # label -> operator
    first_tensor: str
    costliest: str | None


def tensor_key(row: vm.ShardingRow) -> str:
    """How the tensor picker names a tensor of a stage."""
    return f"stage {row.stage}: {row.tensor}"


def plan_rows(session: EditorSession) -> PlanRows:
    """The sharding and strategy rows of the session's plan under its pins."""
    s = session
    sharding = {tensor_key(r): r for r in vm.sharding_rows(s.graph, s.plan, s.pins)}
    strategies = {r.node: r for r in vm.strategy_rows(s.graph, s.plan, s.pins)}
    first = vm.first_tensor(list(sharding.values()))
    return PlanRows(sharding, strategies, vm.operator_labels(s.graph, list(strategies.values())),
                    "" if first is None else tensor_key(first), vm.costliest_operator(s.graph, list(strategies.values())))


def _stage_rows(session: EditorSession) -> tuple[StageRow, ...]:
    remat_label = {value: label for label, value in vm.REMAT_CHOICES.items()}
    rows = []
    for band in vm.stage_bands(session.plan, session.pins):
        labels = {o: vm.submesh_option_label(*o) for o in band.submesh_options}
        pinned = (band.pinned_submesh, session.pins.logical_mesh_map.get(band.index))
        rows.append(StageRow(band.index, (SOLVER_CHOICE, *labels.values()), labels.get(pinned, SOLVER_CHOICE),
                             tuple(vm.REMAT_CHOICES), remat_label[band.pinned_remat], band.label))
    return tuple(rows)


def submesh_pin(session: EditorSession, stage: int, label: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The (submesh, logical mesh) a stage row's label names; None for the solver's choice."""
    band = next(b for b in vm.stage_bands(session.plan, session.pins) if b.index == stage)
    return next((o for o in band.submesh_options if vm.submesh_option_label(*o) == label), None)


def _layer_row(session: EditorSession) -> tuple[tuple[LayerChip, ...], tuple[vm.CutSlot, ...]]:
    plan = session.plan
    stage_of = {layer: st.index for st in plan.stages for layer in st.layers}
    chips = tuple(LayerChip(layer, stage_of.get(layer, 0), stage_colour(stage_of.get(layer, 0)))
                  for layer in range(len(plan.layers)))
    return chips, vm.cut_slots(plan, session.pins)


def editor_view(session: EditorSession, selection: Selection, rows: PlanRows, whatif: WhatIfFields,
                problems: Mapping[str, str], notice: tuple[bool, str] | None = None, bubble: float | None = None,
                strategy_names: Callable | None = None) -> EditorView:
    """The view of `session` under `selection`; `notice` (ok, text) overrides the session's status line."""
    s = session
    chips, cuts = _layer_row(s)
    typed = selection.operator
    operator = rows.costliest if typed is None else typed if typed in rows.strategies else None
    label = next((text for text, node in rows.operator_labels.items() if node == operator), typed or "")
    row = rows.strategies.get(operator)
    choices = ((SOLVER_CHOICE, SOLVER_CHOICE),) if row is None else tuple(s.strategy_choices(row, strategy_names))
    ok, message = notice if notice is not None else (s.ok, s.message)
    return EditorView(
        headline=vm.plan_headline(s.plan), header=vm.header_items(s.graph, s.plan, bubble), ok=ok, message=message,
        whatif=whatif, whatif_problems=tuple(problems.items()), chips=chips, cuts=cuts, stages=_stage_rows(s),
        tensor_keys=tuple(rows.sharding),
        tensor=selection.tensor if selection.tensor in rows.sharding else rows.first_tensor,
        operator_labels=tuple(rows.operator_labels), operator_label=label, strategy_choices=choices,
        strategy=(row.pinned or SOLVER_CHOICE) if row is not None else SOLVER_CHOICE,
        table_layers=tuple(range(len(s.plan.layers))), graph_layers=(ALL_LAYERS, *range(s.graph.num_layers)),
        selection=selection, comparison=compare.comparison_rows(s.comparison),
        diff=None if s.previous is None else compare.plan_diff(s.previous, s.plan),
    )


def whatif_fields(session: EditorSession) -> WhatIfFields:
    """The what-if controls' values for the session's current what-if."""
    w = session.whatif
    return WhatIfFields(w.num_microbatches, w.schedule, "", w.cluster.num_hosts,
                        w.cluster.intra_host.bandwidth_bytes_per_s / 1e9,
                        w.cluster.inter_host.bandwidth_bytes_per_s / 1e9)


TEXT_SECTIONS = ("headline", "header", "status", "cuts", "stages", "whatif", "selection", "diff")


def view_text(view: EditorView, sections: tuple[str, ...] = TEXT_SECTIONS) -> str:
    """The view as plain text, by section (of TEXT_SECTIONS): what the golden tests compare, what a user
    pastes into a bug report. "header" and "status" hold wall-clock seconds; the others do not."""
    lines = []
    for section in sections:
        lines += _TEXT[section](view)
    return "\n".join(lines) + "\n"


def _cuts_text(view: EditorView) -> list[str]:
    stage_of = {c.layer: c.stage for c in view.chips}
    row = [f"L0[s{stage_of.get(0, 0)}]"]
    for cut in view.cuts:
        row += [f"<{cut.label}>", f"L{cut.layer}[s{stage_of[cut.layer]}]"]
    return ["cuts:", "  " + " ".join(row)]


def _whatif_text(view: EditorView) -> list[str]:
    w = view.whatif
    return [f"what-if: {w.microbatches} microbatches, {w.schedule}, {w.hosts} hosts, {w.intra_bw:g}/{w.inter_bw:g} "
            "GB/s intra/inter" + "".join(f"; {field} refused: {why}" for field, why in view.whatif_problems)]


def _diff_text(view: EditorView) -> list[str]:
    if view.diff is None:
        return ["diff: none yet (no re-solve)"]
    return ["diff:"] + ([f"  {c.what}: {c.before} -> {c.after}" for c in view.diff]
                       or [f"  {compare.NO_CHANGE}"])


_TEXT = {
    "headline": lambda v: [v.headline],
    "header": lambda v: [f"{i.label}: {i.value} ({i.detail})" for i in v.header],
    "status": lambda v: [("ok: " if v.ok else "error: ") + v.message],
    "cuts": _cuts_text,
    "stages": lambda v: ["stages:"] + [f"  {r.text} | submesh: {r.submesh} | remat: {r.remat}" for r in v.stages],
    "whatif": _whatif_text,
    "selection": lambda v: [f"tensor: {v.tensor}", f"operator: {v.operator_label} -> {v.strategy}"],
    "diff": _diff_text,
}
