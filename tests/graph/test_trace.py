import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpaviz as av


def _mlp_step(layer_sizes, batch):
    def loss(params, x):
        h = x
        for i, w in enumerate(params):
            h = h @ w
            if i < len(params) - 1:
                h = av.mark_layer(jnp.tanh(h))
        return jnp.mean(h**2)

    def train_step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return [p - 0.1 * g for p, g in zip(params, grads)], value

    keys = jax.random.split(jax.random.key(0), len(layer_sizes) - 1)
    params = [jax.random.normal(k, (a, b)) for k, a, b in zip(keys, layer_sizes, layer_sizes[1:])]
    return train_step, params, jnp.ones((batch, layer_sizes[0]))


@pytest.mark.parametrize("sizes,batch", [((16, 32, 8), 4), ((8, 64, 64, 4), 16)], ids=["2-layer", "3-layer"])
def test_mlp_dot_flops_match_analytic_count(sizes, batch):
    step, params, x = _mlp_step(sizes, batch)
    graph = av.trace(step, params, x)
    forward = sum(2 * batch * a * b for a, b in zip(sizes, sizes[1:]))
    # Backward: a weight gradient per layer, an input gradient for every layer but the first.
    backward = forward + sum(2 * batch * a * b for a, b in zip(sizes[1:], sizes[2:]))
    dots = [n for n in graph.nodes if n.primitive == "dot_general"]
    assert graph.flops_by_primitive()["dot_general"] == forward + backward
    assert sum(n.flops for n in dots if n.role == "forward") == forward
    assert sum(n.flops for n in dots if n.role == "backward") == backward


def test_total_flops_is_exact_sum_for_mlp():
    b, d, h = 4, 16, 32
    step, params, x = _mlp_step((d, h, d), b)
    graph = av.trace(step, params, x)
    elementwise = graph.total_flops - graph.flops_by_primitive()["dot_general"]
    # tanh, square and mean, the matching backward ops and two SGD updates: each counted per element.
    assert elementwise > 0
    expected_dots = 2 * b * d * h * 2 + 2 * b * d * h * 2 + 2 * b * h * d
    assert graph.total_flops == expected_dots + elementwise
    assert graph.total_flops == sum(n.flops for n in graph.nodes)


def test_roles_and_layers_follow_markers():
    step, params, x = _mlp_step((8, 16, 16, 4), 2)
    graph = av.trace(step, params, x)
    assert graph.num_layers == 3
    roles = {n.role for n in graph.nodes}
    assert roles == {"forward", "backward", "update"}
    for node in graph.nodes:
        if node.role == "update" and node.primitive == "sub":
            param = next(t for t in node.inputs if t.startswith("params."))
            assert node.layer == int(param.split(".")[1])
    fwd_dots = [n.layer for n in graph.nodes if n.primitive == "dot_general" and n.role == "forward"]
    assert fwd_dots == [0, 1, 2]
    # The backward of layer 2 comes first and of layer 0 last.
    bwd_layers = [n.layer for n in graph.nodes if n.role == "backward"]
    assert bwd_layers == sorted(bwd_layers, reverse=True)
    assert set(bwd_layers) == {0, 1, 2}


def test_mark_layer_survives_grad_and_is_identity():
    def f(x):
        return jnp.sum(av.mark_layer({"a": jnp.sin(x), "b": x}, name="mid")["a"] ** 2)

    x = jnp.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(jax.grad(f)(x), 2 * jnp.sin(x) * jnp.cos(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x), 2 * jnp.sin(x) * jnp.cos(x), rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.grad(f))(x))
    assert "phase=forward" in jaxpr and "phase=backward" in jaxpr
    assert np.allclose(jax.vmap(lambda v: av.mark_layer(v * 2))(x), x * 2)


def test_inputs_named_by_argument_and_path_and_jit_is_inlined():
    step, params, x = _mlp_step((4, 8, 2), 3)
    graph = av.trace(jax.jit(step), params, x)
    assert graph.inputs == ("params.0", "params.1", "x")
    assert all(n.primitive not in ("pjit", "jit", "custom_jvp_call") for n in graph.nodes)
    assert graph.tensor("params.0").shape == (4, 8)
    assert len(graph.outputs) == 3


