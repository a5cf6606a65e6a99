"""The stage DP against brute force on synthetic cost tables (no ILP needed)."""

import itertools
import math

import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.inter_op._stage_dp import (
    NoStagePlanError, StageChoice, StageConstraints, StageCostTable, in_flight, is_feasible,
    pipeline_latency, solve_stages, stage_offsets,
)
from alpaviz.core.inter_op._stage_profile import mesh_choices


def _random_table(num_layers, cluster, seed, additive=False):
    rng = np.random.default_rng(seed)
    meshes = mesh_choices(cluster)
    shape = (num_layers + 1, num_layers + 1, len(meshes))
    devices = np.array([m.num_devices for m in meshes], float)
    if additive:
        per_layer = rng.uniform(0.5, 2.0, (num_layers, 1)) / devices[None, :] ** rng.uniform(0.5, 1.0)
        prefix = np.concatenate([np.zeros((1, len(meshes))), np.cumsum(per_layer, axis=0)])
        time = prefix[None] - prefix[:, None] + 0.05
    else:
        time = rng.uniform(0.1, 3.0, shape) / devices[None, None, :] ** 0.7
    update = rng.uniform(0.0, 0.2, shape)
    state = rng.uniform(1.0, 4.0, shape) * (np.arange(num_layers + 1)[None, :, None] - np.arange(num_layers + 1)[:, None, None])
    state = state / devices[None, None, :]
    act = rng.uniform(0.1, 1.0, shape)
    temp = rng.uniform(0.0, 1.5, shape)  # the largest operator's working set: a stage's max, not a sum
    valid = np.triu(np.ones(shape[:2], bool), k=1)[:, :, None]
    finish = lambda a: np.where(valid, a, np.inf)  # noqa: E731
    # A cut's transfers: dearer across hosts than inside one; placement rules on for several hosts.
    cut_in = rng.uniform(0.0, 0.3, (1, num_layers + 1)) * np.array([[1.0], [4.0]])
    cut_back = rng.uniform(0.0, 0.3, (1, num_layers + 1)) * np.array([[1.0], [4.0]])
    cut_in[:, 0] = cut_back[:, num_layers] = 0.0
    return StageCostTable(meshes, finish(time), finish(update), finish(state), finish(act),
                          temp_bytes=finish(temp), cut_in_s=cut_in, cut_back_s=cut_back,
                          devices_per_host=cluster.devices_per_host if cluster.num_hosts > 1 else None)


def _brute_force(table, num_devices, B, schedule, limit, constraints=StageConstraints()):
    L = table.num_layers
    best = math.inf
    allowed = dict(constraints.stage_meshes)
    for r in range(L):
        for cuts in itertools.combinations(range(1, L), r):
            if any(c not in cuts for c in constraints.required_cuts if 0 < c < L):
                continue
            if any(c in cuts for c in constraints.forbidden_cuts):
                continue
            n = r + 1
            if constraints.num_stages is not None and n != constraints.num_stages:
                continue
            if allowed and n <= max(allowed):  # a pinned stage must exist
                continue
            bounds = (0, *cuts, L)
            for meshes in itertools.product(range(len(table.meshes)), repeat=n):
                if sum(table.meshes[m].num_devices for m in meshes) != num_devices:
                    continue
                if any(i in allowed and m not in allowed[i] for i, m in enumerate(meshes)):
                    continue
                ok, times, updates = True, [], []
                firsts = np.cumsum([0] + [table.meshes[m].num_devices for m in meshes[:-1]])
                for i, m in enumerate(meshes):
                    k, j = bounds[i], bounds[i + 1]
                    if not table.placeable(int(firsts[i]), table.meshes[m].num_devices):
                        ok = False
                        break
                    q = in_flight(i, n, B, schedule)
                    need = table.state_bytes[k, j, m] + q * table.activation_bytes[k, j, m] + table.temp_bytes[k, j, m]
                    if need > limit:
                        ok = False
                        break
                    times.append(table.stage_time(StageChoice(k, j, m), int(firsts[i])))
                    updates.append(table.update_s[k, j, m])
                if ok:
                    best = min(best, pipeline_latency(times, updates, B))
    return best


def _objective_of(solution, table, B):
    firsts = stage_offsets(table, solution.stages)
    times = [table.stage_time(s, first) for s, first in zip(solution.stages, firsts)]
    updates = [table.update_s[s.start, s.stop, s.mesh] for s in solution.stages]
    return pipeline_latency(times, updates, B)


