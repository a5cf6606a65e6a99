"""A scan over stacked layers is planned and launched like the same model written as a loop."""

import jax
import jax.numpy as jnp
import pytest

import alpaviz as av
from alpaviz.core import Schedule
from user_models import Case, relative_error, run_jit, run_parallel

# SGD: Adam turns float noise in a gradient that is zero in exact arithmetic (a key bias) into a full step.
GPT = dict(num_layers=4, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=8, optimizer="sgd")


def _gpt(scan: bool, **options) -> Case:
    step, params, batch = av.models.gpt(scan_layers=scan, **{**GPT, **options})
    return Case("gpt_scan" if scan else "gpt_loop", step, (params, batch), lambda args, outs: (outs[0], args[1]))


@pytest.fixture(scope="module")
def graphs():
    return {scan: av.trace(*(lambda c: (c.step, *c.args))(_gpt(scan))) for scan in (False, True)}


def test_each_iteration_is_a_layer_with_the_loops_work(graphs):
    loop, scan = graphs[False], graphs[True]
    assert not [n for n in scan.nodes if n.primitive == "scan"]
    assert scan.num_layers == loop.num_layers == GPT["num_layers"]
    for role in ("forward", "backward"):
        dots = lambda g: sorted(n.flops for n in g.nodes if n.primitive == "dot_general" and n.role == role)  # noqa: E731
        assert dots(scan) == dots(loop)
    by_layer = lambda g: [sum(n.flops for n in g.nodes if n.layer == i and n.primitive == "dot_general")  # noqa: E731
                          for i in range(g.num_layers)]
    assert by_layer(scan) == pytest.approx(by_layer(loop))


def test_the_scanned_plan_matches_the_loops_plan():
    graphs = {s: av.trace(*(lambda c: (c.step, *c.args))(_gpt(s, optimizer="adam"))) for s in (False, True)}
    plans = {s: av.solve(g, cluster=av.Cluster.local(), num_microbatches=4, progress=False) for s, g in graphs.items()}
    # The one difference: a stacked weight (and its Adam moments) is updated by one operator on one
    # stage, where the loop's weights are updated layer by layer; so the plans may cut differently.
    assert plans[True].predicted.step_time_s == pytest.approx(plans[False].predicted.step_time_s, rel=0.10)
    loop_shape = av.Pins(
        num_stages=plans[False].num_stages,
        stage_cuts=tuple(s.layer_start for s in plans[False].stages[1:]),
        stage_submeshes=tuple((s.index, s.submesh) for s in plans[False].stages),
        stage_logical_meshes=tuple((s.index, s.logical_mesh) for s in plans[False].stages),
    )
    scanned_as_loop = av.solve(graphs[True], cluster=av.Cluster.local(), num_microbatches=4, progress=False,
                               pins=loop_shape)
    assert scanned_as_loop.predicted.step_time_s >= plans[True].predicted.step_time_s * (1 - 1e-9)
    assert scanned_as_loop.predicted.step_time_s == pytest.approx(plans[False].predicted.step_time_s, rel=0.10)


def test_the_step_simulator_chooses_where_the_closed_form_misranks():
    # At 8 microbatches the closed form prefers two stages; the simulated step, the instruction lists
    # played on the host's shared cores, prefers three.
    graph = av.trace(*(lambda c: (c.step, *c.args))(_gpt(False, optimizer="adam")))
    solve = lambda **o: av.solve(graph, cluster=av.Cluster.local(), num_microbatches=8, progress=False, **o)  # noqa: E731
    closed_form, simulated = solve(simulated_layouts=1), solve()
    assert closed_form.num_stages == 2 and simulated.num_stages == 3
    assert simulated.predicted.step_time_s < closed_form.predicted.step_time_s
    assert "faster than the closed form's best (2 stages)" in simulated.solver.notes[-1]
    # The choice is the plan its own layout gives when pinned.
    layout = av.Pins(stage_cuts=tuple(s.layer_start for s in simulated.stages[1:]), num_stages=3,
                     stage_submeshes=tuple((s.index, s.submesh) for s in simulated.stages),
                     stage_logical_meshes=tuple((s.index, s.logical_mesh) for s in simulated.stages))
    assert solve(pins=layout).predicted.step_time_s == pytest.approx(simulated.predicted.step_time_s, rel=1e-9)