def test_trace_accepts_shape_structs_without_allocating():
    step, params, batch = av.models.gpt("1.3B", batch_size=16, abstract=True, dtype=jnp.float16)
    graph = av.trace(step, params, batch)
    cfg = av.models.GPT_CONFIGS["1.3B"]
    assert graph.num_layers == cfg.num_layers
    tokens = 16 * cfg.seq_len
    # Matmul FLOPs of a transformer: 6 * params * tokens dominate (+ attention scores).
    dense = 6 * tokens * (12 * cfg.hidden**2 * cfg.num_layers + cfg.vocab * cfg.hidden)
    attention = 6 * 2 * 16 * cfg.seq_len**2 * cfg.hidden * cfg.num_layers
    assert graph.flops_by_primitive()["dot_general"] == pytest.approx(dense + attention, rel=1e-9)


def test_tiny_gpt_dot_flops_exact():
    b, s, h, v, n = 2, 8, 16, 32, 2
    step, params, batch = av.models.gpt(num_layers=n, hidden=h, heads=2, seq_len=s, vocab=v, batch_size=b)
    graph = av.trace(step, params, batch)
    t = b * s
    forward = n * (2 * t * h * 3 * h + 2 * t * h * h + 2 * t * h * 4 * h * 2 + 2 * 2 * b * s * s * h) + 2 * t * h * v
    # Backward doubles every matmul except the embedding lookup, which is no matmul.
    assert graph.flops_by_primitive()["dot_general"] == 3 * forward
    assert graph.num_layers == n


@pytest.mark.parametrize("builder", [av.models.gpt, av.models.moe, av.models.wresnet], ids=["gpt", "moe", "wresnet"])
def test_zoo_models_train(builder):
    step, params, batch = builder()
    new_params, loss = jax.jit(step)(params, batch)
    assert np.isfinite(loss)
    graph = av.trace(step, params, batch)
    assert graph.num_layers >= 2
    assert graph.flops_by_role()["backward"] > graph.flops_by_role()["forward"]
    assert jax.tree.structure(new_params) == jax.tree.structure(params)


def test_scan_kept_as_one_node_with_note():
    def f(w, xs):
        def body(c, x):
            return c @ w + x, None
        return jax.lax.scan(body, jnp.zeros(4), xs)[0].sum()

    graph = av.trace(f, jnp.eye(4), jnp.ones((5, 4)))
    scans = [n for n in graph.nodes if n.primitive == "scan"]
    assert len(scans) == 1 and "length 5" in scans[0].note
    assert scans[0].flops >= 5 * 2 * 4 * 4


def test_tied_embedding_gradient_crosses_the_pipeline_once_per_step():
    """The head's and the embedding's cotangents of a tied weight are summed in the update, so the head's
    share is sent to the embedding's stage once per step (step_transfer_bytes), not with every microbatch."""
    from alpaviz.core.graph import gradient_producers, step_transfer_bytes

    step, params, batch = av.models.gpt(num_layers=2, abstract=True)
    graph = av.trace(step, params, batch)
    forward_layers = {}
    for node in graph.nodes:
        if node.role == "forward":
            for t in node.inputs:
                forward_layers.setdefault(t, set()).add(node.layer)
    tied = [t for t in graph.inputs if graph.tensor(t).kind == "input" and len(forward_layers.get(t, ())) > 1
            and len(graph.tensor(t).shape) == 2]
    assert len(tied) == 1, tied
    nbytes = graph.tensor(tied[0]).nbytes
    first, last = min(forward_layers[tied[0]]), max(forward_layers[tied[0]])
    assert first < last
    matrix = step_transfer_bytes(graph)
    assert matrix[first, last] >= nbytes
    shape = graph.tensor(tied[0]).shape
    per_microbatch = [t.name for t in graph.tensors if t.producer and graph.node(t.producer).role == "backward"
                      and t.shape == shape and any(graph.node(c).role == "backward"
                                                   and graph.node(c).layer < graph.node(t.producer).layer
                                                   for c in graph.consumers.get(t.name, ()))]
    assert not per_microbatch  # per microbatch, only the activations' gradients travel back
    summed = [n for n in graph.nodes if n.primitive == "add_any" and n.role == "update"]
    assert summed
    grads = gradient_producers(graph)
    assert grads and all(graph.node(n).role == "backward" for n in grads)
