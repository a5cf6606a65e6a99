"""Interleaved 1F1B: v stages (model chunks) per submesh, stage j on submesh j mod p.

One instruction list per submesh orders its chunks; the simulated bubble matches the published
formula; the steps equal `jax.jit`'s; the chunk cuts are the brute-force optimum; the solver
re-cuts its 1F1B layouts into chunks, prices them by simulation and keeps the pins; bad
input is a clear error."""

import dataclasses
import itertools
import types
from collections import Counter

import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.inter_op._interleave import chunk_cuts
from alpaviz.core.inter_op._stage_dp import MeshChoice, StageConstraints, StageCostTable
from alpaviz.core.plan import INTERLEAVED, Plan, predicted_timeline
from alpaviz.core.plan._instructions import build_instructions, interleave, max_live_microbatches
from alpaviz.core.plan._manual_plan import manual_plan
from alpaviz.core.plan._plan import Schedule, StageCost
from alpaviz.widgets._figures import gantt_figure
from alpaviz.widgets._timeline_view import gantt_bars, timeline_panel

from jit_steps import FAST_COMPILE, assert_steps_match, jit_steps

ORDERS = [(2, 2, 2), (2, 2, 4), (2, 3, 6), (4, 2, 4), (4, 2, 8), (4, 4, 8), (3, 2, 9), (8, 2, 16)]


@pytest.mark.parametrize("p,v,m", ORDERS, ids=[f"{p}meshes-{v}chunks-{m}mb" for p, v, m in ORDERS])
def test_each_submesh_runs_its_chunks_forward_before_backward_without_deadlock(p, v, m):
    program = build_instructions(INTERLEAVED, p * v, m, chunks=v)
    assert len(program) == p
    for d, lst in enumerate(program):
        assert {ins.stage for ins in lst} == set(range(d, p * v, p))  # stage j on submesh j mod p
        runs = [(ins.stage, ins.role, ins.microbatch) for ins in lst if ins.op == "run"]
        expected = [(j, r, k) for j in range(d, p * v, p) for r in ("forward", "backward") for k in range(m)]
        assert Counter(runs) == Counter(expected + [(j, "update", -1) for j in range(d, p * v, p)])
        for j, k in itertools.product(range(d, p * v, p), range(m)):
            assert runs.index((j, "forward", k)) < runs.index((j, "backward", k))
        # a submesh holds more than 1F1B's stage d would, up to every microbatch of every chunk
        assert max_live_microbatches(lst) <= m * v
    sends = sorted(ins.transfer_key for lst in program for ins in lst if ins.op == "send")
    assert sends == sorted(ins.transfer_key for lst in program for ins in lst if ins.op == "recv")
    interleave(program)  # a dispatch order exists: no deadlock


def test_the_first_submesh_holds_the_published_warm_up():
    """Submesh d warms up with 2(p - d - 1) + (v - 1)p forwards and then holds one more."""
    p, v, m = 4, 2, 8
    program = build_instructions(INTERLEAVED, p * v, m, chunks=v)
    assert [max_live_microbatches(lst) for lst in program] == [2 * (p - d - 1) + (v - 1) * p + 1 for d in range(p)]


@pytest.fixture(scope="module")
def gpt8():
    step, params, batch = av.models.gpt(num_layers=8, hidden=32, abstract=True)
    return av.trace(step, params, batch)


def _uniform(plan: Plan, fwd: float, bwd: float) -> Plan:
    cost = StageCost(fwd, bwd, 0.0, fwd + bwd, 0.0, 0.0, 0.0)
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, cost=cost) for s in plan.stages))


