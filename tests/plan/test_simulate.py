"""The step simulator on hand-built cases: devices that share a host's cores, and transfers that share a link."""

import dataclasses

import pytest

import alpaviz as av
from alpaviz.core.plan._instructions import Edge, Instruction, build_instructions
from alpaviz.core.plan._shared_hardware import SharedHardware, matmul_equivalent
from alpaviz.core.plan._simulate import simulate


def _cluster(num_hosts: int, per_host: int, speedup=(), launch_s: float = 0.0, by_size=(),
             rate_curve=()) -> av.Cluster:
    base = av.Cluster.local()
    device = dataclasses.replace(base.device, launch_s=launch_s, rate_curve=rate_curve)
    return av.Cluster(num_hosts, per_host, device, base.intra_host, base.inter_host, busy_speedup=speedup,
                      busy_speedup_by_size=by_size)


def _run(stage: int, role: str = "forward") -> Instruction:
    return Instruction("run", stage, role, 0)


def _end(program, run_s, transfer_s=None, shared=None) -> float:
    return simulate(program, run_s, transfer_s or {}, "1f1b", 1, shared=shared).total_s


def test_two_stages_sharing_one_core_run_at_half_rate():
    # one core, two devices: a device alone runs twice as fast as each of two busy ones (the priced rate)
    shared = SharedHardware.of(_cluster(1, 2, speedup=(2.0, 1.0)), [(0,), (1,)])
    program = ((_run(0),), (_run(1),))
    assert _end(program, {(0, "forward"): 1.0, (1, "forward"): 1.0}, shared=shared) == pytest.approx(1.0)
    assert _end(((_run(0),), ()), {(0, "forward"): 1.0}, shared=shared) == pytest.approx(0.5)
    # once the shorter finishes, the longer has the core to itself: 1 s together, then 1 s of work at 2x
    timeline = simulate(program, {(0, "forward"): 1.0, (1, "forward"): 2.0}, {}, "1f1b", 1, shared=shared)
    ends = sorted(e.end_s for e in timeline.events)
    assert ends == pytest.approx([1.0, 1.5])
    # devices that share nothing (the default, GPUs) run at the priced rate whatever else is busy
    assert _end(program, {(0, "forward"): 1.0, (1, "forward"): 2.0},
                shared=SharedHardware.of(_cluster(1, 2), [(0,), (1,)])) == pytest.approx(2.0)


def test_a_pipeline_with_idle_stages_gives_the_busy_stage_the_cores():
    # four stages of one device each on a host whose cores four busy devices share evenly
    shared = SharedHardware.of(_cluster(1, 4, speedup=(4.0, 2.0, 4 / 3, 1.0)), [(d,) for d in range(4)])
    program = build_instructions("1f1b", 4, 1)  # one microbatch: only one stage works at a time
    run_s = {(s, role): t for s in range(4) for role, t in (("forward", 1.0), ("backward", 2.0))}
    assert _end(program, run_s) == pytest.approx(12.0)  # priced at the all-busy rate
    assert _end(program, run_s, shared=shared) == pytest.approx(3.0)  # each task runs alone, 4x faster


def test_a_stage_of_small_operators_gains_less_from_the_idle_cores():
    # alone on the host, work the size of a 1 MFLOP matmul runs 2x, of a 100 MFLOP one 4x
    cluster = _cluster(1, 2, speedup=(4.0, 1.0), by_size=((1e6, (2.0, 1.0)), (1e8, (4.0, 1.0))))
    alone = ((_run(0),), ())
    for flops, expected in ((1e6, 0.5), (1e8, 0.25), (1e7, 1 / 3), (1e4, 0.5), (None, 0.25)):
        shared = SharedHardware.of(cluster, [(0,), (1,)], (flops, flops))
        assert _end(alone, {(0, "forward"): 1.0}, shared=shared) == pytest.approx(expected)
    # both busy: the priced (all-busy) rate whatever the size
    both = ((_run(0),), (_run(1),))
    shared = SharedHardware.of(cluster, [(0,), (1,)], (1e6, 1e8))
    assert _end(both, {(0, "forward"): 1.0, (1, "forward"): 1.0}, shared=shared) == pytest.approx(1.0)


