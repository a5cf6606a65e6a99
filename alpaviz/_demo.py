"""The `make demo` job: the default GPT, traced and summarised."""

from __future__ import annotations


def run_demo(devices: int = 8, report_path: str = "demo_report.html") -> int:
    import jax

    import alpaviz as av

    train_step, params, batch = av.models.gpt(num_layers=4, hidden=128, heads=4, seq_len=64, vocab=512)
    graph = av.trace(train_step, params, batch)
    print(f"JAX {jax.__version__} with {len(jax.devices())} {jax.devices()[0].platform} devices")
    print(graph.summary())
    return 0
