"""Processes that profile layers, kept alive across solves.

A spawned worker pays about a second and a half to start (it imports JAX
and alpaviz) before it solves its first ILP.  A solve that profiles a few
dozen layers in a fresh pool pays that every time; a microbatch-count
search (one solve per count) or an editor session (one per what-if) pays it
once with `ProfileWorkers`.  The graph a solve profiles travels to each
worker once, through a file, not with every job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, Sequence

from alpaviz.core.graph import OpGraph

ProgressFn = Callable[[int, int], None]


def available_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class ProfileWorkers:
    """A pool of `count` spawned processes that profile layers for any number of solves.

    Pass it as `workers=` to `solve` (or a count search, or an editor session's options) and close it
    when done; it is a context manager, and is closed when garbage-collected.

    Example:
        >>> with av.ProfileWorkers(2) as workers:
        ...     plan = av.solve(step, params, batch, cluster=cluster, num_microbatches="auto",
        ...                     global_batch_argnums=(1,), workers=workers)
    """

    def __init__(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"ProfileWorkers needs a whole number of processes >= 1, got {count!r}")
        import multiprocessing

        self.count = count
        self._pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"))
        self._folder = tempfile.mkdtemp(prefix="alpaviz-workers-")
        self._closer = weakref.finalize(self, _shut_down, self._pool, self._folder)

    def __enter__(self) -> "ProfileWorkers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ProfileWorkers({self.count}{', closed' if self.closed else ''})"

    @property
    def closed(self) -> bool:
        """True once `close` ran (or the pool was collected): solves may no longer use it."""
        return not self._closer.alive

    def close(self) -> None:
        """Stop the processes and remove their graph files."""
        self._closer()

    def warm_up(self) -> Future:
        """Start every process now (in the background) so the first solve that needs them does not wait."""
        self._check_open()
        futures = [self._pool.submit(_ready) for _ in range(self.count)]
        return futures[-1]

    def profile(self, graph: OpGraph, job: Callable[..., Any], context: tuple, items: Sequence[tuple],
                on_profile: ProgressFn | None = None) -> list:
        """`job(graph, *context, *item)` for every item, in order, run across the processes."""
        self._check_open()
        path = self._graph_file(graph)
        results = []
        for done, result in enumerate(self._pool.map(_run, [(path, job, context, item) for item in items],
                                                     chunksize=1), start=1):
            results.append(result)
            if on_profile is not None:
                on_profile(done, len(items))
        return results

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("these ProfileWorkers are closed: make a new av.ProfileWorkers(n), or pass workers=n")

    def _graph_file(self, graph: OpGraph) -> str:
        """The file holding `graph` without its JAX objects, named by its content (written once)."""
        light = dataclasses.replace(
            graph,
            nodes=tuple(dataclasses.replace(n, jax_primitive=None, jax_params=None) for n in graph.nodes),
            in_tree=None, out_tree=None, constants=None,
        )
        data = pickle.dumps(light, protocol=pickle.HIGHEST_PROTOCOL)
        path = os.path.join(self._folder, f"graph-{hashlib.sha256(data).hexdigest()[:24]}.pkl")
        if not os.path.exists(path):
            partial = f"{path}.{os.getpid()}.{threading.get_ident()}"
            with open(partial, "wb") as out:
                out.write(data)
            os.replace(partial, path)
        return path


def _shut_down(pool: ProcessPoolExecutor, folder: str) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(folder, ignore_errors=True)


def _ready() -> bool:
    return True


# In each worker process: the graph file read last and its graph (a solve sends many jobs on one graph).
_LOADED: dict[str, Any] = {"path": None, "graph": None}


def _run(task: tuple) -> Any:
    path, job, context, item = task
    if _LOADED["path"] != path:
        with open(path, "rb") as src:
            _LOADED["graph"] = pickle.load(src)
        _LOADED["path"] = path
    return job(_LOADED["graph"], *context, *item)
