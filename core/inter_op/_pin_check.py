"""Pins against the graph and cluster, in the DP's terms, and why no plan exists when none does.

Errors name the rule, the values and the fix: a pin naming a layer, stage,
mesh or operator that cannot exist; a minimal set of pins that cannot hold
together (a deletion filter over the inter-op pins); or the memory a model
needs against the limit (found by bisection on the limit).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_dp import MeshChoice, ScheduleKind, StageConstraints, is_feasible
from alpaviz.core.inter_op._stage_profile import ProfileTable
from alpaviz.core.plan import Pins, format_bytes


class InfeasiblePinsError(ValueError):
    """The pins cannot all hold at once (or one names something that does not exist)."""


class ModelTooLargeError(ValueError):
    """The model does not fit the cluster's device memory under any plan."""


def check_pins(pins: Pins, graph: OpGraph, cluster: Cluster) -> None:
    """Raise InfeasiblePinsError for a pin that names a layer, stage, mesh or operator that cannot exist."""
    problems = []
    num_layers = graph.num_layers
    for cut in pins.stage_cuts + pins.forbidden_cuts:
        if cut >= num_layers:
            problems.append(f"cut before layer {cut}: the graph has layers 0..{num_layers - 1}, so a cut is 1..{num_layers - 1}")
    max_stages = min(num_layers, cluster.num_devices)
    if pins.num_stages is not None and pins.num_stages > max_stages:
        problems.append(
            f"{pins.num_stages} stages: at most {max_stages} (one layer and one device per stage; "
            f"{num_layers} layers, {cluster.num_devices} devices)"
        )
    limit = pins.num_stages if pins.num_stages is not None else max_stages
    for stage, submesh in pins.stage_submeshes:
        try:
            cluster.validate_submesh(submesh)
        except ValueError as err:
            problems.append(f"stage {stage} on submesh {submesh}: {err}")
        else:
            if submesh not in cluster.submesh_shapes():
                problems.append(f"stage {stage} on submesh {submesh}: choose one of {cluster.submesh_shapes()}")
    logical_map = pins.logical_mesh_map
    for stage, logical in pins.stage_logical_meshes:
        submesh = pins.submesh_map.get(stage)
        shapes = [submesh] if submesh is not None else list(cluster.submesh_shapes())
        if not any(tuple(logical) in cluster.logical_shapes(s) for s in shapes):
            problems.append(f"stage {stage} logical mesh {logical}: not a view of {'submesh ' + str(submesh) if submesh else 'any submesh'}")
    for stage in set(pins.submesh_map) | set(logical_map):
        if stage >= limit:
            problems.append(f"stage {stage} is pinned but there can be at most {limit} stages (0..{limit - 1})")
    for node, strategy in pins.strategies:
        if node not in graph.node_by_name:
            problems.append(f"{node} uses {strategy!r}: there is no operator {node!r} in the graph")
    for tensor, spec in pins.partition_specs:
        if tensor not in graph.tensor_by_name:
            problems.append(f"{tensor} sharded as {spec}: there is no tensor {tensor!r} in the graph")
    if problems:
        raise InfeasiblePinsError("impossible pins:\n  " + "\n  ".join(problems))


def constraints_from_pins(pins: Pins, meshes: Sequence[MeshChoice], num_layers: int, cluster: Cluster) -> StageConstraints:
    """The inter-op pins in the DP's terms."""
    submesh, logical, remat = pins.submesh_map, pins.logical_mesh_map, pins.remat_map
    stage_meshes = []
    for stage in sorted(set(submesh) | set(logical) | set(remat)):
        allowed = tuple(
            i for i, m in enumerate(meshes)
            if (stage not in submesh or m.submesh == tuple(submesh[stage]))
            and (stage not in logical or m.logical_shape == tuple(logical[stage]))
            and (stage not in remat or m.remat == remat[stage])
        )
        stage_meshes.append((stage, allowed))
    return StageConstraints(
        required_cuts=pins.stage_cuts, forbidden_cuts=pins.forbidden_cuts,
        num_stages=pins.num_stages, stage_meshes=tuple(stage_meshes),
    )


def check_intra_op_pins(pins: Pins, profiles: ProfileTable) -> None:
    for view, row in zip(profiles.layers, profiles.profiles):
        if any(p.feasible for p in row):
            continue
        touching = [f"{n} uses {s!r}" for n, s in pins.strategies if n in set(view.nodes)]
        touching += [f"{t} sharded as {s}" for t, s in pins.partition_specs if t in set(view.tensors)]
        if touching:
            # Where a pinned strategy exists, the solver's own reason is the real conflict; "not a
            # strategy on mesh (1, 1)" only says that mesh was never a candidate.
            distinct = sorted({p.reason for p in row})
            conflicts = [r for r in distinct if "is not a strategy of" not in r]
            reasons = (conflicts or distinct)[:2]
            shown = touching[:4] + ([f"... {len(touching) - 4} more"] if len(touching) > 4 else [])
            raise InfeasiblePinsError(
                f"layer {view.index} cannot run on any mesh with the pins {shown}: {'; '.join(reasons)}; "
                f"unpin or change them"
            )


