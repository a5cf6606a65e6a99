"""Layer clustering: Alpa's DP against brute force, and layers on traced graphs."""

import itertools
import math

import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.inter_op._layer_clustering import cluster_layers, merge_layers, partition_sequence


def _mlp_step(widths=(16, 32, 32, 32, 32, 32, 16), marks=False):
    return av.models.mlp(widths, batch_size=8, marks=marks, abstract=True)


def _brute_partition(flops, cut_cost, parts, eps):
    n, total = len(flops), sum(flops)
    mean = total / parts
    bound = max((1 + eps) * mean, max(flops))
    scale = max(cut_cost) or 1.0
    best, best_cuts = math.inf, None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        segs = [sum(flops[a:b]) for a, b in zip(bounds, bounds[1:])]
        if max(segs) > bound * (1 + 1e-12):
            continue
        value = sum(cut_cost[c] / scale for c in cuts) + 1e-2 * sum(((s - mean) / mean) ** 2 for s in segs)
        if value < best - 1e-12:
            best, best_cuts = value, [0, *cuts]
    return best, best_cuts


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_partition_sequence_matches_brute_force(seed, parts):
    rng = np.random.default_rng(seed)
    n = 8
    flops = rng.uniform(0.0, 10.0, n).tolist()
    cut_cost = [0.0] + rng.choice([1.0, 50.0, 200.0], n - 1).tolist()
    expected, _ = _brute_partition(flops, cut_cost, parts, 0.5)
    starts = partition_sequence(flops, cut_cost, parts, 0.5)
    assert starts[0] == 0 and len(starts) == parts and starts == sorted(set(starts))
    got, _ = _brute_partition_value(flops, cut_cost, parts, starts)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def _brute_partition_value(flops, cut_cost, parts, starts):
    n = len(flops)
    mean = sum(flops) / parts
    scale = max(cut_cost) or 1.0
    bounds = (*starts, n)
    segs = [sum(flops[a:b]) for a, b in zip(bounds, bounds[1:])]
    return sum(cut_cost[c] / scale for c in starts[1:]) + 1e-2 * sum(((s - mean) / mean) ** 2 for s in segs), segs


def test_partition_sequence_rejects_impossible_requests():
    with pytest.raises(ValueError, match="non-empty"):
        partition_sequence([1.0, 2.0], [0.0, 0.0], 3)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        cluster_layers(av.trace(*_mlp_step()), num_layers=0)


def test_unmarked_mlp_is_clustered_into_contiguous_balanced_layers():
    graph = av.trace(*_mlp_step())
    assert graph.num_layers == 1
    layered = cluster_layers(graph, num_layers=3)
    assert layered.num_layers == 3
    forward = [n for n in layered.nodes if n.role == "forward"]
    layers = [n.layer for n in forward]
    assert layers == sorted(layers), "forward layers must follow the operator order"
    fwd_flops = [sum(n.flops for n in forward if n.layer == l) for l in range(3)]
    assert max(fwd_flops) <= 1.5 * sum(fwd_flops) / 3 * (1 + 1e-9)
    # Each weight's forward matmul, its gradient matmul and its update share a layer.
    for w in (t for t in layered.inputs if t.startswith("params")):
        readers = [layered.node(c) for c in layered.consumers[w]]
        fwd_layer = {n.layer for n in readers if n.role == "forward"}
        upd_layer = {n.layer for n in readers if n.role == "update"}
        assert len(fwd_layer) == 1 and upd_layer == fwd_layer
    # The gradient of a weight (what the update subtracts) comes from that weight's layer.
    for node in layered.nodes:
        if node.role == "update" and node.primitive == "mul":
            grad = [t for t in node.inputs if layered.tensor(t).producer]
            for g in grad:
                assert layered.node(layered.tensor(g).producer).layer == node.layer


def test_marked_graph_keeps_layers_and_merges_on_request():
    graph = av.trace(*_mlp_step(marks=True))
    assert graph.num_layers == 6
    assert cluster_layers(graph) is graph
    assert cluster_layers(graph, num_layers=10) is graph
    merged = merge_layers(graph, 3)
    assert merged.num_layers == 3
    old_to_new = {}
    for old, new in zip(graph.nodes, merged.nodes):
        old_to_new.setdefault(old.layer, set()).add(new.layer)
    assert all(len(v) == 1 for v in old_to_new.values()), "a marked layer is never split"
    groups = [old_to_new[l].pop() for l in range(6)]
    assert groups == sorted(groups)
    sizes = [groups.count(g) for g in range(3)]
    assert max(sizes) - min(sizes) <= 1


def test_gpt_blocks_merge_evenly():
    step, params, batch = av.models.gpt(num_layers=8, hidden=64, vocab=64, abstract=True)
    graph = av.trace(step, params, batch)
    merged = cluster_layers(graph, num_layers=4)
    assert merged.num_layers == 4
    flops = merged.layer_flops()
    assert max(flops) / min(flops) < 1.6
