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
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replaces a frozen slotted dataclass's ``__init__`` with a faster one.

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
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    namespace: dict[str, Any] = {}
    params: list[str] = []
    body: list[str] = []
    for f in fields:
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"fast_init does not support field {f.name!r} of {cls.__name__}")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
