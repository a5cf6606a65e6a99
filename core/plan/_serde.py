"""Frozen dataclasses <-> JSON-ready data, driven by the type hints.

Decoding checks every field against its annotation and names the exact path
of a bad value, e.g. `plan.stages[1].submesh: expected 2 items, got 3`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union


class PlanFormatError(ValueError):
    """A plan or pins document does not match the schema."""


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
