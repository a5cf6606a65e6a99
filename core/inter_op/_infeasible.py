"""Why no plan exists when none does, and the stage-layout pins in the DP's terms.

Errors name the rule, the values and the fix: a minimal set of pins that
cannot hold together (a deletion filter over the stage-layout pins), a layer
no mesh can run under its sharding pins, or the memory a model needs against
the limit (found by bisection on the limit).  Pins naming what cannot exist
are refused earlier, by `alpaviz.core.plan.check_pins`.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from alpaviz.core.cost import Cluster
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_dp import MeshChoice, ScheduleKind, StageConstraints, is_feasible
from alpaviz.core.inter_op._stage_profile import ProfileTable
from alpaviz.core.plan import InfeasiblePinsError, Pins, format_bytes, minimal_conflict


class ModelTooLargeError(ValueError):
    """The model does not fit the cluster's device memory under any plan."""


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


def diagnose(setup: SolveSetup, pins: Pins, num_microbatches: int, schedule: ScheduleKind) -> ValueError:
    """Explain why no plan exists: the memory limit (with or without the pins), or conflicting pins."""
    cluster, limit = setup.cluster, setup.memory_limit_bytes
    n_layers = setup.graph.num_layers

    def feasible(p: Pins, memory: float = limit) -> bool:
        c = constraints_from_pins(p, setup.table.meshes, n_layers, cluster)
        return is_feasible(setup.table, cluster.num_devices, num_microbatches, schedule, memory, c)

    if not feasible(Pins()):
        return _too_large(setup, _least_memory(lambda m: feasible(Pins(), m), limit), ())
    atoms = pins.only_stage_layout().atoms()
    if feasible(pins, math.inf):
        names = [name for name, _ in atoms]
        return _too_large(setup, _least_memory(lambda m: feasible(pins, m), limit), names)
    conflict = minimal_conflict(atoms, lambda some: not feasible(Pins.union([p for _, p in some]), math.inf))
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
