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
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from alpaviz.core.graph import OpGraph

ProgressFn = Callable[[int, int], None]


_BROKEN = ("a profiling process exited before it answered. From a script, a solve with workers > 1 must run "
           "under `if __name__ == '__main__':`, because each process starts by importing the script; otherwise "
           "the process ran out of memory: pass workers=1 (profiling in this process)")


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
        self._pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_lower_priority)
        self._pending: dict[Any, Future] = {}  # runs started and not yet finished, by cache key
        self._lock = threading.Lock()
        self._written: dict[int, tuple[weakref.ref, str]] = {}  # id(graph) -> (the graph, its file)
        self._folder = tempfile.mkdtemp(prefix="alpaviz-workers-")
        self._closer = weakref.finalize(self, _shut_down, self._pool, self._folder)

    @staticmethod
    def available_cores() -> int:
        """The cores this process may run on (its affinity, not the machine's count): how many workers pay."""
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1

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

    def warm_up(self, wait_s: float | None = None) -> None:
        """Start every process now (in the background) so the first solve that needs them does not wait;
        with `wait_s`, block until each has answered, raising TimeoutError after that many seconds."""
        self.check_open()
        futures = [self._pool.submit(_ready) for _ in range(self.count)]
        if wait_s is not None:
            _, late = wait(futures, timeout=wait_s)
            if late:
                raise TimeoutError(f"{len(late)} of {self.count} profiling processes did not start within {wait_s} s")
            for future in futures:
                future.result()

    def profile(self, graph: OpGraph, job: Callable[..., Any], context: tuple, items: Sequence[tuple],
                on_profile: ProgressFn | None = None, keys: Sequence[Any] | None = None) -> list:
        """`job(graph, *context, *item)` for every item, in order, run across the processes.

        With `keys`, an item whose key was `prefetch`ed waits for that run instead of starting another.
        Prefetched runs this call does not need and that have not started are cancelled: the solve someone
        waits for goes first (the caller may prefetch them again afterwards).
        """
        try:
            futures = self._submit(graph, job, context, items, keys, remember=False)
            results = []
            for done, (future, item) in enumerate(zip(futures, items), start=1):
                try:
                    results.append(future.result())
                except CancelledError:  # a prefetched run another solve cancelled before it started: run it here
                    results.append(job(graph, *context, *item))
                if on_profile is not None:
                    on_profile(done, len(items))
        except BrokenProcessPool as err:
            raise RuntimeError(_BROKEN) from err
        return results

    def prefetch(self, graph: OpGraph, job: Callable[..., Any], context: tuple, items: Sequence[tuple],
                 keys: Sequence[Any], on_done: Callable[[Any, Any], None]) -> list[Future]:
        """Start the items now and return at once; `on_done(key, result)` runs as each finishes (in a
        background thread).  A later `profile` call with the same keys waits for these runs."""
        futures = self._submit(graph, job, context, items, keys, remember=True)
        for key, future in zip(keys, futures):
            future.add_done_callback(lambda f, key=key: self._finished(key, f, on_done))
        return futures

    def wait_for_prefetched(self, timeout_s: float | None = None) -> None:
        """Block until every run started by `prefetch` so far has finished."""
        with self._lock:
            running = list(self._pending.values())
        wait(running, timeout=timeout_s)

    def has_pending(self, keys: Any) -> bool:
        """Whether any of `keys` is being profiled ahead of time now."""
        with self._lock:
            return any(key in self._pending for key in keys)

    def _submit(self, graph, job, context, items, keys, remember: bool) -> list[Future]:
        """One future per item: a pending run of the same key, or a new run (remembered if `remember`)."""
        self.check_open()
        path = self._graph_file(graph)
        keys = [None] * len(items) if keys is None else list(keys)
        if not remember:
            wanted = set(keys)
            with self._lock:
                ahead = [f for k, f in self._pending.items() if k not in wanted]
            for future in ahead:  # outside the lock: a cancel runs the done callbacks, which take it
                future.cancel()  # False once running: those finish and land in the cache as usual
        futures = []
        with self._lock:
            for key, item in zip(keys, items):
                future = self._pending.get(key) if key is not None else None
                if future is None:
                    future = self._pool.submit(_run, (path, job, context, item))
                    if remember and key is not None:
                        self._pending[key] = future
                futures.append(future)
        return futures

    def _finished(self, key: Any, future: Future, on_done: Callable[[Any, Any], None]) -> None:
        if not future.cancelled() and future.exception() is None:
            on_done(key, future.result())
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]

    def check_open(self) -> None:
        """Refuse work for a closed pool, saying how to get an open one."""
        if self.closed:
            raise ValueError("these ProfileWorkers are closed: make a new av.ProfileWorkers(n), or pass workers=n")

    def _graph_file(self, graph: OpGraph) -> str:
        """The file holding `graph` without its JAX objects, named by its content (written once)."""
        with self._lock:
            known = self._written.get(id(graph))
        if known is not None and known[0]() is graph:
            return known[1]
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
        with self._lock:  # the same graph object again (every re-solve of a session) skips the pickling
            self._written = {k: v for k, v in self._written.items() if v[0]() is not None}
            self._written[id(graph)] = (weakref.ref(graph), path)
        return path


def _shut_down(pool: ProcessPoolExecutor, folder: str) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(folder, ignore_errors=True)


def _ready() -> bool:
    return True


def _lower_priority() -> None:
    """Workers yield the cores to the notebook or app process (their work is often ahead of need)."""
    try:
        os.nice(5)
    except OSError:
        pass


# In each worker process: the graph file read last and its graph (a solve sends many jobs on one graph).
_LOADED: dict[str, Any] = {"path": None, "graph": None}


def _run(task: tuple) -> Any:
    path, job, context, item = task
    if _LOADED["path"] != path:
        with open(path, "rb") as src:
            _LOADED["graph"] = pickle.load(src)
        _LOADED["path"] = path
    return job(_LOADED["graph"], *context, *item)
