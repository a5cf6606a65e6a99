"""An editor session's background profiling: when it starts, what it profiles ahead, and that plans stay the same."""

import weakref

import pytest

import alpaviz as av
from alpaviz.core import ProfileWorkers, SolveOptions
from alpaviz.widgets import EditorSession, WhatIf
from alpaviz.widgets._session_workers import WORTH_STARTING_S, SessionWorkers


class _FakeWorkers(ProfileWorkers):
    """Counts warm-ups instead of starting processes."""

    def __init__(self, count):
        self.count, self.warmed = count, 0
        self._closer = weakref.finalize(self, lambda: None)

    def warm_up(self):
        self.warmed += 1


def _small_gpt():
    return av.trace(*av.models.gpt(num_layers=3, hidden=64, heads=2, seq_len=16, vocab=128, batch_size=8,
                                   abstract=True))


def test_processes_start_only_after_a_solve_slow_enough_to_pay_for_them():
    made = []

    def make(n):
        made.append(_FakeWorkers(n))
        return made[-1]

    workers = SessionWorkers(2, SolveOptions(), make=make)
    fast = workers.after_solve(WORTH_STARTING_S / 2, SolveOptions())
    assert made == [] and fast.workers == 1
    slow = workers.after_solve(WORTH_STARTING_S * 2, SolveOptions())
    assert len(made) == 1 and made[0].count == 2 and made[0].warmed == 1 and slow.workers is made[0]
    assert workers.after_solve(WORTH_STARTING_S * 2, SolveOptions()).workers is made[0]  # one pool per session
    workers.close()
    assert made[0].closed and workers.after_solve(0.0, SolveOptions()).workers == 1

    never = SessionWorkers(0, SolveOptions(), make=make)
    assert never.after_solve(60.0, SolveOptions()).workers == 1 and len(made) == 1
    with pytest.raises(ValueError, match="background_workers"):
        SessionWorkers(-1, SolveOptions())


def test_a_pool_the_caller_passed_is_used_and_left_open():
    given = _FakeWorkers(2)
    workers = SessionWorkers(None, SolveOptions(workers=given))
    assert workers.after_solve(0.0, SolveOptions()).workers is given
    workers.close()
    assert not given.closed


@pytest.mark.slow
def test_a_session_profiles_more_hosts_ahead_and_the_whatif_then_profiles_nothing():
    graph = _small_gpt()
    with av.ProfileWorkers(2) as pool:
        session = EditorSession(graph, whatif=WhatIf(4, "1f1b", av.Cluster.a100_node(1, 4)),
                                solve_options={"workers": pool, "progress": False})
        session.workers.wait_for_prefetched()
        ahead = len(session.cache)
        assert ahead > 0
        seen = []
        session.on_activity(seen.append)
        outcome = session.set_whatif(session.whatif.with_hosts(2))
        assert outcome.ok and seen[0].startswith("planning for 2x4 A100") and "this plan stays" in seen[0]
        # every profile the what-if needed was already there (the cache's own counters also see the
        # next prefetch, for 3 and 4 hosts, which starts on a thread as soon as the plan is shown)
        assert "(0 layer profiles computed" in " ".join(session.plan.solver.timings)
        fresh = av.solve(graph, cluster=av.Cluster.a100_node(1, 4).with_hosts(2), num_microbatches=4,
                         progress=False)
        assert session.plan.stages == fresh.stages and session.plan.predicted == fresh.predicted
        session.close()
        assert not pool.closed  # the caller's pool stays theirs


@pytest.mark.slow
def test_a_solve_goes_before_prefetched_work_it_does_not_need_and_gives_the_serial_plan():
    graph = _small_gpt()
    serial = av.solve(graph, cluster=av.Cluster.a100_node(2, 4), num_microbatches=4, progress=False)
    with av.ProfileWorkers(2) as pool:
        cache = av.StageProfileCache()
        options = SolveOptions(workers=pool, cache=cache, num_microbatches=4, progress=False)
        started = av.core.prefetch(graph, av.Cluster.a100_node(8, 4), options)
        assert started > 0
        pooled = av.solve(graph, cluster=av.Cluster.a100_node(2, 4), options=options)
        pool.wait_for_prefetched(timeout_s=120)
        assert pooled.stages == serial.stages and pooled.predicted == serial.predicted
        assert not pool.has_pending(list(cache._entries))
    with pytest.raises(ValueError, match="running ProfileWorkers"):
        av.core.prefetch(graph, av.Cluster.a100_node(2, 4), SolveOptions(cache=av.StageProfileCache()))


def test_with_hosts_keeps_the_hosts_and_links_and_refuses_no_hosts():
    base = av.Cluster.a100_node(2)
    four = base.with_hosts(4)
    assert (four.num_hosts, four.devices_per_host, four.inter_host, four.device) == \
        (4, base.devices_per_host, base.inter_host, base.device)
    assert four.name.startswith("4x8")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="whole number of hosts"):
            base.with_hosts(bad)
