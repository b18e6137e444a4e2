"""The step-name scanner: which step names a workflow's code can call, read from its source.

`fusee.testing.TestEngine.mock_step` checks the name it is given against
these, so that a mock of a step the code never calls (a typo, a renamed
step) fails at once instead of silently mocking nothing.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

# The Ctx methods whose first argument names a step function (what mocks replace).
_STEP_METHODS = frozenset({"step", "await_completion"})
# How deep `_step_names` follows ctx into helper functions.
_HELPER_DEPTH = 4


def _step_names(fn: Callable[..., Any]) -> set[str] | None:
    """The step names workflow function ``fn`` can call, or None if they cannot all be known.

    Read from the source: literal names given to ``ctx.step``/``ctx.await_completion``
    in ``fn`` (nested functions included) and in the functions ``fn`` passes its
    ctx to. None when a source is not available, a name is not a literal, or
    ctx goes anywhere else (stored, passed to something that is not a plain
    function): the names used there cannot be read.

    Example:
        >>> async def wf(ctx):
        ...     await ctx.step("a", lambda: 1)
        ...     await ctx.step(f"b-{1}", lambda: 1)
        >>> _step_names(wf) is None
        True
    """
    names: set[str] = set()
    params = _positional_params(fn)
    if not params:
        return None
    return names if _scan(fn, params[0], names, set(), 0) else None


def _positional_params(fn: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def _function_node(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == fn.__name__:
            return node
    return None


def _scan(fn: Callable[..., Any], ctx: str, names: set[str], seen: set[object], depth: int) -> bool:
    """Adds the step names ``fn`` gives its parameter ``ctx``; False when it cannot tell."""
    fn = inspect.unwrap(fn)
    key = (getattr(fn, "__code__", fn), ctx)
    if key in seen:
        return True
    seen.add(key)
    node = _function_node(fn)
    if node is None or depth > _HELPER_DEPTH:
        return False
    handled: set[int] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and _is_name(sub.value, ctx):
            handled.add(id(sub.value))
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Attribute) and _is_name(func.value, ctx):
            if func.attr in _STEP_METHODS:
                first = sub.args[0] if sub.args else _keyword(sub, "name")
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    return False
                names.add(first.value)
            continue
        passed: list[tuple[int | None, str | None]] = [
            (i, None) for i, a in enumerate(sub.args) if _is_name(a, ctx)
        ]
        passed += [(None, k.arg) for k in sub.keywords if _is_name(k.value, ctx)]
        if not passed:
            continue
        helper = _resolve(fn, func)
        if helper is None:
            return False
        params = _positional_params(helper)
        for index, keyword in passed:
            if keyword is None and (index is None or index >= len(params)):
                return False
            param = keyword if keyword is not None else params[index or 0]
            if not _scan(helper, param, names, seen, depth + 1):
                return False
        for a in [*sub.args, *(k.value for k in sub.keywords)]:
            if _is_name(a, ctx):
                handled.add(id(a))
    # Any other use of ctx (stored, returned, starred) goes where it cannot be followed.
    return all(
        id(sub) in handled
        for sub in ast.walk(node)
        if isinstance(sub, ast.Name) and sub.id == ctx and isinstance(sub.ctx, ast.Load)
    )


def _is_name(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _resolve(fn: Callable[..., Any], func: ast.expr) -> Callable[..., Any] | None:
    """The plain function a call's ``func`` names in ``fn``'s scope, or None."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    try:
        scope = {**getattr(fn, "__globals__", {}), **inspect.getclosurevars(fn).nonlocals}
    except (TypeError, ValueError):
        return None
    obj = scope.get(func.id)
    for attr in reversed(parts):
        obj = getattr(obj, attr, None)
    obj = inspect.unwrap(obj) if callable(obj) else None
    return obj if inspect.isfunction(obj) else None