def _atomic_pins(pins: Pins) -> list[tuple[str, Pins]]:
    items = [(f"cut before layer {c}", Pins(stage_cuts=(c,))) for c in pins.stage_cuts]
    items += [(f"no cut before layer {c}", Pins(forbidden_cuts=(c,))) for c in pins.forbidden_cuts]
    if pins.num_stages is not None:
        items.append((f"{pins.num_stages} stages", Pins(num_stages=pins.num_stages)))
    items += [(f"stage {s} on submesh {m}", Pins(stage_submeshes=((s, m),))) for s, m in pins.stage_submeshes]
    items += [(f"stage {s} logical mesh {m}", Pins(stage_logical_meshes=((s, m),))) for s, m in pins.stage_logical_meshes]
    items += [(f"stage {s} " + ("recomputes its forward" if r else "keeps its activations"),
               Pins(stage_remat=((s, r),))) for s, r in pins.stage_remat]
    return items


def _union(parts: Sequence[Pins]) -> Pins:
    return Pins(
        stage_cuts=tuple(c for p in parts for c in p.stage_cuts),
        forbidden_cuts=tuple(c for p in parts for c in p.forbidden_cuts),
        num_stages=next((p.num_stages for p in parts if p.num_stages is not None), None),
        stage_submeshes=tuple(x for p in parts for x in p.stage_submeshes),
        stage_logical_meshes=tuple(x for p in parts for x in p.stage_logical_meshes),
        stage_remat=tuple(x for p in parts for x in p.stage_remat),
    )


def diagnose(setup: SolveSetup, pins: Pins, num_microbatches: int, schedule: ScheduleKind) -> ValueError:
    """Explain why no plan exists: the memory limit (with or without the pins), or conflicting pins."""
    cluster, limit = setup.cluster, setup.memory_limit_bytes
    n_layers = setup.graph.num_layers

    def feasible(p: Pins, memory: float = limit) -> bool:
        c = constraints_from_pins(p, setup.table.meshes, n_layers, cluster)
        return is_feasible(setup.table, cluster.num_devices, num_microbatches, schedule, memory, c)

    if not feasible(Pins()):
        return _too_large(setup, _least_memory(lambda m: feasible(Pins(), m), limit), ())
    if feasible(pins, math.inf):
        names = [name for name, _ in _atomic_pins(pins)]
        return _too_large(setup, _least_memory(lambda m: feasible(pins, m), limit), names)
    atoms = _atomic_pins(pins)
    conflict = list(atoms)
    for atom in atoms:  # deletion filter: drop every pin the conflict does not need
        trial = [a for a in conflict if a is not atom]
        if not feasible(_union([p for _, p in trial]), math.inf):
            conflict = trial
    names = [name for name, _ in conflict]
    placement = ""
    if cluster.num_hosts > 1 and any(p.stage_submeshes for _, p in conflict):
        placement = (f" (stages sit on the devices in pipeline order, so a stage inside a host of "
                     f"{cluster.devices_per_host} devices may not straddle two hosts)")
    return InfeasiblePinsError(
        f"these pins cannot all hold (with {cluster.num_devices} devices and {n_layers} layers, "
        f"whatever the memory){placement}: {names}; unpin one of them"
    )


def _least_memory(fits: Callable[[float], bool], limit: float) -> float:
    """The smallest per-device memory limit under which a plan exists (bisection, 1% precision)."""
    low, high = limit, 2 * limit
    while not fits(high):
        low, high = high, 2 * high
        if high > 1e30:
            return math.inf
    while high - low > 1e-2 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def _too_large(setup: SolveSetup, need: float, pin_names: Sequence[str]) -> ModelTooLargeError:
    limit, n = setup.memory_limit_bytes, setup.cluster.num_devices
    widest = []
    for row in setup.profiles.profiles:
        options = [p.memory.peak for p in row if p.feasible]
        widest.append(min(options) if options else math.inf)
    worst = max(range(len(widest)), key=lambda i: widest[i])
    under = f"with the pins {list(pin_names)} " if pin_names else ""
    return ModelTooLargeError(
        f"the model does not fit {setup.cluster.name} ({n} devices): {under}the best plan needs "
        f"{format_bytes(need)} per device (parameters, gradients, optimizer state, in-flight "
        f"activations and the largest operator's working set) but the limit is {format_bytes(limit)} per device; its largest layer ({worst}) alone "
        f"needs {format_bytes(widest[worst])} per device on the widest mesh. "
        + ("Unpin the stage layout, use" if pin_names else "Use")
        + " more devices, a smaller microbatch, or a larger memory_limit"
    )
