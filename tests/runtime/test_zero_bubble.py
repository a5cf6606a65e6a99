"""ZB-H1: each backward split into B (what the stage before waits for) and W (weight gradients only).

The split is read from the traced dataflow, the instruction lists keep 1F1B's peak of microbatches in
flight, the simulated bubble matches the published formula, the steps equal `jax.jit`'s, and the
solver prices the schedule (pinned, or searched with schedule="auto")."""

import dataclasses
from collections import Counter

import pytest

import alpaviz as av
from alpaviz.core.graph import input_gradient_nodes, weight_gradient_nodes
from alpaviz.core.plan import WEIGHT_GRAD, analyze
from alpaviz.core.plan._instructions import ONCE, build_instructions, interleave, max_live_microbatches
from alpaviz.core.plan._manual_plan import manual_plan
from alpaviz.core.plan._plan import Schedule, StageCost
from alpaviz.core.plan._simulate import predicted_timeline

from jit_steps import FAST_COMPILE, assert_steps_match, jit_steps

PIPELINES = [(1, 1), (1, 3), (2, 1), (2, 4), (4, 4), (4, 8), (3, 7), (4, 2)]


@pytest.mark.parametrize("n,m", PIPELINES, ids=[f"{n}stages-{m}mb" for n, m in PIPELINES])
def test_zb_h1_runs_f_then_b_then_w_of_every_microbatch_once_within_1f1b_peak(n, m):
    program = build_instructions("zb-h1", n, m)
    for i, lst in enumerate(program):
        runs = [(ins.role, ins.microbatch) for ins in lst if ins.op == "run"]
        assert Counter(runs) == Counter([(r, k) for r in ("forward", "backward", WEIGHT_GRAD) for k in range(m)]
                                        + [("update", ONCE)])
        for k in range(m):
            assert runs.index(("forward", k)) < runs.index(("backward", k)) < runs.index((WEIGHT_GRAD, k))
        # A microbatch's buffers are freed after its W, the last task that reads them.
        for j, ins in enumerate(lst):
            if ins.op == "free":
                assert lst[j - 1].op == "run" and lst[j - 1].role == WEIGHT_GRAD
        # Stage i delays its W's by i backwards: every stage holds up to n microbatches, 1F1B's peak.
        assert max_live_microbatches(lst) == min(n, m)
    one_f_one_b = build_instructions("1f1b", n, m)
    assert max(map(max_live_microbatches, program)) == max(map(max_live_microbatches, one_f_one_b))
    sends = sorted(ins.transfer_key for lst in program for ins in lst if ins.op == "send")
    assert sends == sorted(ins.transfer_key for lst in program for ins in lst if ins.op == "recv")
    interleave(program)  # one dispatch order exists: no deadlock


def _uniform(plan, fwd, bwd, weight_grad, upd):
    stages = tuple(dataclasses.replace(s, cost=StageCost(fwd, bwd, upd, fwd + bwd, 0.0, 0.0, 0.0,
                                                         weight_grad_s=weight_grad)) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


@pytest.fixture(scope="module")
def gpt4():
    step, params, batch = av.models.gpt(num_layers=4, hidden=32, abstract=True)
    return av.trace(step, params, batch)


@pytest.mark.parametrize("m", [4, 8, 16])
def test_simulated_bubbles_match_the_published_formulas(gpt4, m):
    """Uniform stages with F = B = W: 1F1B idles (p-1)/(m+p-1) of the step, ZB-H1 about a third of that."""
    p, t = 4, 1e-3
    bubbles, idle_s = {}, {}
    for kind in ("1f1b", "zb-h1"):
        plan = manual_plan(gpt4, av.Cluster.local(), stage_cuts=(1, 2, 3), schedule=Schedule(kind, m))
        timeline = predicted_timeline(_uniform(plan, t, 2 * t, t, 0.0))
        bubbles[kind] = timeline.bubble_fraction
        idle_s[kind] = timeline.total_s - 3 * m * t  # each stage's idle time: the step less its work
        runs = Counter(e.kind for e in timeline.events)
        assert runs["forward"] == p * m and runs["backward"] == p * m
        assert runs[WEIGHT_GRAD] == (p * m if kind == "zb-h1" else 0)
    assert bubbles["1f1b"] == pytest.approx((p - 1) / (m + p - 1), rel=0.05)
    # Qi et al.: ZB-H1's bubble is (p-1)(F + B - W) against 1F1B's (p-1)(F + B + W).
    zb_idle = (p - 1) * t
    assert bubbles["zb-h1"] == pytest.approx(zb_idle / (zb_idle + 3 * m * t), rel=0.05)
    assert idle_s["zb-h1"] == pytest.approx(idle_s["1f1b"] / 3, rel=0.05)


def test_the_split_keeps_in_b_exactly_what_the_stage_before_waits_for(gpt4):
    plan = manual_plan(gpt4, av.Cluster.local(), stage_cuts=(2,), schedule=Schedule("zb-h1", 2))
    flow = analyze(gpt4, plan)
    b, w = flow.task(1, "backward"), flow.task(1, WEIGHT_GRAD)
    assert b.nodes and w.nodes and not set(b.nodes) & set(w.nodes)
    own_backward = [n.name for n in gpt4.nodes if n.role == "backward" and n.layer >= 2]
    assert {n for n in w.nodes if gpt4.node(n).role == "backward"} == weight_gradient_nodes(gpt4, own_backward)
    # The gradient sent to stage 0 is made in B; W's results go to the update or stay on the stage.
    sent_back = {t for e in flow.edges if e.src_stage == 1 and e.src_role == "backward" for t in e.tensors}
    assert sent_back and sent_back <= set(b.outputs)
    assert not any(e.src_role == WEIGHT_GRAD and e.dst_role in ("forward", "backward") for e in flow.edges)
    # B reads nothing W makes: it can run first.
    assert not set(b.inputs) & set(w.outputs)
    # The first stage sends no gradient back: all its backward is W.
    assert not flow.task(0, "backward").nodes
    # Without zb-h1 the backward stays whole.
    whole = analyze(gpt4, manual_plan(gpt4, av.Cluster.local(), stage_cuts=(2,), schedule=Schedule("1f1b", 2)))
    assert WEIGHT_GRAD not in {t.role for t in whole.tasks}
    assert set(whole.task(1, "backward").nodes) == set(b.nodes) | set(w.nodes)


def test_a_recomputing_stage_keeps_its_backward_whole(gpt4):
    plan = manual_plan(gpt4, av.Cluster.local(), stage_cuts=(2,), schedule=Schedule("zb-h1", 2))
    plan = dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, remat=True) for s in plan.stages))
    flow = analyze(gpt4, plan)
    assert all(not flow.task(s, WEIGHT_GRAD).nodes for s in range(2))