def test_a_plans_stages_run_like_the_matmul_of_their_priced_rate():
    # the rate curve read backwards: a stage priced at 60% of the peak runs like a 1e7-FLOP matmul here
    cluster = _cluster(1, 8, speedup=(8.0,) + (1.0,) * 7, rate_curve=((1e6, 0.2), (1e8, 1.0)),
                       by_size=((1e6, (2.0,) + (1.0,) * 7), (1e8, (8.0,) + (1.0,) * 7)))
    exact, peak = av.CostModel(compute_efficiency=1.0), cluster.device.peak_flops
    assert matmul_equivalent(cluster.device, exact, 0.6 * peak) == pytest.approx(1e7)
    assert matmul_equivalent(cluster.device, exact, 0.05 * peak) == pytest.approx(1e6)  # past the ends: end sizes
    assert matmul_equivalent(cluster.device, exact, 2.0 * peak) == pytest.approx(1e8)
    # the cost model's own efficiency is part of the rate it prices: at half, 0.3 of the peak is 0.6 of its rate
    assert matmul_equivalent(cluster.device, av.CostModel(compute_efficiency=0.5), 0.3 * peak) == pytest.approx(1e7)
    assert matmul_equivalent(_cluster(1, 2).device, exact, 0.5 * peak) is None  # no curve: size unknown
    step, params, batch = av.models.gpt(num_layers=2, hidden=64, seq_len=8, vocab=64, batch_size=8)
    plan = av.solve(step, params, batch, cluster=cluster, progress=False,
                    pins=av.Pins(num_stages=2, stage_submeshes=((0, (1, 4)), (1, (1, 4)))))
    shared = SharedHardware.of_plan(plan)
    rate = cluster.device.peak_flops * plan.cost_model.compute_efficiency
    for stage, flops in zip(plan.stages, shared.stage_flops):
        layers = [plan.layers[i] for i in stage.layers]
        achieved = sum(la.flops for la in layers) / 4 / sum(la.compute_s for la in layers) / rate
        assert cluster.device.rate_share(flops) == pytest.approx(min(max(achieved, 0.2), 1.0), rel=1e-6)


def test_a_link_shared_by_two_transfers_halves_each():
    # stages 0 and 1 on host 0 both send to stage 2 on host 1 at once: host 0's way out is shared
    edges = (Edge(0, "forward", 2, "forward", 1.0), Edge(1, "forward", 2, "forward", 1.0))
    program = build_instructions("gpipe", 3, 1, edges)
    transfer_s = {(0, "forward", 2, "forward"): 1.0, (1, "forward", 2, "forward"): 1.0}
    shared = SharedHardware.of(_cluster(2, 2), [(0,), (1,), (2, 3)])
    timeline = simulate(program, {}, transfer_s, "gpipe", 1, shared=shared)
    sends = [e for e in timeline.events if e.kind == "send"]
    assert len(sends) == 2 and all(e.duration_s == pytest.approx(2.0) for e in sends)
    assert _end(program, {}, transfer_s) == pytest.approx(1.0)  # unshared: both at full rate
    # inside one host each pair of devices has its own path
    inside = SharedHardware.of(_cluster(1, 4), [(0,), (1,), (2, 3)])
    assert _end(program, {}, transfer_s, shared=inside) == pytest.approx(1.0)


def test_every_executable_pays_the_launch_cost():
    shared = SharedHardware.of(_cluster(1, 2, launch_s=0.25), [(0,), (1,)])
    program = build_instructions("1f1b", 2, 3)
    run_s = {(s, role): 1.0 for s in range(2) for role in ("forward", "backward")}
    unlaunched = _end(program, run_s)
    # 2 stages x 3 microbatches x (forward + backward); the critical path has m + n - 1 = 4 of each
    assert unlaunched == pytest.approx(8.0)
    # each of the 8 pays 0.25 s but the last stage's backwards, which run fused with their forwards
    # (S0: F0 F1 B0 F2 B1 B2 with F2 and B1 waiting on the last stage): 6 launches on the critical path
    assert _end(program, run_s, shared=shared) == pytest.approx(8.0 + 6 * 0.25)


def test_lists_that_deadlock_are_refused():
    program = ((Instruction("recv", 0, "forward", 0, 1, "forward"),), ())
    with pytest.raises(ValueError, match="deadlock"):
        simulate(program, {}, {}, "1f1b", 1)


def test_a_backward_fused_with_its_forward_launches_nothing_and_skips_the_recompute():
    from alpaviz.core.plan._simulate import FUSED_BACKWARD

    # 1F1B over two stages: the last stage runs each forward right before its backward (one executable)
    program = build_instructions("1f1b", 2, 2)
    run_s = {(s, role): 1.0 for s in range(2) for role in ("forward", "backward")}
    shared = SharedHardware.of(_cluster(1, 2, launch_s=0.25), [(0,), (1,)])
    timeline = simulate(program, run_s, {}, "1f1b", 2, shared=shared)
    last = sorted((e for e in timeline.events if e.stage == 1), key=lambda e: e.start_s)
    assert [round(e.duration_s, 9) for e in last] == [1.25, 1.0, 1.25, 1.0]  # only the forward launches
    first = [e for e in timeline.events if e.stage == 0 and e.kind == "backward"]
    assert all(e.duration_s == pytest.approx(1.25) for e in first)  # unfused: its own launch
    # a recomputing stage's fused backward does not run the forward again; an unfused one does
    recomputing = {**run_s, (0, "backward"): 2.0, (1, "backward"): 2.0, (0, FUSED_BACKWARD): 1.0,
                   (1, FUSED_BACKWARD): 1.0}
    timeline = simulate(program, recomputing, {}, "1f1b", 2)
    assert {round(e.duration_s, 9) for e in timeline.events if e.stage == 1 and e.kind == "backward"} == {1.0}
    assert {round(e.duration_s, 9) for e in timeline.events if e.stage == 0 and e.kind == "backward"} == {2.0}
