"""Where journals live: the `Store` protocol, its value types, and `open_store`.

A store keeps, durably, each run's journal (encoded records, as opaque bytes
in log-sequence order), one `RunRow` per workflow id (its latest run: for
listing, describing and recovery), and the commands inbox: `Command` rows
that clients post (`fusee.Client`, the CLI) and the serving engine takes,
applies and answers (`Answer`). The engine talks to storage only through
`Store`; `MemoryStore` (tests, ``"memory"``), `SqliteStore` (a directory) and
`PostgresStore` (a ``postgresql://`` URL) implement it. Each backend's module
is imported when first named, so ``import fusee`` never imports asyncpg.

The rule: a store never alters, reorders or interprets record bytes, and an
append is all or nothing. Decoding is the engine's job (`fusee.record`), so a
damaged record comes back exactly as it was stored.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

from fusee._status import UNFINISHED_STATUSES
from fusee.errors import StoreError
from fusee.store._base import (
    COMMAND_KINDS,
    RUN_STATUSES,
    Answer,
    Command,
    Entry,
    RunRow,
    Store,
    _check_durability,
    load_journal,
)
from fusee.store._schedules import ScheduleRow

if TYPE_CHECKING:
    from fusee.store.memory import MemoryStore
    from fusee.store.postgres import PostgresStore
    from fusee.store.sqlite import SqliteStore

__all__ = [
    "COMMAND_KINDS",
    "RUN_STATUSES",
    "UNFINISHED_STATUSES",
    "Answer",
    "Command",
    "Entry",
    "MemoryStore",
    "PostgresStore",
    "RunRow",
    "ScheduleRow",
    "SqliteStore",
    "Store",
    "load_journal",
    "open_store",
]


def open_store(
    target: str | os.PathLike[str],
    *,
    durability: str = "fsync",
    readonly: bool = False,
    client: bool = False,
    accept_loss: bool = False,
) -> Store:
    """Makes the store a target names; the caller then awaits its ``open()``.

    Args:
        target: A directory path (a `SqliteStore` keeping ``fusee.db`` there),
            ``"memory"`` (a `MemoryStore`, which keeps nothing after the
            process ends), or a ``postgresql://`` (or ``postgres://``) URL (a
            `PostgresStore` in that database's ``fusee`` schema; needs the
            ``postgres`` extra).
        durability: ``"fsync"`` (each append is on disk when it returns) or
            ``"none"`` (the OS writes when it likes: for tests and demos).
        readonly: Open an existing store to read only (the CLI's way, while an
            engine writes it).
        client: Open it as a client (`fusee.Client`): it reads, and writes
            nothing but commands to the inbox; it never takes the engine's
            writer lock, so it works while an engine serves the store.
        accept_loss: Open an SQLite store that is behind its high-water mark,
            logging and recording the loss (see `SqliteStore`); other stores
            keep no such mark.

    Returns:
        The store, not opened yet.

    Raises:
        ValueError: ``durability`` is not one the store knows.
        StoreError: The target is a URL of another kind, or ``"memory"`` with
            ``readonly=True`` or ``client=True``.

    Example:
        >>> type(open_store("memory")).__name__
        'MemoryStore'
        >>> open_store("postgresql://app:secret@db/fusee")
        PostgresStore('postgresql://app:***@db/fusee', schema='fusee')
        >>> open_store("mysql://db/fusee")
        Traceback (most recent call last):
        fusee.errors.StoreError: 'mysql' stores are not supported; pass a directory path ...
    """
    _check_durability(durability)
    if readonly and client:
        raise ValueError("a store opens read-only or as a client, not both")
    if isinstance(target, str) and target == "memory":
        if readonly or client:
            raise StoreError(
                "a memory store keeps nothing to read; pass the directory of an engine's store"
                " (or, in one process, the engine's MemoryStore itself)"
            )
        from fusee.store.memory import MemoryStore

        return MemoryStore()
    if isinstance(target, str) and "://" in target:
        scheme = target.split("://", 1)[0]
        if scheme in {"postgres", "postgresql"}:
            from fusee.store.postgres import PostgresStore

            return PostgresStore(target, durability=durability, readonly=readonly, client=client)
        raise StoreError(
            f"{scheme!r} stores are not supported; pass a directory path (an SQLite store, "
            "the default), a postgresql:// URL or 'memory'"
        )
    from fusee.store.sqlite import SqliteStore

    return SqliteStore(
        target, durability=durability, readonly=readonly, client=client, accept_loss=accept_loss
    )


_BACKENDS: Final = {
    "MemoryStore": "fusee.store.memory",
    "SqliteStore": "fusee.store.sqlite",
    "PostgresStore": "fusee.store.postgres",
}


def __getattr__(name: str) -> Any:
    # Backends load when first named (they build on the names above, and
    # the Postgres one must not cost its users' neighbours an import).
    module = _BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
