"""Interleaved 1F1B: a pass after the stage DP that gives each submesh several chunks of the model.

The DP places p stages on p submeshes under 1F1B.  Interleaving keeps those
submeshes, with their mesh shapes, and cuts the layers again into p * v
stages, stage j on submesh j mod p: a bubble then lasts a chunk's time, at
the price of v times the cross-stage transfers and more activations held on
the first submeshes.  The cuts minimise the slowest chunk (then the sum);
every submesh's memory (its chunks' state, temporaries and the activations
its own order keeps in flight) must fit.  The step simulator prices every
(layout, v) found, as it prices the DP's own layouts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from alpaviz.core.inter_op._in_flight import in_flight
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_dp import (
    StageChoice, StageConstraints, StageSolution, layout_solution, stage_offsets,
)
from alpaviz.core.plan import INTERLEAVED

MAX_CHUNKS = 4  # beyond this the added transfers outweigh the bubble on every model we measured


def interleaved_layouts(setup: SolveSetup, layouts: Sequence[StageSolution], num_microbatches: int,
                        constraints: StageConstraints) -> tuple[list[StageSolution], list[str]]:
    """Each 1F1B layout's submeshes re-cut into v = 2..`MAX_CHUNKS` chunks each, where that fits.

    Returns the layouts (`StageSolution.chunks` = v) and why others were not
    made (a count of microbatches that is no multiple of p, too few layers,
    memory, pins)."""
    found: list[StageSolution] = []
    skipped: list[str] = []
    table = setup.table
    for layout in layouts:
        meshes = [s.mesh for s in layout.stages]
        p = len(meshes)
        if p < 2:
            skipped.append("one stage: nothing to interleave")
            continue
        if num_microbatches % p:
            skipped.append(f"{p} submeshes: {num_microbatches} microbatches is not a multiple of {p}")
            continue
        for v in range(2, MAX_CHUNKS + 1):
            if p * v > table.num_layers:
                skipped.append(f"{p} submeshes x {v} chunks: only {table.num_layers} layers")
                break
            if constraints.num_stages not in (None, p * v):
                continue
            stages = chunk_cuts(setup, meshes, v, constraints)
            if stages is None:
                skipped.append(f"{p} submeshes x {v} chunks: no cuts keep the pins")
                continue
            over = _memory_overflow(setup, stages, p, v, num_microbatches)
            if over:
                skipped.append(f"{p} submeshes x {v} chunks: {over}")
                continue
            solution = layout_solution(table, stages, num_microbatches)
            found.append(StageSolution(stages, solution.objective_s, solution.t_max_s, 0, 0, chunks=v))
    return found, list(dict.fromkeys(skipped))


def chunk_cuts(setup: SolveSetup, meshes: Sequence[int], chunks: int,
               constraints: StageConstraints = StageConstraints()) -> tuple[StageChoice, ...] | None:
    """The layers cut into len(meshes) * chunks stages, stage j on mesh choice meshes[j mod p], the slowest
    stage as fast as it can be (then the least sum); None when the pins allow no cut.

    Two DPs over (stages placed, layers covered): the least slowest stage, then the least sum under it;
    pinned cuts are kept, forbidden ones avoided, pinned meshes honoured."""
    table = setup.table
    p, num_layers = len(meshes), table.num_layers
    n = p * chunks
    firsts = stage_offsets(table, [StageChoice(0, 1, m) for m in meshes])
    required = sorted(constraints.required_cuts)
    forbidden = set(constraints.forbidden_cuts)
    allowed_mesh = dict(constraints.stage_meshes)
    if any(meshes[j % p] not in allowed_mesh[j] for j in allowed_mesh if j < n):
        return None
    variants = table.time_variants()  # [link in, link back, start, stop, mesh]: the cuts' transfers included
    stage_times = []
    for j in range(n):
        mesh, first = meshes[j % p], firsts[j % p]
        size = table.meshes[mesh].num_devices
        edge_in, edge_back = int(table.at_host_edge(first)), int(table.at_host_edge(first + size))
        times = variants[edge_in, edge_back, :, :, mesh].copy()
        for stop in range(num_layers + 1):  # a stage holds no pinned cut and ends at no forbidden one
            earliest = max([c for c in required if c < stop], default=0)
            times[:earliest, stop] = np.inf
        times[:, sorted(forbidden)] = np.inf
        stage_times.append(times)
    slowest, _ = _cut_dp(stage_times, np.maximum)
    if not np.isfinite(slowest):
        return None
    # Among the cuts whose slowest stage is that fast, the least total.
    capped = [np.where(t <= slowest * (1 + 1e-9), t, np.inf) for t in stage_times]
    _, starts = _cut_dp(capped, np.add)
    meshes_of = [meshes[j % p] for j in range(n)]
    stops = [*starts[1:], num_layers]
    return tuple(StageChoice(a, b, mesh) for a, b, mesh in zip(starts, stops, meshes_of))


def _cut_dp(stage_times: Sequence[np.ndarray], combine) -> tuple[float, list[int]]:
    """Cut layers [0, L) into len(stage_times) stages, stage j of layers [a, b) costing stage_times[j][a, b],
    the costs combined by `combine` (max or sum): the best value and each stage's first layer."""
    num_layers = stage_times[0].shape[0] - 1
    best = np.full(num_layers + 1, np.inf)  # over the stages placed so far, ending at each layer
    best[0] = 0.0
    back = []
    for times in stage_times:
        values = combine(best[:, None], times)  # [start, stop]
        choice = np.argmin(values, axis=0)
        best = values[choice, np.arange(num_layers + 1)]
        back.append(choice)
    if not np.isfinite(best[num_layers]):
        return float("inf"), []
    starts, stop = [], num_layers
    for choice in reversed(back):
        stop = int(choice[stop])
        starts.append(stop)
    return float(best[num_layers]), starts[::-1]


def _memory_overflow(setup: SolveSetup, stages: Sequence[StageChoice], p: int, chunks: int,
                     num_microbatches: int) -> str:
    """Why a submesh does not fit ("" when all do): each holds its chunks' state, temporaries and the
    activations of the microbatches its order keeps in flight (each chunk's peak, summed)."""
    table, n = setup.table, len(stages)
    need = np.zeros(p)
    for j, s in enumerate(stages):
        need[j % p] += table.stage_bytes(s, in_flight(j, n, num_microbatches, INTERLEAVED, chunks))
    worst = int(np.argmax(need))
    if need[worst] <= setup.memory_limit_bytes:
        return ""
    return (f"submesh {worst} needs {need[worst] / 2**30:.2f} GiB per device, over the limit of "
            f"{setup.memory_limit_bytes / 2**30:.2f} GiB")