@pytest.mark.parametrize("cuts", [(2,), (1, 2, 3)], ids=["2_stages", "4_stages"])
def test_cuts_inside_the_scan_match_jit(graphs, cuts):
    case = _gpt(scan=True)
    plan = av.manual_plan(graphs[True], av.Cluster.local(), stage_cuts=cuts, schedule=Schedule("1f1b", 2))
    outs = run_parallel(case, plan)
    assert jax.tree.structure(outs[-1][0]) == jax.tree.structure(case.args[0])  # stacked params keep their shape
    assert relative_error(outs, run_jit(case)) <= 1e-5


def test_remat_in_the_body_is_priced_as_forward_recompute_and_backward():
    def make(remat):
        def body(h, w):
            return jnp.tanh(h @ w), None

        body = jax.checkpoint(body) if remat else body

        def step(ws, x):
            loss, g = jax.value_and_grad(lambda ws: jnp.mean(jax.lax.scan(body, x, ws)[0] ** 2))(ws)
            return ws - 0.1 * g, loss

        return av.trace(step, jnp.ones((3, 16, 16)), jnp.ones((8, 16))).flops_by_role()

    plain, remat = make(False), make(True)
    assert remat["forward"] == pytest.approx(plain["forward"], rel=0.05)
    assert remat["backward"] == pytest.approx(plain["backward"] + plain["forward"], rel=0.05)


def test_a_scan_over_time_stays_one_operator_and_the_plan_says_why():
    def step(w, xs):
        def loss(w):
            h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros((8, 16)), xs)
            return jnp.mean(h ** 2)

        l, g = jax.value_and_grad(loss)(w)
        return w - 0.1 * g, l

    graph = av.trace(step, jnp.ones((16, 16)), jnp.ones((5, 8, 16)), batch_argnums=(1,))
    scans = [n for n in graph.nodes if n.primitive == "scan"]
    assert len(scans) == 2 and all("not a stack of layers" in n.note for n in scans)
    plan = av.solve(graph, cluster=av.Cluster.local(), progress=False)
    assert any("scan of length 5 kept as one node" in note for note in plan.solver.notes)
    from alpaviz.widgets import _view_model as vm

    hovers = " ".join(n.hover for n in vm.layer_graph_view(graph, plan).nodes)
    assert "one block: " in hovers and "not a stack of layers" in hovers


def test_flax_nn_scan_is_unrolled_and_its_cuts_match_jit():
    import flax.linen as nn
    import optax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            return x + nn.Dense(16)(jnp.tanh(nn.Dense(32)(x))), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)
            return nn.Dense(1)(stack()(x, None)[0])

    model, tx = Model(), optax.sgd(0.1)
    x, y = jax.random.normal(jax.random.key(0), (8, 16)), jnp.ones((8, 1))
    params = model.init(jax.random.key(1), x)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    case = Case("nn_scan", train_step, (params, tx.init(params), x, y), lambda a, o: (o[0], o[1], a[2], a[3]))
    graph = av.trace(case.step, *case.args)
    assert graph.num_layers == 4 and not [n for n in graph.nodes if n.primitive == "scan"]
    plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(1, 2, 3), schedule=Schedule("1f1b", 2))
    assert relative_error(run_parallel(case, plan), run_jit(case)) <= 1e-5


def test_the_unrolled_graph_runs_as_the_step_from_the_stacked_arguments(graphs):
    """The per-layer inputs are cut from the user's stacked leaves wherever the graph is run."""
    from alpaviz.core.graph import as_function

    case = _gpt(scan=True)
    ours, theirs = as_function(graphs[True])(*case.args), jax.jit(case.step)(*case.args)
    assert relative_error(ours, theirs) <= 1e-5
    assert len(graphs[True].leaf_inputs) == len(jax.tree.leaves(case.args)) < len(graphs[True].inputs)


def test_what_is_made_from_constants_is_not_priced_as_crossing_a_cut(graphs):
    # The scan hoists the causal mask, broadcast to its full shape, before its first iteration: every
    # layer reads it, but each stage recomputes it from constants, so no cut carries it.
    from alpaviz.core.graph import constant_only_nodes, cut_bytes

    scan = graphs[True]
    hoisted = [t for t in scan.tensors if t.producer in constant_only_nodes(scan) and len(t.shape) == 4
               and {scan.node(c).layer for c in scan.consumers.get(t.name, ())} - {scan.node(t.producer).layer}]
    assert hoisted  # the mask exists and is read beyond the layer that makes it
    assert cut_bytes(scan)[0][1:] == pytest.approx(cut_bytes(graphs[False])[0][1:])
