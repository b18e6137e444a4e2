"""The store a command names (``--data DIR`` or ``--store URL``), opened read-only.

The rule: reading commands never write the store: it is opened read-only,
so they work while an engine writes it from another process.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from fusee._jsonview import payload as payload_json
from fusee._payloads import load_codecs, reader
from fusee.cli._output import CliError
from fusee.record import Done, Status, decode
from fusee.store import RunRow, Store, open_store
from fusee.store._redact import shown_target

if TYPE_CHECKING:
    from fusee.codecs import PayloadCodec

# The statuses of runs that have ended for good: their journal ends with Done.
FINISHED: Final = frozenset({"completed", "failed", "cancelled"})
# How often commands that wait (show --follow, result --wait, the worker) look again.
POLL_S: Final = 0.1


def store_target(args: argparse.Namespace) -> str:
    store: str | None = getattr(args, "store", None)
    data: str | None = getattr(args, "data", None)
    if store is not None and data is not None:
        raise CliError("pass --data DIR or --store URL, not both")
    target = store if store is not None else (data if data is not None else "data")
    if target == "memory":
        raise CliError(
            "a memory store keeps nothing between processes; pass the directory of a store"
        )
    return target


def store_shown(args: argparse.Namespace) -> str:
    """The store a command names, as its messages show it: a URL's password as ``***``."""
    return shown_target(store_target(args))


def codecs_of(args: argparse.Namespace) -> list[PayloadCodec]:
    """The codecs ``--codecs MODULE:ATTR`` names (none without it)."""
    spec: str | None = getattr(args, "codecs", None)
    if not spec:
        return []
    try:
        return load_codecs(spec)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        raise CliError(f"--codecs {spec}: {e}") from None


@contextlib.asynccontextmanager
async def reading(args: argparse.Namespace, *, strict: bool = False) -> AsyncIterator[Store]:
    """The store, read-only, its payloads decoded with ``--codecs``.

    A payload that cannot be decoded reads as a placeholder saying why,
    unless ``strict`` (replay, check), where it raises `fusee.PayloadError`.
    """
    target = store_target(args)
    store = reader(open_store(target, readonly=True), target, codecs_of(args), strict=strict)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def get_row(store: Store, id: str, where: str) -> RunRow:
    row = await store.get(id)
    if row is None:
        raise CliError(f"no run {id!r} in {where}; `fusee list` shows the runs there are")
    return row


def done_record(entries: Sequence[tuple[int, bytes]]) -> Done | None:
    if not entries:
        return None
    rec = decode(entries[-1][1])
    return rec if isinstance(rec, Done) else None


def outcome_of(done: Done) -> dict[str, Any]:
    """A run's end as JSON: its result, or its error."""
    value = payload_json(done.payload)
    status = done.status
    if status is Status.OK:
        return {"status": "completed", "result": value}
    if status is Status.CANCELLED:
        return {"status": "cancelled", "error": {"type": "Cancelled", "message": value}}
    if status is Status.CONTINUED:
        return {"status": "continued", "result": value}
    if isinstance(value, list) and len(value) >= 2:
        error = {"type": str(value[0]), "message": str(value[1])}
        if len(value) >= 3:
            error["traceback"] = str(value[2])
    else:
        error = {"type": "Error", "message": str(value)}
    return {"status": "failed", "error": error}
