"""The profiling processes of one editor session, started once a solve shows they pay.

A what-if on the hosts profiles the new meshes' layers (9 ILPs for GPT-1.3B
going from one host to two); two processes halve that wait, but starting
them costs about a second and a half.  A session whose first solve took
longer than a second starts them in the background while the user reads the
plan, and every later solve, what-if and count search of the session
shares them.  A session of a small model never starts any.
"""

from __future__ import annotations

import threading
from typing import Callable

from alpaviz.core import Cluster, OpGraph, ProfileWorkers, SolveOptions, prefetch

# A solve slower than this is worth two processes for the next ones (they start in ~1.5 s, niced, in the
# background, while the user reads the plan).
WORTH_STARTING_S = 1.0


class SessionWorkers:
    """Owns the session's `ProfileWorkers` (unless the caller passed its own) and when they start.

    `count`: processes to start (None: two, or fewer when fewer cores are free; 1 or 0: never).
    """

    def __init__(self, count: int | None, options: SolveOptions,
                 make: Callable[[int], ProfileWorkers] = ProfileWorkers) -> None:
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"background_workers must be None (automatic) or a whole number >= 0, got {count!r}")
        self.count = min(2, ProfileWorkers.available_cores()) if count is None else count
        self._given = isinstance(options.workers, ProfileWorkers)
        self._make = make
        self.pool: ProfileWorkers | None = options.workers if self._given else None
        self._prefetching: threading.Thread | None = None
        self._last_asked: tuple | None = None

    def after_solve(self, seconds: float, options: SolveOptions) -> SolveOptions:
        """The options for the session's next solves: with the pool, started now if this solve was slow."""
        if self.pool is None and self.count > 1 and seconds > WORTH_STARTING_S:
            self.pool = self._make(self.count)
            self.pool.warm_up()  # the processes start in the background; the plan is already on screen
        if self.pool is None or self.pool.closed:
            return options
        return options.replace(workers=self.pool)

    def prefetch_neighbours(self, graph: OpGraph, cluster: Cluster, options: SolveOptions) -> threading.Thread | None:
        """Profile, in the background, what a what-if to one more host or twice the hosts would need (the
        jobs are found on a thread, so the redrawn plan does not wait; None without a running pool)."""
        if self.pool is None or self.pool.closed:
            return None
        # what the profiles' keys depend on: a re-solve after a stage pin needs nothing new
        asked = (id(graph), cluster, options.cost_model, options.stage_cost, options.submeshes, options.num_layers,
                 options.num_microbatches, options.pins.strategies, options.pins.partition_specs)
        if asked == self._last_asked:
            return None
        self._last_asked = asked
        options = options.replace(workers=self.pool, progress=False)

        def start() -> None:
            for hosts in sorted({cluster.num_hosts + 1, 2 * cluster.num_hosts}):
                try:
                    prefetch(graph, cluster.with_hosts(hosts), options)
                except (ValueError, RuntimeError):  # closed meanwhile, or a cluster the options refuse
                    return

        thread = threading.Thread(target=start, name="alpaviz-prefetch", daemon=True)
        thread.start()
        self._prefetching = thread
        return thread

    def wait_for_prefetched(self, timeout_s: float = 300.0) -> None:
        """Block until the background profiling started so far has finished (benchmarks, tests)."""
        if self._prefetching is not None:
            self._prefetching.join(timeout_s)
        if self.pool is not None and not self.pool.closed:
            self.pool.wait_for_prefetched(timeout_s)

    def wait_until_started(self, timeout_s: float = 120.0) -> bool:
        """Block until the pool's processes run (True), or say there is none (False)."""
        if self.pool is None or self.pool.closed:
            return False
        self.pool.warm_up(wait_s=timeout_s)
        return True

    def close(self) -> None:
        """Stop the processes this session started (a pool the caller passed in stays theirs)."""
        if self.pool is not None and not self._given:
            self.pool.close()
        self.pool = None if not self._given else self.pool
