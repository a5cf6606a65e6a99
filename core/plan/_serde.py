"""Frozen dataclasses <-> JSON-ready data, driven by the type hints.

Decoding checks every field against its annotation and names the exact path
of a bad value, e.g. `plan.stages[1].submesh: expected 2 items, got 3`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from typing import Any, Literal, Union

import numpy as np


class PlanFormatError(ValueError):
    """A plan or pins document does not match the schema."""


MAX_DOCUMENT_BYTES = 64 * 2**20  # a plan of the largest suite model is well under 1 MiB
MAX_NESTING = 32  # the schema nests about 8 levels deep


def load_json(text: str | bytes, what: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse a JSON document in bounded time and memory, or raise PlanFormatError saying why.

    Refuses documents over `max_bytes`, nested deeper than the schema can
    be, NaN or Infinity, and numbers too long to convert.
    """
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise PlanFormatError(f"{what}: the document is {len(text)} bytes, over the {max_bytes}-byte limit")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PlanFormatError(f"{what}: not UTF-8 text ({err})") from None
    if not isinstance(text, str):
        raise PlanFormatError(f"{what}: expected JSON text, got {type(text).__name__}")
    if len(text) > max_bytes:
        raise PlanFormatError(f"{what}: the document is {len(text)} characters, over the {max_bytes} limit")
    depth = _max_nesting(text)
    if depth > MAX_NESTING:
        raise PlanFormatError(f"{what}: nested {depth} levels deep; a valid document nests at most {MAX_NESTING}")

    def refuse_constant(name: str) -> Any:
        raise PlanFormatError(f"{what}: {name} is not a valid number here; every figure must be finite")

    try:
        return json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as err:
        raise PlanFormatError(f"{what}: not valid JSON ({err})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer with more digits than Python converts
        if isinstance(err, PlanFormatError):
            raise
        raise PlanFormatError(f"{what}: unreadable number or structure ({err})") from None


# A JSON string, escapes included; an unterminated one runs to the end (possessive: no backtracking).
_STRING = re.compile(r'(?s)"(?:[^"\\]++|\\.?)*+(?:"|\Z)')
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)
_CHUNK = 1 << 22


def _max_nesting(text: str) -> int:
    """The deepest bracket nesting outside strings, before any recursive parse.

    Strings are blanked by one regex pass and the depth is a running sum over
    the bytes, both in C: a 60 MB document is scanned in well under a second
    (a character loop in Python took 17 s).
    """
    bare = _STRING.sub('""', text).encode("utf-8", "replace")
    depth = deepest = 0
    for start in range(0, len(bare), _CHUNK):
        chunk = np.frombuffer(bare, np.uint8, count=min(_CHUNK, len(bare) - start), offset=start)
        steps = np.isin(chunk, _OPEN).astype(np.int32) - np.isin(chunk, _CLOSE).astype(np.int32)
        running = depth + np.cumsum(steps)
        if running.size:
            deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def to_jsonable(obj: Any) -> Any:
    """Dataclasses become dicts, tuples become lists; floats stay floats."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    return obj


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_jsonable(tp: Any, data: Any, path: str) -> Any:
    """Decode `data` as type `tp`, raising PlanFormatError naming `path` on a mismatch."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return data
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, path)
    if origin in (Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return from_jsonable(option, data, path)
            except PlanFormatError as err:
                errors.append(str(err))
        raise PlanFormatError(f"{path}: {data!r} matches none of {args}")
    if tp is type(None):
        if data is not None:
            raise PlanFormatError(f"{path}: expected null, got {data!r}")
        return None
    if origin is Literal:
        if data not in args:
            raise PlanFormatError(f"{path}: expected one of {list(args)}, got {data!r}")
        return data
    if origin is tuple:
        if not isinstance(data, (list, tuple)):
            raise PlanFormatError(f"{path}: expected a list, got {type(data).__name__} {data!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        if len(data) != len(args):
            raise PlanFormatError(f"{path}: expected {len(args)} items, got {len(data)}")
        return tuple(from_jsonable(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if tp is float:
        if data in ("inf", "-inf"):
            return float(data)
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise PlanFormatError(f"{path}: expected a number, got {data!r}")
        if math.isnan(data) or abs(data) > 1e300:
            raise PlanFormatError(f"{path}: expected a finite number, got {data!r}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise PlanFormatError(f"{path}: expected an integer, got {data!r}")
        return data
    if tp in (str, bool):
        if not isinstance(data, tp):
            raise PlanFormatError(f"{path}: expected {tp.__name__}, got {data!r}")
        return data
    raise TypeError(f"cannot decode type {tp!r} at {path}")


def _decode_dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise PlanFormatError(f"{path}: expected an object, got {type(data).__name__} {data!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PlanFormatError(f"{path}: unknown field(s) {unknown}; expected {sorted(fields)}")
    kwargs = {}
    for name, field in fields.items():
        if name not in data:
            has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
            if has_default:
                continue
            raise PlanFormatError(f"{path}.{name}: missing required field")
        kwargs[name] = from_jsonable(hints[name], data[name], f"{path}.{name}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise PlanFormatError(f"{path}: {err}") from err
