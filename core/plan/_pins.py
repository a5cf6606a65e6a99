"""The user's fixed decisions, which every solver takes as input.

Pins are frozen; each `with_*` / `without_*` returns a new Pins, so the
editor can keep an undo history and a solver can never mutate them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

from alpaviz.core.graph import check_int
from alpaviz.core.plan._serde import from_jsonable, load_json, to_jsonable
from alpaviz.core.plan._spec import Spec

Shape2 = tuple[int, int]


def _sorted_pairs(pairs) -> tuple:
    return tuple(sorted(dict(pairs).items()))


@dataclasses.dataclass(frozen=True)
class Pins:
    """Fixed decisions: stage cuts, stage count and meshes, operator strategies, tensor specs.

    A cut at layer `l` means a stage starts at layer `l` (1 <= l < num_layers).

    Example:
        >>> pins = av.Pins().with_cut(4).with_strategy("n12_dot_general", "S0R = S0R x RR")
    """

    stage_cuts: tuple[int, ...] = ()
    forbidden_cuts: tuple[int, ...] = ()
    num_stages: int | None = None
    stage_submeshes: tuple[tuple[int, Shape2], ...] = ()
    stage_logical_meshes: tuple[tuple[int, Shape2], ...] = ()
    strategies: tuple[tuple[str, str], ...] = ()
    partition_specs: tuple[tuple[str, Spec], ...] = ()
    num_microbatches: int | None = None
    stage_remat: tuple[tuple[int, bool], ...] = ()  # (stage, recompute its forward in the backward)

    def __post_init__(self) -> None:
        for cut in tuple(self.stage_cuts) + tuple(self.forbidden_cuts):
            check_int("a pinned cut (the layer where a stage starts)", cut)
        if self.num_stages is not None:
            check_int("num_stages", self.num_stages)
        if self.num_microbatches is not None:
            check_int("the pinned number of microbatches", self.num_microbatches, minimum=1)
        for stage, shape in tuple(self.stage_submeshes) + tuple(self.stage_logical_meshes):
            check_int("a pinned stage index", stage)
            if not isinstance(shape, (tuple, list)) or len(shape) != 2:
                raise ValueError(f"stage {stage}: a mesh shape is (rows, cols), got {shape!r}")
            for size in shape:
                check_int(f"stage {stage}'s mesh shape", size, minimum=1)
        for pair in self.stage_remat:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[1], bool):
                raise ValueError(f"a remat pin is (stage, True or False), got {pair!r}")
            check_int("a pinned stage index", pair[0], minimum=0)
        for pairs, what in ((self.strategies, "strategy"), (self.partition_specs, "partition spec")):
            for pair in pairs:
                if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str):
                    raise ValueError(f"a {what} pin is (name, value), got {pair!r}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("stage_cuts", tuple(sorted(set(self.stage_cuts))))
        set_("forbidden_cuts", tuple(sorted(set(self.forbidden_cuts))))
        for name in ("stage_submeshes", "stage_logical_meshes", "stage_remat", "strategies", "partition_specs"):
            set_(name, _sorted_pairs(getattr(self, name)))
        bad = [c for c in self.stage_cuts + self.forbidden_cuts if c < 1]
        if bad:
            raise ValueError(f"a stage cut is a layer index >= 1 (a stage starts there); got {bad}")
        both = sorted(set(self.stage_cuts) & set(self.forbidden_cuts))
        if both:
            raise ValueError(f"layer(s) {both} are pinned both as a cut and as no-cut; unpin one of them")
        if self.num_stages is not None:
            if self.num_stages < 1:
                raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")
            if len(self.stage_cuts) + 1 > self.num_stages:
                raise ValueError(
                    f"{len(self.stage_cuts)} pinned cuts {self.stage_cuts} make at least "
                    f"{len(self.stage_cuts) + 1} stages, but num_stages is pinned to {self.num_stages}; "
                    f"remove a cut or raise num_stages"
                )
        for stage, _ in self.stage_submeshes + self.stage_logical_meshes:
            if stage < 0:
                raise ValueError(f"stage indices are >= 0, got {stage}")

    # ---- views -----------------------------------------------------------
    @property
    def strategy_map(self) -> Mapping[str, str]:
        return dict(self.strategies)

    @property
    def spec_map(self) -> Mapping[str, Spec]:
        return dict(self.partition_specs)

    @property
    def submesh_map(self) -> Mapping[int, Shape2]:
        return dict(self.stage_submeshes)

    @property
    def logical_mesh_map(self) -> Mapping[int, Shape2]:
        return dict(self.stage_logical_meshes)

    @property
    def remat_map(self) -> Mapping[int, bool]:
        return dict(self.stage_remat)

    @property
    def is_empty(self) -> bool:
        return self == Pins()

    def describe(self) -> list[str]:
        """One line per pin, for error messages and the editor."""
        lines = [f"cut before layer {c}" for c in self.stage_cuts]
        lines += [f"no cut before layer {c}" for c in self.forbidden_cuts]
        if self.num_stages is not None:
            lines.append(f"{self.num_stages} stages")
        if self.num_microbatches is not None:
            lines.append(f"{self.num_microbatches} microbatches")
        lines += [f"stage {s} on submesh {m}" for s, m in self.stage_submeshes]
        lines += [f"stage {s} logical mesh {m}" for s, m in self.stage_logical_meshes]
        lines += [f"stage {s} recomputes its forward" if r else f"stage {s} keeps its activations"
                  for s, r in self.stage_remat]
        lines += [f"{n} uses {s!r}" for n, s in self.strategies]
        lines += [f"{t} sharded as {s}" for t, s in self.partition_specs]
        return lines

    # ---- edits -----------------------------------------------------------
    def _replace(self, **changes) -> "Pins":
        return dataclasses.replace(self, **changes)

    def with_cut(self, layer: int) -> "Pins":
        return self._replace(
            stage_cuts=self.stage_cuts + (layer,),
            forbidden_cuts=tuple(c for c in self.forbidden_cuts if c != layer),
        )

    def without_cut(self, layer: int) -> "Pins":
        """Unpin a cut (the solver may still choose it)."""
        return self._replace(stage_cuts=tuple(c for c in self.stage_cuts if c != layer))

    def with_no_cut(self, layer: int) -> "Pins":
        return self._replace(
            forbidden_cuts=self.forbidden_cuts + (layer,),
            stage_cuts=tuple(c for c in self.stage_cuts if c != layer),
        )

    def without_no_cut(self, layer: int) -> "Pins":
        return self._replace(forbidden_cuts=tuple(c for c in self.forbidden_cuts if c != layer))

    def with_num_stages(self, num_stages: int | None) -> "Pins":
        return self._replace(num_stages=num_stages)

    def with_num_microbatches(self, num_microbatches: int | None) -> "Pins":
        """Pin (or with None, unpin) how many microbatches a step is split into."""
        return self._replace(num_microbatches=num_microbatches)

    def with_submesh(self, stage: int, submesh: Shape2 | None, logical_mesh: Shape2 | None = None) -> "Pins":
        """Pin (or with None, unpin) the submesh and optionally the logical mesh of a stage."""
        meshes = {s: m for s, m in self.stage_submeshes if s != stage}
        logical = {s: m for s, m in self.stage_logical_meshes if s != stage}
        if submesh is not None:
            meshes[stage] = tuple(submesh)  # type: ignore[assignment]
        if logical_mesh is not None:
            logical[stage] = tuple(logical_mesh)  # type: ignore[assignment]
        return self._replace(stage_submeshes=tuple(meshes.items()), stage_logical_meshes=tuple(logical.items()))

    def with_remat(self, stage: int, remat: bool | None) -> "Pins":
        """Pin whether a stage recomputes its forward in its backward (None: the solver decides)."""
        pinned = {s: r for s, r in self.stage_remat if s != stage}
        if remat is not None:
            pinned[stage] = bool(remat)
        return self._replace(stage_remat=tuple(pinned.items()))

    def with_strategy(self, node: str, strategy: str | None) -> "Pins":
        """Pin (or with None, unpin) one operator's sharding strategy."""
        strategies = {n: s for n, s in self.strategies if n != node}
        if strategy is not None:
            strategies[node] = strategy
        return self._replace(strategies=tuple(strategies.items()))

    def with_partition_spec(self, tensor: str, spec: Spec | None) -> "Pins":
        specs = {t: s for t, s in self.partition_specs if t != tensor}
        if spec is not None:
            specs[tensor] = tuple(tuple(axes) for axes in spec)
        return self._replace(partition_specs=tuple(specs.items()))

    def only_intra_op(self) -> "Pins":
        """The pins that concern sharding inside a stage."""
        return Pins(strategies=self.strategies, partition_specs=self.partition_specs)

    # ---- JSON ------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(to_jsonable(self))

    @classmethod
    def from_json(cls, text: str) -> "Pins":
        return from_jsonable(cls, load_json(text, "pins"), "pins")