@pytest.mark.parametrize("m", [4, 8, 16])
def test_the_simulated_bubble_shrinks_by_the_chunk_count(gpt8, m):
    """Uniform pipeline of 4 submeshes: 1F1B idles (p-1)/(m+p-1); two chunks per submesh, each half the
    work, idle (p-1)/v / (m + (p-1)/v) (Narayanan et al. 2021)."""
    p, t, cluster = 4, 1e-3, av.Cluster.a100_node(1)
    bubbles = {}
    for v in (1, 2):
        kind = INTERLEAVED if v > 1 else "1f1b"
        n = p * v
        plan = manual_plan(gpt8, cluster, stage_cuts=tuple(range(8 // n, 8, 8 // n)), schedule=Schedule(kind, m, chunks=v))
        timeline = predicted_timeline(_uniform(plan, t / v, 2 * t / v))
        assert timeline.num_stages == p and timeline.chunks == v
        bubbles[v] = timeline.bubble_fraction
    assert bubbles[1] == pytest.approx((p - 1) / (m + p - 1), rel=0.05)
    assert bubbles[2] == pytest.approx((p - 1) / 2 / (m + (p - 1) / 2), rel=0.05)


def test_the_timeline_draws_submeshes_with_each_bar_naming_its_chunk(gpt8):
    plan = manual_plan(gpt8, av.Cluster.a100_node(1), stage_cuts=(2, 4, 6), schedule=Schedule(INTERLEAVED, 2, chunks=2))
    timeline = predicted_timeline(_uniform(plan, 1e-3, 2e-3))
    bars = gantt_bars(timeline)
    assert {(b.stage, b.chunk) for b in bars} == {(d, c) for d in range(2) for c in range(2)}
    assert {b.label for b in bars if b.kind == "forward"} == {f"F{k}·{c}" for k in range(2) for c in range(2)}
    fig = gantt_figure(timeline_panel(timeline, "predicted"))
    assert {y for trace in fig.data for y in trace.y} >= {"submesh 0", "submesh 1"}


STEPS = 3
CASES = [(2, 2, 2), (2, 2, 4), (4, 2, 4), (4, 2, 8)]


@pytest.fixture(scope="module")
def reference():
    step, params, batch = av.models.gpt(num_layers=8, hidden=32, seq_len=16, vocab=64, batch_size=16)
    return step, params, batch, av.trace(step, params, batch), jit_steps(step, params, batch, STEPS)


@pytest.mark.parametrize("p,v,m", CASES, ids=[f"{p}meshes-{v}chunks-{m}mb" for p, v, m in CASES])
def test_interleaved_steps_equal_jit(reference, p, v, m):
    step, params, batch, graph, out = reference
    n = p * v
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=tuple(range(8 // n, 8, 8 // n)),
                       schedule=Schedule(INTERLEAVED, m, chunks=v))
    assert [s.device_ids for s in plan.stages[p:]] == [s.device_ids for s in plan.stages[:p]] * (v - 1)
    parallel = av.parallelize(step, plan, compiler_options=FAST_COMPILE, record_trace=True)
    assert_steps_match(parallel, params, batch, out)
    measured = parallel.last_trace()
    assert measured.num_stages == p and measured.chunks == v
    assert Counter((e.stage, e.chunk) for e in measured.events if e.kind == "forward") == {
        (d, c): m for d in range(p) for c in range(v)}
    with pytest.raises(ValueError, match="places the stages on other devices"):
        parallel.with_schedule("1f1b")


def _table(rng, num_layers: int, meshes: int) -> StageCostTable:
    """Random additive layer costs per mesh choice (each of 2 devices on one host)."""
    per_layer = rng.uniform(0.5, 2.0, size=(num_layers, meshes))
    shape = (num_layers + 1, num_layers + 1, meshes)
    time_s = np.full(shape, np.inf)
    for a in range(num_layers):
        for b in range(a + 1, num_layers + 1):
            time_s[a, b] = per_layer[a:b].sum(axis=0) + rng.uniform(0, 0.3, meshes)
    zeros = np.zeros(shape)
    return StageCostTable(meshes=tuple(MeshChoice((1, 2), (2, 1)) for _ in range(meshes)), time_s=time_s,
                          update_s=zeros, state_bytes=zeros, activation_bytes=zeros)


@pytest.mark.parametrize("seed", range(6))
def test_chunk_cuts_are_the_brute_force_optimum_and_keep_the_pinned_cut(seed):
    rng = np.random.default_rng(seed)
    num_layers, meshes, v = 8, [0, 1], 2
    table = _table(rng, num_layers, 2)
    setup = types.SimpleNamespace(table=table)
    n = len(meshes) * v

    def key(cuts):
        bounds = (0, *cuts, num_layers)
        times = [table.time_s[a, b, meshes[j % 2]] for j, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return max(times), sum(times)

    for pinned in ((), (3,)):
        found = chunk_cuts(setup, meshes, v, StageConstraints(required_cuts=pinned))
        cuts = tuple(s.start for s in found[1:])
        options = [c for c in itertools.combinations(range(1, num_layers), n - 1) if set(pinned) <= set(c)]
        best = min(options, key=key)
        assert key(cuts) == pytest.approx(key(best), rel=1e-9)
        assert set(pinned) <= set(cuts)
        assert [s.mesh for s in found] == [meshes[j % 2] for j in range(n)]


@pytest.fixture(scope="module")
def gpt350m():
    step, params, batch = av.models.gpt("350M", batch_size=8, abstract=True, dtype=jax.numpy.float16)
    return av.trace(step, params, batch)


def test_the_solver_interleaves_its_layouts_and_auto_weighs_interleaving(gpt350m):
    graph, cache = gpt350m, av.StageProfileCache()
    common = dict(cluster=av.Cluster.a100_node(1), num_microbatches=8, cache=cache, progress=False)
    plan = av.solve(graph, schedule=INTERLEAVED, pins=av.Pins(num_stages=8), **common)
    assert plan.schedule.kind == INTERLEAVED and plan.num_stages == 8 and plan.schedule.chunks > 1
    p = plan.num_submeshes
    assert [s.device_ids for s in plan.stages] == [plan.stages[j % p].device_ids for j in range(8)]
    timeline = predicted_timeline(plan, graph)
    assert plan.predicted.step_time_s == pytest.approx(timeline.total_s, rel=1e-9)
    lists = build_instructions(INTERLEAVED, 8, 8, chunks=plan.schedule.chunks)
    assert [s.cost.memory.in_flight for s in plan.stages] == [
        max_live_microbatches(lists[j % p], j) for j in range(8)]
    assert plan.predicted.max_memory_bytes == pytest.approx(
        max(sum(s.cost.memory_bytes for s in plan.stages[d::p]) for d in range(p)))
    assert any(note.startswith("interleaved 1F1B: ") for note in plan.solver.notes)
    assert av.Plan.from_json(plan.to_json()) == plan
    # The same four submeshes as a pinned 1F1B pipeline: two chunks each shrink its bubble.
    cuts = av.Pins(stage_cuts=(6, 12, 18), num_stages=4)
    one_f_one_b = av.solve(graph, pins=cuts, **common)
    pinned_cut = av.solve(graph, schedule=INTERLEAVED, pins=av.Pins(stage_cuts=(12,), num_stages=8), **common)
    assert 12 in pinned_cut.stage_cuts and pinned_cut.num_stages == 8
    assert predicted_timeline(plan, graph).bubble_fraction < predicted_timeline(one_f_one_b, graph).bubble_fraction
    chosen = av.solve(graph, schedule="auto", **common)
    note = next(n for n in chosen.solver.notes if n.startswith("schedule:"))
    assert INTERLEAVED in note
    tried = {kind: av.solve(graph, schedule=kind, **common).predicted.step_time_s
             for kind in ("1f1b", "gpipe", "zb-h1", INTERLEAVED)}
    assert chosen.predicted.step_time_s == pytest.approx(min(tried.values()), rel=1e-9)


def test_bad_interleavings_are_clear_errors(gpt8):
    with pytest.raises(ValueError, match="interleaved 1F1B runs 2 or more chunks"):
        Schedule("1f1b", 4, chunks=2)
    with pytest.raises(ValueError, match="interleaved 1F1B runs 2 or more chunks"):
        Schedule(INTERLEAVED, 4)
    with pytest.raises(ValueError, match="not a multiple: use 4"):
        build_instructions(INTERLEAVED, 4, 3, chunks=2)
    cluster = av.Cluster.a100_node(1)
    plan = manual_plan(gpt8, cluster, stage_cuts=(2, 4, 6), schedule=Schedule(INTERLEAVED, 2, chunks=2))
    moved = dataclasses.replace(plan.stages[2], device_ids=tuple(range(4, 8)))
    with pytest.raises(ValueError, match="stage 2 is chunk 1 of submesh 0 .* runs on stage 0's devices"):
        dataclasses.replace(plan, stages=(*plan.stages[:2], moved, plan.stages[3]))
    with pytest.raises(ValueError, match="interleaved 1F1B found no layout: .*not a multiple"):
        av.solve(gpt8, cluster=cluster, num_microbatches=3, schedule=INTERLEAVED, progress=False,
                 pins=av.Pins(num_stages=4))
