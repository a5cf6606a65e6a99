import dataclasses
from collections import Counter

import pytest

import alpaviz as av
from alpaviz.core.plan._manual_plan import UNKNOWN_COSTS_NOTE, manual_plan
from alpaviz.core.plan._plan import Schedule, StageCost
from alpaviz.core.plan._instructions import (
    ONCE, Edge, build_instructions, compute_order, interleave, max_live_microbatches,
)
from alpaviz.core.plan._simulate import plan_program, predicted_timeline, simulate

PIPELINES = [(2, 4), (4, 4), (4, 8), (3, 7), (4, 2)]


@pytest.mark.parametrize("n,m", PIPELINES, ids=[f"{n}stages-{m}mb" for n, m in PIPELINES])
def test_1f1b_holds_at_most_num_stages_minus_index_microbatches(n, m):
    program = build_instructions("1f1b", n, m)
    for i, lst in enumerate(program):
        assert max_live_microbatches(lst) == min(n - i, m) <= n


@pytest.mark.parametrize("n,m", PIPELINES, ids=[f"{n}stages-{m}mb" for n, m in PIPELINES])
def test_gpipe_holds_every_microbatch(n, m):
    program = build_instructions("gpipe", n, m)
    assert all(max_live_microbatches(lst) == m for lst in program)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("n,m", PIPELINES, ids=[f"{n}stages-{m}mb" for n, m in PIPELINES])
def test_every_task_runs_once_and_every_send_has_its_recv(kind, n, m):
    program = build_instructions(kind, n, m)
    for i, lst in enumerate(program):
        runs = Counter((ins.role, ins.microbatch) for ins in lst if ins.op == "run")
        expected = {(r, k) for r in ("forward", "backward") for k in range(m)} | {("update", ONCE)}
        assert set(runs) == expected and set(runs.values()) == {1}
        assert lst[-1].op == "run" and lst[-1].role == "update"
    sends = [ins.transfer_key for lst in program for ins in lst if ins.op == "send"]
    recvs = [ins.transfer_key for lst in program for ins in lst if ins.op == "recv"]
    assert sorted(sends) == sorted(recvs) and len(sends) == 2 * (n - 1) * m
    seen = set()
    for ins in interleave(program):
        if ins.op == "send":
            seen.add(ins.transfer_key)
        if ins.op == "recv":
            assert ins.transfer_key in seen


@pytest.mark.parametrize("n,m", PIPELINES, ids=[f"{n}stages-{m}mb" for n, m in PIPELINES])
def test_1f1b_warms_up_with_n_minus_i_minus_1_forwards(n, m):
    for i in range(n):
        order = compute_order("1f1b", n, m, i)
        first_backward = order.index(("backward", 0))
        warm = min(n - i - 1, m)
        assert order[:warm] == tuple(("forward", k) for k in range(warm))
        assert first_backward == min(warm + 1, m)  # warm-up, then one steady forward when one is left


def test_an_edge_into_the_update_is_sent_once_after_the_last_microbatch():
    edges = (Edge(1, "backward", 0, "update"),)
    program = build_instructions("1f1b", 2, 3, edges)
    sends = [ins for ins in program[1] if ins.op == "send"]
    assert len(sends) == 1 and sends[0].microbatch == ONCE
    last_backward = max(i for i, ins in enumerate(program[1]) if ins.op == "run" and ins.role == "backward")
    assert program[1].index(sends[0]) == last_backward + 1
    recv = next(ins for ins in program[0] if ins.op == "recv")
    assert program[0].index(recv) == len(program[0]) - 2  # right before RUN update


def test_unknown_schedule_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown schedule kind 'zigzag'"):
        build_instructions("zigzag", 2, 2)


@pytest.fixture(scope="module")
def gpt4():
    step, params, batch = av.models.gpt(num_layers=4, hidden=32, abstract=True)
    return av.trace(step, params, batch)


def _with_costs(plan, fwd, bwd, upd):
    stages = tuple(
        dataclasses.replace(s, cost=StageCost(fwd, bwd, upd, fwd + bwd, 0.0, 0.0, 0.0)) for s in plan.stages
    )
    return dataclasses.replace(plan, stages=stages)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("n,m", [(2, 4), (4, 4), (4, 6)], ids=["2x4", "4x4", "4x6"])
def test_predicted_timeline_matches_the_pipeline_formula(gpt4, kind, n, m):
    cuts = tuple(range(1, n))
    plan = manual_plan(gpt4, av.Cluster.local(), stage_cuts=cuts, schedule=Schedule(kind, m))
    assert plan.solver.status == "pinned" and UNKNOWN_COSTS_NOTE in plan.solver.notes
    fwd, bwd, upd = 1e-3, 2e-3, 5e-4
    timeline = predicted_timeline(_with_costs(plan, fwd, bwd, upd))
    assert timeline.source == "predicted" and timeline.num_stages == n
    # Uniform stages: (m + n - 1) * (t_f + t_b) for GPipe and 1F1B, then the update.
    assert timeline.total_s == pytest.approx((m + n - 1) * (fwd + bwd) + upd)
    runs = Counter(e.kind for e in timeline.events if e.kind not in ("send", "recv"))
    assert runs == {"forward": n * m, "backward": n * m, "update": n}
    assert timeline.bubble_fraction == pytest.approx(
        1 - (m * (fwd + bwd) + upd) / timeline.total_s
    )


def test_predicted_timeline_plays_every_second_the_plan_prices_once(gpt4):
    from alpaviz.core.inter_op._stage_cost import analytic_stage_cost

    m = 4
    pins = av.Pins(num_stages=4)
    for stage in range(4):
        pins = pins.with_submesh(stage, (1, 1))
    cluster = av.Cluster.a100_node(2, 2)  # the cut before stage 2 crosses hosts
    plan = av.solve(gpt4, cluster=cluster, pins=pins, num_microbatches=m, progress=False, stage_cost=analytic_stage_cost)
    assert plan.stages[2].cost.recv_forward_s > plan.stages[1].cost.recv_forward_s > 0
    timeline = predicted_timeline(plan, gpt4)
    assert timeline.hardware == cluster.name
    for stage in plan.stages:
        c = stage.cost
        runs = sum(e.duration_s for e in timeline.events if e.stage == stage.index and e.kind not in ("send", "recv"))
        assert runs == pytest.approx(m * (c.microbatch_s - c.recv_forward_s - c.recv_backward_s)
                                     + c.update_s - c.recv_update_s)
    # What a stage is charged for receiving is played once, as its senders' sends; transfers that
    # cross the hosts' network link at once share it, which stretches them.
    sends = sum(e.duration_s for e in timeline.events if e.kind == "send")
    charged = sum(m * (s.cost.recv_forward_s + s.cost.recv_backward_s) + s.cost.recv_update_s for s in plan.stages)
    assert sends >= charged * (1 - 1e-9)
    unshared = simulate(*plan_program(plan, gpt4), plan.schedule.kind, m)  # nothing shared
    assert sum(e.duration_s for e in unshared.events if e.kind == "send") == pytest.approx(charged)
    # The plan's price is this simulation: one number for the plan, its header and its Gantt chart.
    assert plan.predicted.step_time_s == pytest.approx(timeline.total_s, rel=1e-12)
    p = plan.predicted
    assert p.compute_s + p.communication_s + p.resharding_s + p.cross_stage_s + p.bubble_s == pytest.approx(
        p.step_time_s)
