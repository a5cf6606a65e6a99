"""Layer profiles kept on disk and profiling processes kept alive: same plans, less work."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import alpaviz as av
from alpaviz.core.inter_op import _profile_cache

# A second Python process plans a small GPT on 2x4 A100s with the disk cache and prints what it profiled.
_PLAN_IN_ANOTHER_PROCESS = textwrap.dedent("""
    import sys
    import alpaviz as av
    graph = av.trace(*av.models.gpt(num_layers=3, hidden=64, heads=2, seq_len=16, vocab=128, batch_size=8,
                                    abstract=True))
    cache = av.StageProfileCache(sys.argv[1])
    plan = av.solve(graph, cluster=av.Cluster.a100_node(2, 4), num_microbatches=4, progress=False, cache=cache)
    print(cache.misses, cache.disk_hits)
    print(plan.to_json())
""")


def _small_gpt():
    return av.trace(*av.models.gpt(num_layers=3, hidden=64, heads=2, seq_len=16, vocab=128, batch_size=8,
                                   abstract=True))


def _solve(graph, cache, **options):
    return av.solve(graph, cluster=av.Cluster.a100_node(2, 4), num_microbatches=4, progress=False, cache=cache,
                    **options)


def _stored(directory) -> list[pathlib.Path]:
    return sorted(pathlib.Path(directory).rglob("*.pkl"))


def test_a_second_process_reads_the_profiles_and_plans_the_same(tmp_path):
    graph = _small_gpt()
    cache = av.StageProfileCache(tmp_path)
    plan = _solve(graph, cache)
    assert cache.misses > 0 and len(_stored(tmp_path)) == len(cache)
    run = subprocess.run([sys.executable, "-c", _PLAN_IN_ANOTHER_PROCESS, str(tmp_path)], capture_output=True,
                         text=True, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    counts, plan_json = run.stdout.split("\n", 1)
    misses, disk_hits = map(int, counts.split())
    assert misses == 0 and disk_hits == len(cache)
    other = av.Plan.from_json(plan_json)
    assert other.stages == plan.stages and other.predicted == plan.predicted


def test_a_changed_cost_model_or_code_misses_the_stored_profiles(tmp_path, monkeypatch):
    graph = _small_gpt()
    _solve(graph, av.StageProfileCache(tmp_path))
    stored = len(_stored(tmp_path))

    slower = av.StageProfileCache(tmp_path)
    _solve(graph, slower, cost_model=av.CostModel(compute_efficiency=0.25))
    assert slower.disk_hits == 0 and len(_stored(tmp_path)) == 2 * stored

    monkeypatch.setattr(_profile_cache, "profile_code_version", lambda: "edited-ilp")
    edited = av.StageProfileCache(tmp_path)
    _solve(graph, edited)
    assert edited.disk_hits == 0 and edited.misses == stored


def test_damaged_files_are_profiled_again_and_give_the_same_plan(tmp_path):
    graph = _small_gpt()
    plan = _solve(graph, av.StageProfileCache(tmp_path))
    for path in _stored(tmp_path):
        path.write_bytes(b"not a pickle")
    again = av.StageProfileCache(tmp_path)
    replanned = _solve(graph, again)
    assert again.disk_hits == 0 and again.misses == len(again)
    assert replanned.stages == plan.stages and replanned.predicted == plan.predicted


def test_a_stage_cost_made_at_run_time_stays_in_memory(tmp_path):
    from alpaviz.core.inter_op._stage_cost import analytic_stage_cost

    cache = av.StageProfileCache(tmp_path)
    _solve(_small_gpt(), cache, stage_cost=lambda *a, **kw: analytic_stage_cost(*a, **kw))
    assert len(cache) > 0 and _stored(tmp_path) == []
    assert _profile_cache.stable_text((1, "a", analytic_stage_cost)) is not None
    assert _profile_cache.stable_text((1, object())) is None


def test_the_persistent_cache_lives_in_alpavizs_cache_folder(tmp_path, monkeypatch):
    assert av.StageProfileCache.persistent().directory == av.core.cost.CACHE_DIR / "profiles"
    assert av.StageProfileCache.persistent(tmp_path).directory == tmp_path
    assert "on disk" in repr(av.StageProfileCache(tmp_path)) and "on disk" not in repr(av.StageProfileCache())


@pytest.mark.slow
def test_a_pool_of_profiling_processes_serves_many_solves_with_the_serial_plans():
    graph = _small_gpt()
    serial = _solve(graph, None)
    four_hosts = av.solve(graph, cluster=av.Cluster.a100_node(4, 4), num_microbatches=4, progress=False)
    with av.ProfileWorkers(2) as workers:
        workers.warm_up(wait_s=120)
        first = set(workers._pool._processes)
        pooled = _solve(graph, av.StageProfileCache(), workers=workers)
        pooled_four = av.solve(graph, cluster=av.Cluster.a100_node(4, 4), num_microbatches=4, progress=False,
                               workers=workers)
        assert set(workers._pool._processes) == first  # the same two processes answered both solves
    assert pooled.stages == serial.stages and pooled.predicted == serial.predicted
    assert pooled_four.stages == four_hosts.stages and pooled_four.predicted == four_hosts.predicted
    assert workers.closed
    with pytest.raises(ValueError, match="ProfileWorkers are closed"):
        _solve(graph, None, workers=workers)


def test_profile_workers_refuse_a_count_that_is_not_a_whole_number():
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="whole number of processes"):
            av.ProfileWorkers(bad)


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    # spawned processes import the script again, which solves again: each dies starting its own processes
    script = tmp_path / "plan_it.py"
    script.write_text(textwrap.dedent("""
        import alpaviz as av
        graph = av.trace(*av.models.gpt(num_layers=3, hidden=64, heads=2, seq_len=16, vocab=128, batch_size=8,
                                        abstract=True))
        av.solve(graph, cluster=av.Cluster.a100_node(2, 4), num_microbatches=4, progress=False,
                 workers=av.ProfileWorkers(2))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: a profiling process exited before it answered"), run.stderr[-2000:]
    assert "if __name__ == '__main__':" in last
