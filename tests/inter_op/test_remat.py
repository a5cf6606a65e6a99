"""Rematerialisation per stage: chosen when memory needs it, priced, pinnable, and run by the runtime."""

import pytest

import alpaviz as av
from alpaviz.core.runtime._compile import compile_step
from user_models import Case, relative_error, run_jit, run_parallel

CLUSTER = av.Cluster.local()
FOUR = av.Pins(num_stages=4, stage_submeshes=tuple((i, (1, 2)) for i in range(4)))


@pytest.fixture(scope="module")
def model():
    return av.models.gpt(num_layers=4, hidden=64, heads=2, seq_len=32, vocab=128, batch_size=32)


@pytest.fixture(scope="module")
def plans(model):
    """The 4-stage 1F1B plan without a limit, and the same under a limit only recomputation meets."""
    step, params, batch = model
    options = dict(cluster=CLUSTER, num_microbatches=8, global_batch_argnums=(1,), progress=False,
                   cache=av.StageProfileCache())
    free = av.solve(step, params, batch, pins=FOUR, **options)
    assert not any(s.remat for s in free.stages)
    first = free.stages[0].cost.memory
    recomputed = av.solve(step, params, batch, pins=FOUR.with_remat(0, True), **options)
    limit = (first.peak + recomputed.stages[0].cost.memory.peak) / 2
    tight = av.solve(step, params, batch, pins=FOUR, memory_limit=limit, **options)
    return free, recomputed, tight, limit, options


def test_recomputing_trades_forward_time_for_activations_in_flight(plans):
    free, recomputed, _, _, _ = plans
    kept, again = free.stages[0].cost, recomputed.stages[0].cost
    assert recomputed.stages[0].remat and again.memory.in_flight == kept.memory.in_flight == 4
    # Per microbatch in flight only the stage's input stays; one microbatch's activations live in its backward.
    assert again.memory.activations < kept.memory.activations / 4
    assert again.memory.temporaries >= kept.memory.activations
    assert again.memory.peak < kept.memory.peak
    # The backward runs the forward again (stage 0 receives nothing, so its forward is all compute).
    assert again.backward_s == pytest.approx(kept.backward_s + kept.forward_s, rel=1e-6)
    assert recomputed.predicted.step_time_s > free.predicted.step_time_s


def test_the_solver_recomputes_only_where_the_limit_needs_it(plans, model):
    free, _, tight, limit, options = plans
    assert tight.stages[0].remat and tight.predicted.max_memory_bytes <= limit
    assert free.predicted.step_time_s < tight.predicted.step_time_s
    assert not tight.stages[-1].remat  # the last stage keeps one microbatch: nothing to gain
    step, params, batch = model
    with pytest.raises(av.ModelTooLargeError, match="stage 0"):
        av.solve(step, params, batch, pins=FOUR.with_remat(0, False), memory_limit=limit, **options)


def test_remat_pins_and_plans_round_trip(plans):
    _, recomputed, _, _, _ = plans
    pins = FOUR.with_remat(0, True).with_remat(2, False)
    assert av.Pins.from_json(pins.to_json()) == pins
    assert "stage 0 recomputes its forward" in pins.describe()
    assert av.Plan.from_json(recomputed.to_json()).stages[0].remat
    assert "remat" in recomputed.summary()


def test_a_recomputing_stage_runs_like_jit_and_keeps_only_its_inputs(plans, model):
    _, recomputed, _, _, _ = plans
    step, params, batch = model
    plain = compile_step(step, recomputed.with_pins(recomputed.pins), (params, batch))
    backward = plain.flow.task(0, "backward")
    forward_nodes = set(plain.flow.task(0, "forward").nodes)
    assert forward_nodes <= set(backward.nodes)  # recomputed inside the backward
    produced_by_forward = {t for n in forward_nodes for t in plain.graph.node(n).outputs}
    assert not set(backward.inputs) & produced_by_forward  # no residual crosses from forward to backward
    case = Case("gpt", step, (params, batch), lambda args, outs: (outs[0], args[1]))
    assert relative_error(run_parallel(case, recomputed), run_jit(case)) < 1e-5


def _held_activations(monkeypatch, step, plan, params, batch) -> dict[int, int]:
    """Per stage, the most per-microbatch bytes one device held at once while a step ran."""
    from alpaviz.core.runtime._stage_runner import StageRunner

    peaks: dict[int, int] = {}
    original = StageRunner.run_group

    def run_group(self, roles, microbatch):
        out = original(self, roles, microbatch)
        held = sum(v.addressable_shards[0].data.nbytes for v in self.mb_values.values())
        peaks[self.index] = max(peaks.get(self.index, 0), held)
        return out

    monkeypatch.setattr(StageRunner, "run_group", run_group)
    # Timed, every task runs on its own, as the model prices it; untimed steps fuse a stage's back-to-back
    # forward and backward (the last stage's, under 1F1B), which then holds less.
    av.parallelize(step, plan, record_trace=True)(params, batch)
    return peaks


def test_the_runtime_holds_the_activations_the_model_predicts_in_flight(plans, model, monkeypatch):
    free, recomputed, _, _, _ = plans
    step, params, batch = model
    held = _held_activations(monkeypatch, step, free, params, batch)
    for stage in free.stages:
        predicted = stage.cost.memory.in_flight * stage.cost.memory.activations
        # What 1F1B keeps per microbatch: the stored residuals (plus one output waiting for its send).
        assert 0.95 <= held[stage.index] / predicted <= 1.15, (stage.index, held[stage.index], predicted)
    # Recomputing, stage 0 keeps only its input (the batch) per microbatch, plus one forward output
    # until it is sent: about 1% of what it held before.
    remat = _held_activations(monkeypatch, step, recomputed, params, batch)
    assert remat[0] < 0.02 * held[0]
    assert recomputed.stages[0].cost.memory.activations > 0  # the batch, priced
