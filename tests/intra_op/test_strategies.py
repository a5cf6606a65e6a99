"""Strategy enumeration: names, validity, and that XLA needs exactly the collectives a strategy claims."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding

import alpaviz as av
from alpaviz.core.intra_op._solve_sharding import strategy_names
from alpaviz.core.plan._spec import check_spec, to_partition_spec
from alpaviz.core.intra_op._strategies import enumerate_strategies

COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(")
CLUSTER = av.Cluster.local()


def _mesh(shape):
    return CLUSTER.logical_mesh((1, shape[0] * shape[1]), shape)


def _single_node(fn, *args, primitive):
    graph = av.trace(fn, *args)
    nodes = [n for n in graph.nodes if n.primitive == primitive]
    assert len(nodes) == 1, [n.primitive for n in graph.nodes]
    return graph, nodes[0]


def _collectives(fn, args, in_specs, out_spec, shape):
    devices = np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    mesh = Mesh(devices, ("x", "y"))
    shard = lambda s: NamedSharding(mesh, to_partition_spec(s))  # noqa: E731
    ins = tuple(shard(s if s is not None else ((),) * np.ndim(a)) for s, a in zip(in_specs, args))
    text = jax.jit(fn, in_shardings=ins, out_shardings=shard(out_spec)).lower(*args).compile().as_text()
    return {m.group(1) for m in COLLECTIVE.finditer(text)}


F32 = jnp.float32
CASES = {
    "matmul": (lambda a, b: a @ b, (jnp.ones((8, 16), F32), jnp.ones((16, 32), F32)), "dot_general"),
    "batched_matmul": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
                       (jnp.ones((4, 8, 16), F32), jnp.ones((4, 16, 8), F32)), "dot_general"),
    "add_with_broadcast_dim": (lambda a, b: lax.add(a, b), (jnp.ones((8, 16), F32), jnp.ones((8, 1), F32)), "add"),
    "reduce_sum": (lambda a: jnp.sum(a, axis=1), (jnp.ones((8, 16), F32),), "reduce_sum"),
    "transpose": (lambda a: a.T, (jnp.ones((8, 16), F32),), "transpose"),
    "reshape_split": (lambda a: a.reshape(8, 4, 4), (jnp.ones((8, 16), F32),), "reshape"),
    "reshape_merge": (lambda a: a.reshape(32, 4), (jnp.ones((8, 4, 4), F32),), "reshape"),
    "broadcast": (lambda a: lax.broadcast_in_dim(a, (8, 4, 16), (0, 2)), (jnp.ones((8, 16), F32),),
                  "broadcast_in_dim"),
    "concatenate": (lambda a, b: lax.concatenate([a, b], 1), (jnp.ones((8, 16), F32), jnp.ones((8, 16), F32)),
                    "concatenate"),
    "cumsum": (lambda a: lax.cumsum(a, axis=1), (jnp.ones((8, 16), F32),), "cumsum"),
    "embedding_gather": (lambda t, i: jnp.take(t, i, axis=0),
                         (jnp.ones((32, 16), F32), jnp.zeros((8, 4), jnp.int32)), "gather"),
    "conv": (lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
             (jnp.ones((4, 8, 8, 8), F32), jnp.ones((3, 3, 8, 4), F32)), "conv_general_dilated"),
}


@pytest.mark.parametrize("mesh_shape", [(1, 4), (2, 2)], ids=["1x4", "2x2"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_each_strategy_needs_only_its_own_collectives(case, mesh_shape):
    fn, args, primitive = CASES[case]
    graph, node = _single_node(fn, *args, primitive=primitive)
    mesh = _mesh(mesh_shape)
    strategies = enumerate_strategies(graph, node, mesh, av.CostModel(), CLUSTER.device)
    names = [s.name for s in strategies]
    assert len(names) == len(set(names)) and len(names) > 1
    assert all(axes == () for spec in strategies[0].out_specs for axes in spec), "replicated comes first"
    operand_order = [graph.inputs.index(t) if t in graph.inputs else None for t in node.inputs]
    for s in strategies:
        for t, spec in zip(node.inputs + node.outputs, s.in_specs + s.out_specs):
            if spec is not None:
                check_spec(graph.tensor(t).shape, spec, mesh.shape, mesh.axis_names)
        if None in operand_order:  # an operand made inside the traced function: skip the HLO check
            continue
        in_specs = [s.in_specs[operand_order.index(i)] for i in range(len(args))]
        found = _collectives(fn, args, in_specs, s.out_specs[0], mesh_shape)
        claimed = {c.kind for c in s.collectives}
        if not claimed:
            assert not found, f"{s.name}: XLA needed {found} where the strategy claims none"
        elif claimed == {"all-reduce"}:
            assert found == {"all-reduce"}, f"{s.name}: {found}"
        else:
            # XLA on CPU lowers a reduce-scatter to an all-reduce plus a local slice (and, on a 2-D
            # mesh, sometimes a permute to put the slices on the right devices).
            assert "all-reduce" in found or "reduce-scatter" in found, f"{s.name}: {found}"
            assert found <= {"all-reduce", "reduce-scatter", "collective-permute"}, f"{s.name}: {found}"


def test_dot_strategies_cover_alpa_cases_on_a_2d_mesh():
    graph, node = _single_node(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 32)), primitive="dot_general")
    names = strategy_names(graph, node.name, _mesh((2, 2)))
    for expected in [
        "RR = RR x RR",                      # replicated
        "S0R = S0R x RR",                    # data parallel on axis 0
        "RS1 = RR x RS1",                    # column split
        "RR = RS1 x S1R @ {1}",              # contracted split, all-reduce
        "S0S1 = S0R x RS1",                  # both axes, two dims
        "S01R = S01R x RR",                  # both axes on one dim
        "RR = RS01 x S01R @ {0,1}",          # contracted over both axes
        "S1R = RS1 x S1R @ {1} (reduce-scatter)",
        "S0R = S0S1 x S1R @ {1}",
    ]:
        assert expected in names, (expected, names)


def test_strategy_names_are_stable_and_ignore_costs():
    graph, node = _single_node(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 32)), primitive="dot_general")
    mesh = _mesh((2, 2))
    cheap = enumerate_strategies(graph, node, mesh, av.CostModel(compute_efficiency=1.0), CLUSTER.device)
    dear = enumerate_strategies(graph, node, mesh, av.CostModel(compute_efficiency=0.1),
                                av.Cluster.v100_node().device)
    assert [s.name for s in cheap] == [s.name for s in dear] == list(strategy_names(graph, node.name, mesh))
    assert cheap[1].compute_s != dear[1].compute_s


def test_non_dividing_axes_drop_strategies_but_keep_replicated():
    graph, node = _single_node(lambda a, b: a @ b, jnp.ones((6, 5)), jnp.ones((5, 3)), primitive="dot_general")
    names = strategy_names(graph, node.name, _mesh((1, 4)))
    assert names == ("RR = RR x RR",)


def test_split_compute_and_partial_sum_costs():
    graph, node = _single_node(lambda a, b: a @ b, jnp.ones((512, 512)), jnp.ones((512, 512)),
                               primitive="dot_general")
    mesh = _mesh((1, 4))
    by_name = {s.name: s for s in enumerate_strategies(graph, node, mesh, av.CostModel(), CLUSTER.device)}
    full, rows, contracted = by_name["RR = RR x RR"], by_name["S1R = S1R x RR"], by_name["RR = RS1 x S1R @ {1}"]
    assert rows.compute_s == pytest.approx(full.compute_s / 4)
    assert rows.communication_s == 0.0
    out_bytes = 512 * 512 * 4
    assert contracted.communication_s == pytest.approx(av.CostModel().all_reduce(out_bytes, mesh, 1))
    scattered = by_name["S1R = RS1 x S1R @ {1} (reduce-scatter)"]
    assert scattered.communication_s == pytest.approx(av.CostModel().reduce_scatter(out_bytes, mesh, 1))
    assert scattered.communication_s < contracted.communication_s