def test_input_gradient_nodes_follow_dependencies_inside_the_group(gpt4):
    layer = [n.name for n in gpt4.nodes if n.layer == 2]
    needed = input_gradient_nodes(gpt4, layer)
    producer = {t: n.name for n in gpt4.nodes for t in n.outputs}
    for name in needed:  # closed under "depends on", inside the group
        for t in gpt4.node(name).inputs:
            if producer.get(t) in layer:
                assert producer[t] in needed
    w = weight_gradient_nodes(gpt4, layer)
    assert w and all(gpt4.node(n).role == "backward" for n in w)
    # The weight-gradient matmuls are W: about half the layer's backward FLOPs (dX and dW alike).
    backward = [n for n in layer if gpt4.node(n).role == "backward"]
    share = sum(gpt4.node(n).flops for n in w) / sum(gpt4.node(n).flops for n in backward)
    assert 0.3 < share < 0.6


STEPS = 3
CASES = [(2, 1), (2, 4), (4, 2), (4, 8)]


@pytest.fixture(scope="module")
def reference():
    step, params, batch = av.models.gpt(num_layers=4, hidden=32, seq_len=16, vocab=64, batch_size=16)
    return step, params, batch, av.trace(step, params, batch), jit_steps(step, params, batch, STEPS)


@pytest.mark.parametrize("n,m", CASES, ids=[f"{n}stages-{m}mb" for n, m in CASES])
def test_zb_h1_steps_equal_jit(reference, n, m):
    step, params, batch, graph, out = reference
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=tuple(range(1, n)), schedule=Schedule("zb-h1", m))
    parallel = av.parallelize(step, plan, compiler_options=FAST_COMPILE)
    assert_steps_match(parallel, params, batch, out)
    if n > 1:
        with pytest.raises(ValueError, match="zb-h1 splits each backward"):
            parallel.with_schedule("1f1b")


def test_the_solver_prices_zb_h1_and_auto_keeps_the_fastest_schedule(gpt4):
    cluster, cache = av.Cluster.a100_node(1), av.StageProfileCache()
    solve = lambda **kw: av.solve(gpt4, cluster=cluster, num_microbatches=8, progress=False, cache=cache,  # noqa
                                  pins=av.Pins(num_stages=4), **kw)
    plans = {kind: solve(schedule=kind) for kind in ("1f1b", "gpipe", "zb-h1")}
    zb = plans["zb-h1"]
    assert zb.schedule.kind == "zb-h1"
    assert [s.cost.memory.in_flight for s in zb.stages] == [4, 4, 4, 4]  # every stage holds n microbatches
    assert [s.cost.memory.in_flight for s in plans["1f1b"].stages] == [4, 3, 2, 1]
    assert zb.predicted.step_time_s == pytest.approx(predicted_timeline(zb, gpt4).total_s, rel=1e-9)
    assert any(s.cost.weight_grad_s > 0 for s in zb.stages)
    chosen = solve(schedule="auto")
    fastest = min(plans, key=lambda k: plans[k].predicted.step_time_s)
    assert chosen.schedule.kind == fastest
    assert chosen.predicted.step_time_s == pytest.approx(plans[fastest].predicted.step_time_s, rel=1e-9)
    note = next(n for n in chosen.solver.notes if n.startswith("schedule:"))
    assert f"{fastest} chosen" in note and all(kind in note for kind in plans)
    # A pinned schedule wins over the option, and round-trips through JSON.
    pins = av.Pins(num_stages=4).with_schedule("gpipe")
    assert av.Pins.from_json(pins.to_json()) == pins and "schedule gpipe" in pins.describe()
    pinned = av.solve(gpt4, cluster=cluster, num_microbatches=8, progress=False, cache=cache, pins=pins,
                      schedule="zb-h1")
    assert pinned.schedule.kind == "gpipe"


def test_bad_schedules_are_clear_errors():
    with pytest.raises(ValueError, match="pinned schedule must be one of .*zb-h1"):
        av.Pins(schedule="zigzag")
    with pytest.raises(ValueError, match="schedule kind must be one of"):
        av.SolveOptions(schedule="zb-h2")
