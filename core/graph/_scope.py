"""Where an operator comes from in the user's code, for messages and views."""

from __future__ import annotations

import re
from typing import Any
_TRANSFORM = re.compile(r"^(?:jvp|transpose|vmap|jit|pjit|remat|checkpoint|custom_jvp|custom_vjp)\((.*)\)$")


def user_scope(node: Any) -> str:
    """Where an operator comes from in the user's code: its module path with JAX's transforms taken off
    (`jvp(LinenLM)/_Block_0/Dense_0` -> `LinenLM/_Block_0/Dense_0`), or, for plain functions whose name
    stack holds only transforms, the function and line that made it (`attention (_gpt.py:83)`)."""
    parts = []
    for segment in node.scope.split("/"):
        while (found := _TRANSFORM.match(segment)) is not None:
            segment = found.group(1)
        if segment:
            parts.append(segment)
    if parts:
        return "/".join(parts)
    where = re.match(r"^(.*?):(\d+)(?::\d+)? \((.*)\)$", node.source)
    if where is None:
        return node.source
    path, line, function = where.groups()
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"
