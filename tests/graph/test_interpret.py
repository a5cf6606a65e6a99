import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.graph._interpret import as_function, evaluate


@pytest.mark.parametrize("builder", [av.models.gpt, av.models.moe, av.models.wresnet], ids=["gpt", "moe", "wresnet"])
def test_graph_interpreter_reproduces_the_step(builder):
    step, params, batch = builder()
    graph = av.trace(step, params, batch)
    expected = jax.jit(step)(params, batch)
    got = jax.jit(as_function(graph))(params, batch)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_evaluate_a_subset_names_missing_inputs():
    step, params, batch = av.models.gpt(num_layers=2)
    graph = av.trace(step, params, batch)
    later = [n for n in graph.nodes if n.layer == 1 and n.role == "forward"]
    with pytest.raises(KeyError, match="neither given nor computed"):
        evaluate(graph, {}, nodes=later)
