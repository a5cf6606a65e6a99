"""The user's fixed decisions, which every solver takes as input.

Pins are frozen; each `with_*` / `without_*` returns a new Pins, so the
editor can keep an undo history and a solver can never mutate them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Mapping, Sequence, TypeVar

from alpaviz.core.graph import check_int
from alpaviz.core.plan._instructions import SCHEDULE_KINDS
from alpaviz.core.plan._serde import from_jsonable, load_json, to_jsonable
from alpaviz.core.plan._spec import Spec

Shape2 = tuple[int, int]
T = TypeVar("T")

# The fields that hold (key, value) pairs; each also takes a mapping, as a user would write it.
_PAIR_FIELDS = ("stage_submeshes", "stage_logical_meshes", "stage_remat", "strategies", "partition_specs")


class InfeasiblePinsError(ValueError):
    """The pins cannot all hold at once, or one names something that does not exist; the message says which."""


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
    schedule: str | None = None  # the pipeline schedule ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")

    def __post_init__(self) -> None:
        for name in _PAIR_FIELDS:
            if isinstance(getattr(self, name), Mapping):
                object.__setattr__(self, name, tuple(getattr(self, name).items()))
        for cut in tuple(self.stage_cuts) + tuple(self.forbidden_cuts):
            check_int("a pinned cut (the layer where a stage starts)", cut)
        if self.num_stages is not None:
            check_int("num_stages", self.num_stages)
        if self.num_microbatches is not None:
            check_int("the pinned number of microbatches", self.num_microbatches, minimum=1)
        if self.schedule is not None and self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"the pinned schedule must be one of {list(SCHEDULE_KINDS)}, got {self.schedule!r}")
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
        for name in _PAIR_FIELDS:
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
        """The strategy pins as a dict, operator name to strategy name."""
        return dict(self.strategies)

    @property
    def spec_map(self) -> Mapping[str, Spec]:
        """The partition-spec pins as a dict, tensor name to spec."""
        return dict(self.partition_specs)

    @property
    def submesh_map(self) -> Mapping[int, Shape2]:
        """The submesh pins as a dict, stage index to submesh shape."""
        return dict(self.stage_submeshes)

    @property
    def logical_mesh_map(self) -> Mapping[int, Shape2]:
        """The logical-mesh pins as a dict, stage index to logical mesh shape."""
        return dict(self.stage_logical_meshes)

    @property
    def remat_map(self) -> Mapping[int, bool]:
        """The recomputation pins as a dict, stage index to on or off."""
        return dict(self.stage_remat)

    @property
    def is_empty(self) -> bool:
        """True when nothing is pinned, so the solver decides everything."""
        return self == Pins()

    def atoms(self) -> tuple[tuple[str, "Pins"], ...]:
        """Each pin on its own: (its description, a Pins holding only it), in a stable order."""
        atoms = [(f"cut before layer {c}", Pins(stage_cuts=(c,))) for c in self.stage_cuts]
        atoms += [(f"no cut before layer {c}", Pins(forbidden_cuts=(c,))) for c in self.forbidden_cuts]
        if self.num_stages is not None:
            atoms.append((f"{self.num_stages} stages", Pins(num_stages=self.num_stages)))
        if self.num_microbatches is not None:
            atoms.append((f"{self.num_microbatches} microbatches", Pins(num_microbatches=self.num_microbatches)))
        if self.schedule is not None:
            atoms.append((f"schedule {self.schedule}", Pins(schedule=self.schedule)))
        atoms += [(f"stage {s} on submesh {m}", Pins(stage_submeshes=((s, m),))) for s, m in self.stage_submeshes]
        atoms += [(f"stage {s} logical mesh {m}", Pins(stage_logical_meshes=((s, m),)))
                  for s, m in self.stage_logical_meshes]
        atoms += [(f"stage {s} " + ("recomputes its forward" if r else "keeps its activations"),
                   Pins(stage_remat=((s, r),))) for s, r in self.stage_remat]
        atoms += [(f"{n} uses {s!r}", Pins(strategies=((n, s),))) for n, s in self.strategies]
        atoms += [(f"{t} sharded as {s}", Pins(partition_specs=((t, s),))) for t, s in self.partition_specs]
        return tuple(atoms)

    @classmethod
    def union(cls, parts: Sequence["Pins"]) -> "Pins":
        """All the pins of `parts` together; two parts that pin one decision differently are refused."""
        fields = {}
        for field in dataclasses.fields(cls):
            values = [getattr(p, field.name) for p in parts]
            if field.name in ("num_stages", "num_microbatches", "schedule"):
                pinned = sorted({v for v in values if v is not None})
                if len(pinned) > 1:
                    raise InfeasiblePinsError(f"{field.name} is pinned to each of {pinned}; keep one")
                fields[field.name] = pinned[0] if pinned else None
            elif field.name in _PAIR_FIELDS:
                pairs = [pair for v in values for pair in v]
                keys = {}
                for key, value in pairs:
                    if keys.setdefault(key, value) != value:
                        raise InfeasiblePinsError(
                            f"{field.name}: {key!r} is pinned to both {keys[key]!r} and {value!r}; keep one")
                fields[field.name] = tuple(pairs)
            else:
                fields[field.name] = tuple(x for v in values for x in v)
        return cls(**fields)

    def describe(self) -> list[str]:
        """One line per pin, for error messages and the editor."""
        return [label for label, _ in self.atoms()]

    # ---- edits -----------------------------------------------------------
    def _replace(self, **changes) -> "Pins":
        return dataclasses.replace(self, **changes)

    def with_cut(self, layer: int) -> "Pins":
        """Pin a stage to start at `layer` (and drop a no-cut pin there)."""
        return self._replace(
            stage_cuts=self.stage_cuts + (layer,),
            forbidden_cuts=tuple(c for c in self.forbidden_cuts if c != layer),
        )

    def without_cut(self, layer: int) -> "Pins":
        """Unpin a cut (the solver may still choose it)."""
        return self._replace(stage_cuts=tuple(c for c in self.stage_cuts if c != layer))

    def with_no_cut(self, layer: int) -> "Pins":
        """Forbid a stage to start at `layer` (and drop a cut pin there)."""
        return self._replace(
            forbidden_cuts=self.forbidden_cuts + (layer,),
            stage_cuts=tuple(c for c in self.stage_cuts if c != layer),
        )

    def without_no_cut(self, layer: int) -> "Pins":
        """Allow a stage to start at `layer` again."""
        return self._replace(forbidden_cuts=tuple(c for c in self.forbidden_cuts if c != layer))

    def with_num_stages(self, num_stages: int | None) -> "Pins":
        """Pin (or with None, unpin) how many pipeline stages the plan has."""
        return self._replace(num_stages=num_stages)

    def with_num_microbatches(self, num_microbatches: int | None) -> "Pins":
        """Pin (or with None, unpin) how many microbatches a step is split into."""
        return self._replace(num_microbatches=num_microbatches)

    def with_schedule(self, schedule: str | None) -> "Pins":
        """Pin (or with None, unpin) the pipeline schedule: "1f1b", "gpipe", "zb-h1" or "interleaved-1f1b"
        (its chunks per submesh are then searched; a stage count pinned counts the chunks)."""
        return self._replace(schedule=schedule)

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
        """Pin (or with None, unpin) how one tensor is sharded over the stage's logical mesh axes."""
        specs = {t: s for t, s in self.partition_specs if t != tensor}
        if spec is not None:
            specs[tensor] = tuple(tuple(axes) for axes in spec)
        return self._replace(partition_specs=tuple(specs.items()))

    def only_intra_op(self) -> "Pins":
        """The pins that concern sharding inside a stage."""
        return Pins(strategies=self.strategies, partition_specs=self.partition_specs)

    def only_stage_layout(self) -> "Pins":
        """The pins the stage DP obeys: cuts, stage count, submeshes, logical meshes, recomputation."""
        return self._replace(strategies=(), partition_specs=(), num_microbatches=None, schedule=None)

    # ---- JSON ------------------------------------------------------------
    def to_json(self) -> str:
        """The pins as JSON text, read back by `Pins.from_json`."""
        return json.dumps(to_jsonable(self))

    @classmethod
    def from_json(cls, text: str) -> "Pins":
        """Pins from `Pins.to_json`'s text; malformed text is refused with what is wrong."""
        return from_jsonable(cls, load_json(text, "pins"), "pins")


def minimal_conflict(items: Sequence[T], conflicts: Callable[[Sequence[T]], bool]) -> list[T]:
    """A subset of `items` that still conflicts and from which no item can be dropped (a deletion filter).

    `conflicts(subset)` says whether the subset alone admits no solution; it holds for `items`.
    One pass, one call per item: the answer is minimal, not necessarily the smallest.
    """
    kept = list(items)
    for item in items:
        trial = [x for x in kept if x is not item]
        if conflicts(trial):
            kept = trial
    return kept
