"""The step simulator chooses among the stage DP's layouts, skipping only those that cannot win."""

import pytest

import alpaviz as av
from alpaviz.core.inter_op._assemble import assemble_plan
from alpaviz.core.inter_op._options import SolveOptions
from alpaviz.core.inter_op._prepare import prepare
from alpaviz.core.inter_op._simulated_choice import fastest_simulated, work_bound_s
from alpaviz.core.inter_op._stage_dp import solve_stages


@pytest.fixture(scope="module")
def graph():
    step, params, batch = av.models.gpt(num_layers=4, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=8)
    return av.trace(step, params, batch)


@pytest.mark.parametrize("cluster", [av.Cluster.local(), av.Cluster.a100_node(1, 4)], ids=["cpu", "a100"])
def test_the_work_bound_is_below_every_simulated_step_and_the_choice_is_the_least(graph, cluster):
    B = 4
    setup = prepare(graph, cluster=cluster, options=SolveOptions(num_microbatches=B, progress=False))
    proposals = solve_stages(setup.table, cluster.num_devices, B, proposals=8).proposals()
    assert len(proposals) > 1
    assemble = lambda p: assemble_plan(setup, p, av.Pins(), B, "1f1b", 0.0, ())  # noqa: E731
    simulated = [assemble(p).predicted.step_time_s for p in proposals]
    for proposal, step in zip(proposals, simulated):
        assert 0 < work_bound_s(setup, proposal, B) <= step
    chosen, (note,) = fastest_simulated(setup, proposals, B, assemble)
    assert chosen.predicted.step_time_s == min(simulated)
    assert "the plan is the fastest" in note
