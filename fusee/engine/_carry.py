"""What a run that continues as new carries into the next: the messages it already took.

A signal resent with its dedup id, or an update resent with its id, must
count once even when the run that took it has continued as new meanwhile.
The next run's `Start` therefore carries, in `Meta.carried`, the dedup ids
of the signals and the ids and outcomes of the updates that its id's earlier
runs took, and loading that run seeds its dedup sets from it.

The rule: what is carried is bounded, the newest kept (`DEDUPS_KEPT` signal
dedup ids, `UPDATES_KEPT` updates), so that an id that continues as new
forever does not grow its `Start` forever. A resend older than the bound
counts again, as a resend after Temporal's request-id window does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

import msgpack

from fusee.errors import CorruptRecord
from fusee.record import Meta, Signal, Start, Status, Update, UpdateDone

if TYPE_CHECKING:
    from fusee.engine._state import RunState
    from fusee.record import Record

__all__ = [
    "DEDUPS_KEPT",
    "UPDATES_KEPT",
    "Carried",
    "carried_by",
    "carried_from_records",
    "carried_from_state",
    "carried_of",
    "seed",
]

T = TypeVar("T")
K = TypeVar("K")

DEDUPS_KEPT = 1000
"""Signal dedup ids carried into the next run: 1,000 ids cost 9 KB per `Start`."""

UPDATES_KEPT = 100
"""Updates (id and outcome) carried into the next run: an outcome holds the
handler's result, which can be larger than an id."""

# (dedup ids oldest first, (update id, status, result) oldest first)
Carried = tuple[list[int], list[tuple[str, Status, bytes]]]


def carried_of(meta: Meta | None) -> Carried:
    """The dedup ids and update outcomes a `Start`'s meta carries.

    Raises:
        CorruptRecord: ``meta.carried`` is not what `carried_by` writes.

    Example:
        >>> carried_of(None)
        ([], [])
        >>> carried_of(Meta(carried=_pack([[7], [["u-1", 0, b"\\x01"]]])))
        ([7], [('u-1', <Status.OK: 0>, b'\\x01')])
    """
    if meta is None or not meta.carried:
        return [], []
    try:
        dedups, updates = msgpack.unpackb(meta.carried, use_list=True, raw=False)
        ids = [int(d) for d in dedups if type(d) is int and d > 0]
        outcomes = [(str(u), Status(s), bytes(p)) for u, s, p in updates]
    except Exception as e:  # msgpack and the unpacking raise several unrelated types
        raise CorruptRecord(f"a Start's carried messages do not decode: {e!r}") from None
    return ids, outcomes


def carried_by(
    before: Carried, signals: Iterable[Signal], updates: Iterable[tuple[str, Status, bytes]]
) -> Meta | None:
    """The meta of the next run's `Start`: ``before`` and this run's messages, bounded.

    Args:
        before: What this run's own `Start` carried.
        signals: This run's signals, oldest first (those without a dedup id
            are skipped).
        updates: This run's updates that have an outcome, oldest first.

    Returns:
        The meta, or None when nothing is carried.

    Example:
        >>> meta = carried_by(([1, 2], []), [Signal(2, "go", 3, b"")], [])
        >>> carried_of(meta)
        ([1, 2, 3], [])
    """
    ids = _newest([*before[0], *(s.dedup for s in signals if s.dedup)], DEDUPS_KEPT, lambda d: d)
    outcomes = _newest([*before[1], *updates], UPDATES_KEPT, lambda u: u[0])
    if not ids and not outcomes:
        return None
    return Meta(carried=_pack([ids, [[u, int(s), p] for u, s, p in outcomes]]))


def carried_from_state(state: RunState) -> Meta | None:
    """`carried_by` for a loaded run that continues as new."""
    ordinals = {ordinal: id for id, ordinal in state.update_ids.items()}
    updates = [
        (ordinals[ordinal], status, payload)
        for ordinal, (status, payload) in sorted(state.update_outcomes.items())
        if ordinal in ordinals
    ]
    before = (state.carried_dedups, [(u, *o) for u, o in state.carried_updates.items()])
    return carried_by(before, state.signals, updates)


def carried_from_records(records: Iterable[Record]) -> Meta | None:
    """`carried_by` for a run's journal (a continue-as-new finished at recovery)."""
    before: Carried = ([], [])
    signals: list[Signal] = []
    ids: list[str] = []
    updates: list[tuple[str, Status, bytes]] = []
    for rec in records:
        if isinstance(rec, Signal):
            signals.append(rec)
        elif isinstance(rec, Update):
            ids.append(rec.id)
        elif isinstance(rec, UpdateDone):
            if rec.ordinal < len(ids):
                updates.append((ids[rec.ordinal], rec.status, rec.payload))
        elif isinstance(rec, Start):
            before = carried_of(rec.meta)
    return carried_by(before, signals, updates)


def seed(state: RunState, meta: Meta | None) -> None:
    """Seeds a run's dedup sets with what its `Start` carried."""
    ids, outcomes = carried_of(meta)
    state.carry(ids, outcomes)


def _newest(items: list[T], kept: int, key: Callable[[T], K]) -> list[T]:
    """The last ``kept`` of ``items`` by ``key``, each key once (at its newest), oldest first."""
    seen: set[K] = set()
    out: list[T] = []
    for item in reversed(items):
        k = key(item)
        if k in seen:
            continue
        seen.add(k)
        out.append(item)
        if len(out) == kept:
            break
    out.reverse()
    return out


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)
