"""The number of microbatches searched over the divisors of the global batch, for the plan and the grid."""

import pytest

import alpaviz as av
from alpaviz.core.inter_op._microbatch_search import global_batch_size, microbatch_counts

CLUSTER = av.Cluster.a100_node(1, 4)


@pytest.fixture(scope="module")
def model():
    return av.models.mlp((64, 256, 256, 256, 64), batch_size=16)


@pytest.fixture(scope="module")
def cache():
    return av.StageProfileCache()


def test_counts_are_the_divisors_of_the_global_batch(model):
    _, params, batch = model
    assert global_batch_size((params, batch), (1,)) == 16
    assert microbatch_counts(16) == (1, 2, 4, 8, 16)
    assert microbatch_counts(12, limit=6) == (1, 2, 3, 4, 6)
    with pytest.raises(ValueError, match="global_batch_argnums"):
        global_batch_size((params, batch), ())


def test_auto_picks_the_fastest_count_and_says_what_it_tried(model, cache):
    step, params, batch = model
    options = dict(cluster=CLUSTER, global_batch_argnums=(1,), progress=False, cache=cache)
    each = {b: av.solve(step, params, batch, num_microbatches=b, **options) for b in microbatch_counts(16)}
    best = min(each, key=lambda b: each[b].predicted.step_time_s)
    plan = av.solve(step, params, batch, num_microbatches="auto", **options)
    assert plan.schedule.num_microbatches == best
    assert plan.predicted.step_time_s == pytest.approx(each[best].predicted.step_time_s)
    assert len({p.predicted.step_time_s for p in each.values()}) > 1  # the count matters here
    note = plan.solver.notes[-1]
    assert all(f"{b}: " in note for b in each) and note.endswith(f"chose {best}")


def test_a_pinned_count_wins_over_the_search(model, cache):
    step, params, batch = model
    pins = av.Pins().with_num_microbatches(4)
    assert av.Pins.from_json(pins.to_json()) == pins and "4 microbatches" in pins.describe()
    plan = av.solve(step, params, batch, cluster=CLUSTER, num_microbatches="auto", global_batch_argnums=(1,),
                    pins=pins, progress=False, cache=cache)
    assert plan.schedule.num_microbatches == 4
    assert not any("microbatch counts searched" in n for n in plan.solver.notes)


def test_the_memory_limit_pushes_the_search_to_more_microbatches(model, cache):
    step, params, batch = model
    options = dict(cluster=CLUSTER, global_batch_argnums=(1,), progress=False, cache=cache)
    one = av.solve(step, params, batch, num_microbatches=1, pins=av.Pins(num_stages=2), **options)
    eight = av.solve(step, params, batch, num_microbatches=8, pins=av.Pins(num_stages=2), **options)
    assert eight.predicted.max_memory_bytes < one.predicted.max_memory_bytes
    limit = (one.predicted.max_memory_bytes + eight.predicted.max_memory_bytes) / 2
    plan = av.solve(step, params, batch, num_microbatches="auto", pins=av.Pins(num_stages=2), memory_limit=limit,
                    **options)
    assert plan.schedule.num_microbatches > 1 and plan.predicted.max_memory_bytes <= limit
    assert "1: does not fit" in plan.solver.notes[-1]


def test_the_grid_searches_the_same_counts(model, cache):
    step, params, batch = model
    options = dict(cluster=CLUSTER, global_batch_argnums=(1,), cache=cache)
    each = {b: av.baselines.megatron_grid(step, params, batch, num_microbatches=b, **options)
            for b in microbatch_counts(16)}
    grid = av.baselines.megatron_grid(step, params, batch, num_microbatches="auto", **options)
    assert grid.predicted.step_time_s == pytest.approx(min(p.predicted.step_time_s for p in each.values()))
    with pytest.raises(ValueError, match="not an OpGraph"):
        av.solve(av.trace(step, params, batch), cluster=CLUSTER, num_microbatches="auto")
