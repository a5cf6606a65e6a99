"""The layer-profile cache, in memory and optionally on disk.

A profile's key already names everything its answer depends on: the
layer's structure (a content hash), the intra-op pins touching it, the
logical mesh and its links, the device, the cost model, the stage-cost
function and the microbatch count.  On disk the key is hashed together
with the source of the code that computes profiles, so a changed cost
model or ILP never reads a stale answer, and a second process or a
restarted notebook reads what an earlier one profiled.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import pickle
import platform
import types
from typing import Any

from alpaviz.core.cost import CACHE_DIR

# The code whose behaviour a profile records: a change to any of it makes every stored profile miss.
_PROFILE_CODE = ("core/cost", "core/intra_op", "core/plan", "core/graph",
                 "core/inter_op/_stage_cost.py", "core/inter_op/_stage_profile.py")


class StageProfileCache:
    """Layer profiles keyed by structure and mesh; pass the same object to every re-solve.

    `directory` keeps them on disk too (`StageProfileCache.persistent()` uses alpaviz's cache folder),
    so a later process that plans the same layers on the same meshes profiles nothing.  Keys that name
    a function defined at run time (a lambda as the stage cost) stay in memory only.

    Example:
        >>> cache = av.StageProfileCache()
        >>> plan = av.solve(graph, cluster=cluster, cache=cache)
        >>> plan2 = av.solve(graph, cluster=cluster, pins=plan.pins.with_cut(3), cache=cache)  # fast
    """

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self._entries: dict[tuple, Any] = {}
        self.directory = None if directory is None else pathlib.Path(directory)
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0

    @classmethod
    def persistent(cls, directory: str | os.PathLike | None = None) -> "StageProfileCache":
        """A cache kept in `directory` (default: `~/.cache/alpaviz/profiles`, or under `$XDG_CACHE_HOME`)."""
        return cls(CACHE_DIR / "profiles" if directory is None else directory)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> Any:
        """The cached profile for `key` (from memory, else from disk), or None; counts hits and misses."""
        found = self._entries.get(key)
        if found is None and self.directory is not None:
            found = self._read(key)
            if found is not None:
                self._entries[key] = found
                self.disk_hits += 1
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key: tuple, profile: Any) -> None:
        """Remember `profile` under `key` for later solves of the same problem (and on disk, when kept there)."""
        self._entries[key] = profile
        if self.directory is not None:
            self._write(key, profile)

    def __getitem__(self, key: tuple) -> Any:
        """A stored profile, without counting a hit or a miss."""
        return self._entries[key]

    def __repr__(self) -> str:
        where = f", on disk in {self.directory} ({self.disk_hits} read)" if self.directory is not None else ""
        return f"StageProfileCache({len(self)} profiles, {self.hits} hits, {self.misses} misses{where})"

    def _path(self, key: tuple) -> pathlib.Path | None:
        text = stable_text(key)
        if text is None:
            return None
        # the host too: profiles measured on the local devices (`profile=True`) hold this machine's times
        digest = hashlib.sha256(f"{profile_code_version()}|{platform.node()}|{text}".encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest[2:]}.pkl"

    def _read(self, key: tuple) -> Any:
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            with open(path, "rb") as src:
                stored_key, profile = pickle.load(src)
        except Exception:  # a damaged or partly written file: profile again
            return None
        return profile if stored_key == stable_text(key) else None

    def _write(self, key: tuple, profile: Any) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            with open(partial, "wb") as out:
                pickle.dump((stable_text(key), profile), out, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, path)  # readers see the whole file or none
        except OSError:
            pass  # a read-only or full disk costs speed, not answers


def stable_text(key: Any) -> str | None:
    """`key` as text that is the same in every process, or None when part of it is not (a lambda, an object
    printed with its address)."""
    if isinstance(key, tuple):
        parts = [stable_text(k) for k in key]
        return None if any(p is None for p in parts) else "(" + ",".join(parts) + ")"
    if isinstance(key, (types.FunctionType, types.BuiltinFunctionType, type)):
        name = f"{key.__module__}.{key.__qualname__}"
        return None if "<" in name else name  # <lambda>, <locals>: defined at run time
    text = repr(key)
    return None if " at 0x" in text else text


@functools.lru_cache(maxsize=1)
def profile_code_version() -> str:
    """A hash of the source that computes profiles (computed once per process)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for part in _PROFILE_CODE:
        target = root / part
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
