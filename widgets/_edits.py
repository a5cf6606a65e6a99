"""UI events as pure `Pins` edits: the only way the editor changes what the solver must honour."""

from __future__ import annotations

from alpaviz.core import Pins


def cycle_cut(pins: Pins, layer: int) -> Pins:
    """Clicking the gap before `layer` cycles: free -> pinned cut -> pinned no-cut -> free."""
    if layer in pins.stage_cuts:
        return pins.with_no_cut(layer)
    if layer in pins.forbidden_cuts:
        return pins.without_no_cut(layer)
    return pins.with_cut(layer)


def pin_submesh(
    pins: Pins, stage: int, choice: tuple[tuple[int, int], tuple[int, int]] | None
) -> Pins:
    """Pin stage `stage` to (submesh, logical mesh), or unpin it with None."""
    if choice is None:
        return pins.with_submesh(stage, None)
    submesh, logical = choice
    return pins.with_submesh(stage, submesh, logical)


def pin_remat(pins: Pins, stage: int, remat: bool | None) -> Pins:
    """Pin whether a stage recomputes its forward in its backward, or leave it to the solver with None."""
    return pins.with_remat(stage, remat)


def pin_strategy(pins: Pins, node: str, strategy: str | None) -> Pins:
    """Pin one operator's strategy, or unpin it with None."""
    return pins.with_strategy(node, strategy)