CASES = {
    "1host-4dev-1f1b": (av.Cluster.a100_node(1, 4), 4, 4, "1f1b", math.inf),
    "1host-4dev-gpipe-tight": (av.Cluster.a100_node(1, 4), 4, 3, "gpipe", 6.0),
    "1host-4dev-1f1b-tight": (av.Cluster.a100_node(1, 4), 4, 8, "1f1b", 4.0),
    "2hosts-2dev": (av.Cluster.a100_node(2, 2), 4, 2, "1f1b", math.inf),
    "5layers-2hosts-2dev": (av.Cluster.a100_node(2, 2), 5, 6, "1f1b", 5.0),
    "3hosts-2dev": (av.Cluster.a100_node(3, 2), 4, 4, "1f1b", math.inf),
    # ZB-H1: every stage holds min(n, B) microbatches; the DP runs one count at a time, pruned by 1F1B's bound
    "1host-4dev-zb-h1-tight": (av.Cluster.a100_node(1, 4), 4, 8, "zb-h1", 4.0),
    "5layers-2hosts-2dev-zb-h1": (av.Cluster.a100_node(2, 2), 5, 6, "zb-h1", 5.0),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("additive", [False, True], ids=["random", "additive"])
def test_dp_matches_brute_force(case, seed, additive):
    cluster, L, B, schedule, limit = CASES[case]
    table = _random_table(L, cluster, seed, additive)
    expected = _brute_force(table, cluster.num_devices, B, schedule, limit)
    if not math.isfinite(expected):
        with pytest.raises(NoStagePlanError):
            solve_stages(table, cluster.num_devices, B, schedule, limit)
        return
    solution = solve_stages(table, cluster.num_devices, B, schedule, limit)
    assert solution.objective_s == pytest.approx(expected, rel=1e-12)
    assert _objective_of(solution, table, B) == pytest.approx(expected, rel=1e-12)
    assert sum(table.meshes[s.mesh].num_devices for s in solution.stages) == cluster.num_devices
    assert [s.start for s in solution.stages][0] == 0 and solution.stages[-1].stop == L
    for s, first in zip(solution.stages, stage_offsets(table, solution.stages)):
        assert table.placeable(first, table.meshes[s.mesh].num_devices)


CONSTRAINTS = {
    "cut": StageConstraints(required_cuts=(2,)),
    "no-cut": StageConstraints(forbidden_cuts=(1, 3)),
    "stages": StageConstraints(num_stages=3),
    "mesh-of-stage-1": StageConstraints(stage_meshes=((1, (0,)),)),
    "cut+stages+mesh": StageConstraints(required_cuts=(1,), num_stages=2, stage_meshes=((0, (1, 2)),)),
}


@pytest.mark.parametrize("name", list(CONSTRAINTS), ids=list(CONSTRAINTS))
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("schedule, limit", [("1f1b", math.inf), ("zb-h1", 6.0)], ids=["1f1b", "zb-h1-tight"])
def test_dp_honours_constraints_like_brute_force(name, seed, schedule, limit):
    cluster = av.Cluster.a100_node(1, 4)
    table = _random_table(4, cluster, seed)
    constraints = CONSTRAINTS[name]
    expected = _brute_force(table, 4, 4, schedule, limit, constraints)
    if not math.isfinite(expected):
        with pytest.raises(NoStagePlanError):
            solve_stages(table, 4, 4, schedule, limit, constraints)
        return
    solution = solve_stages(table, 4, 4, schedule, limit, constraints)
    assert solution.objective_s == pytest.approx(expected, rel=1e-12)
    cuts = [s.start for s in solution.stages[1:]]
    assert all(c in cuts for c in constraints.required_cuts)
    assert not any(c in cuts for c in constraints.forbidden_cuts)
    for stage, allowed in constraints.stage_meshes:
        if stage < len(solution.stages):
            assert solution.stages[stage].mesh in allowed


# Memory-bound cases where ZB-H1 (min(n, B) microbatches on every stage) must give up 1F1B's best layout.
ZB_BOUND = [(4.0, 7, ()), (5.0, 2, (2,)), (5.0, 6, (2,)), (6.0, 0, (2,)), (6.0, 5, (2,))]


@pytest.mark.parametrize("limit, seed, cuts", ZB_BOUND, ids=[f"limit{lim:g}-seed{s}-cuts{c}" for lim, s, c in ZB_BOUND])
def test_zb_h1_dp_is_exact_where_its_memory_rule_changes_the_answer(limit, seed, cuts):
    cluster, B = av.Cluster.a100_node(1, 4), 8
    table, constraints = _random_table(5, cluster, seed), StageConstraints(required_cuts=cuts)
    expected = _brute_force(table, 4, B, "zb-h1", limit, constraints)
    assert expected > _brute_force(table, 4, B, "1f1b", limit, constraints)  # the case tests what it says
    solution = solve_stages(table, 4, B, "zb-h1", limit, constraints)
    assert solution.objective_s == pytest.approx(expected, rel=1e-12)
    for s in solution.stages:
        need = (table.state_bytes[s.start, s.stop, s.mesh] + min(len(solution.stages), B)
                * table.activation_bytes[s.start, s.stop, s.mesh] + table.temp_bytes[s.start, s.stop, s.mesh])
        assert need <= limit


@pytest.mark.parametrize("hosts,per_host", [(2, 2), (3, 2), (2, 4)], ids=["2x2", "3x2", "2x4"])
@pytest.mark.parametrize("num_stages", [2, 3, 4])
@pytest.mark.parametrize("seed", [5, 6])
def test_dp_places_stages_in_order_and_prices_cuts_on_their_links_like_brute_force(hosts, per_host, num_stages, seed):
    cluster = av.Cluster.a100_node(hosts, per_host)
    table = _random_table(4, cluster, seed, additive=True)
    constraints = StageConstraints(num_stages=num_stages)
    expected = _brute_force(table, cluster.num_devices, 4, "1f1b", math.inf, constraints)
    solution = solve_stages(table, cluster.num_devices, 4, "1f1b", math.inf, constraints)
    assert solution.objective_s == pytest.approx(expected, rel=1e-12)
    assert _objective_of(solution, table, 4) == pytest.approx(expected, rel=1e-12)
    for s, first in zip(solution.stages, stage_offsets(table, solution.stages)):
        size = table.meshes[s.mesh].num_devices
        assert table.placeable(first, size), f"{table.meshes[s.mesh].submesh} at device {first} straddles hosts"


def test_a_stage_inside_a_host_never_straddles_two():
    table = _random_table(4, av.Cluster.a100_node(2, 4), 0)
    assert table.placeable(4, 4) and table.placeable(2, 2) and table.placeable(8, 8) and table.placeable(5, 1)
    assert not table.placeable(2, 4) and not table.placeable(3, 2) and not table.placeable(2, 8)
    assert table.at_host_edge(4) and not table.at_host_edge(6)


def test_infeasible_memory_and_contradictory_constraints_raise():
    cluster = av.Cluster.a100_node(1, 4)
    table = _random_table(4, cluster, 0)
    with pytest.raises(NoStagePlanError, match="memory limit"):
        solve_stages(table, 4, 4, "1f1b", memory_limit_bytes=0.01)
    # Stage 0 pinned to the 4-device mesh leaves nothing for a second stage.
    whole = tuple(i for i, m in enumerate(table.meshes) if m.num_devices == 4)
    contradiction = StageConstraints(num_stages=2, stage_meshes=((0, whole),))
    assert not is_feasible(table, 4, 4, constraints=contradiction)
    with pytest.raises(NoStagePlanError):
        solve_stages(table, 4, 4, constraints=contradiction)


def test_prefer_keeps_previous_stages_among_ties():
    cluster = av.Cluster.a100_node(1, 4)
    meshes = mesh_choices(cluster)
    L = 4
    single = [i for i, m in enumerate(meshes) if m.num_devices == 1][0]
    shape = (L + 1, L + 1, len(meshes))
    span = np.arange(L + 1)[None, :] - np.arange(L + 1)[:, None]
    time = np.where(np.triu(np.ones(shape[:2], bool), 1), span.astype(float), np.inf)[:, :, None].repeat(len(meshes), 2)
    time[:, :, [i for i in range(len(meshes)) if i != single]] = np.inf
    zeros = np.where(np.isfinite(time), 0.0, np.inf)
    table = StageCostTable(meshes, time, zeros, zeros, zeros)
    # Four single-device stages, one layer each, is the only way to cover 4 devices with 4 layers.
    solution = solve_stages(table, 4, 2)
    assert [(s.start, s.stop) for s in solution.stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # With two devices, several slicings tie only if costs are equal; `prefer` breaks the tie.
    two = av.Cluster.a100_node(1, 2)
    meshes2 = mesh_choices(two)
    single2 = [i for i, m in enumerate(meshes2) if m.num_devices == 1][0]
    flat = np.where(np.triu(np.ones(shape[:2], bool), 1), 1.0, np.inf)[:, :, None].repeat(len(meshes2), 2)
    flat[:, :, [i for i in range(len(meshes2)) if i != single2]] = np.inf
    zeros2 = np.where(np.isfinite(flat), 0.0, np.inf)
    table2 = StageCostTable(meshes2, flat, zeros2, zeros2, zeros2)
    for cut in (1, 2, 3):
        wanted = (StageChoice(0, cut, single2), StageChoice(cut, L, single2))
        got = solve_stages(table2, 2, 2, prefer=wanted)
        assert got.stages == wanted


def test_a_mesh_pinned_on_a_later_stage_forces_enough_stages():
    """Pinning stage 2's submesh must yield a plan with a stage 2 on it, never a plan that drops the pin."""
    import alpaviz as av
    from alpaviz.core import analytic_stage_cost

    step, params, microbatch = av.models.gpt(num_layers=4, hidden=64, abstract=True)
    graph = av.trace(step, params, microbatch)
    pins = av.Pins().with_submesh(2, (1, 2))
    plan = av.solve(graph, cluster=av.Cluster.a100_node(1), num_microbatches=4, pins=pins,
                    stage_cost=analytic_stage_cost, progress=False)
    assert plan.num_stages >= 3
    assert plan.stages[2].submesh == (1, 2)


def _every_candidate(table, num_devices, B, limit):
    """The least objective over every t_max candidate, each run: the search without any bound."""
    from alpaviz.core.inter_op._stage_dp import _Problem

    problem = _Problem.build(table, num_devices, B, "1f1b", limit, StageConstraints())
    return min(problem.run(float(t)).value + (B - 1) * float(t) for t in problem.candidates())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("B", [2, 128])
def test_branch_and_bound_over_t_max_is_exact_and_tolerance_is_a_bound(seed, B):
    cluster = av.Cluster.a100_node(2, 4)  # too large to brute force: 10 layers, 8 devices, two hosts
    table = _random_table(10, cluster, seed, additive=seed % 2 == 1)
    limit = 14.0 if seed % 3 == 0 else math.inf
    exhaustive = _every_candidate(table, cluster.num_devices, B, limit)
    exact = solve_stages(table, cluster.num_devices, B, "1f1b", limit)
    assert exact.objective_s == pytest.approx(exhaustive, rel=1e-12)
    assert exact.candidates_tried < exact.candidates_total
    loose = solve_stages(table, cluster.num_devices, B, "1f1b", limit, tolerance=0.1)
    assert exhaustive * (1 - 1e-12) <= loose.objective_s <= 1.1 * exhaustive * (1 + 1e-12)
    assert loose.candidates_tried <= exact.candidates_tried


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_proposals_are_the_best_layout_then_one_per_other_stage_count(case):
    cluster, L, B, schedule, limit = CASES[case]
    table = _random_table(L, cluster, 0)
    if not math.isfinite(_brute_force(table, cluster.num_devices, B, schedule, limit)):
        return
    best = solve_stages(table, cluster.num_devices, B, schedule, limit)
    proposals = solve_stages(table, cluster.num_devices, B, schedule, limit, proposals=3).proposals()
    assert proposals[0].stages == best.stages and not best.alternatives
    counts = [len(p.stages) for p in proposals]
    assert len(set(counts)) == len(counts) and len(counts) <= 3
    for p in proposals:
        n = len(p.stages)
        assert p.objective_s == pytest.approx(_objective_of(p, table, B), rel=1e-12)
        # No layout of its stage count beats the best one, and none is better than the DP's best overall.
        by_count = _brute_force(table, cluster.num_devices, B, schedule, limit, StageConstraints(num_stages=n))
        assert by_count * (1 - 1e-12) <= p.objective_s and best.objective_s <= p.objective_s * (1 + 1e-12)
        assert sum(table.meshes[s.mesh].num_devices for s in p.stages) == cluster.num_devices
