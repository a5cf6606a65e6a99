"""The operator picker both front ends share: a search box of labels that names the operator behind each."""

from __future__ import annotations

from typing import Any, Sequence

from alpaviz.core import OpGraph
from alpaviz.widgets import _view_model as vm


class OperatorPicker:
    """Mixin for an editor whose `op_select` is a searchable box (ipywidgets Combobox, panel
    AutocompleteInput): its value is a label from `vm.operator_labels`, mapped back to the operator here."""

    op_select: Any
    _operator_labels: dict[str, str] = {}

    @property
    def selected_operator(self) -> str | None:
        """The operator the strategy picker is for, or None while the box holds no whole label."""
        return self._operator_labels.get(self.op_select.value)

    def select_operator(self, node: str | None) -> None:
        self.op_select.value = next((text for text, n in self._operator_labels.items() if n == node), "")

    def _offer_operators(self, graph: OpGraph, rows: Sequence[vm.StrategyRow]) -> None:
        """List `rows` in the box, keeping the chosen operator, else opening on the costliest."""
        keep = self.selected_operator
        self._operator_labels = vm.operator_labels(graph, rows)
        self.op_select.options = list(self._operator_labels)
        self.select_operator(keep if keep in self._operator_labels.values() else vm.costliest_operator(graph, rows))
