"""Payloads on their way to and from a store: the codec chain, offload, limits.

The engine, a Client and the readers (CLI, UI) keep their journals' payloads
as converted bytes in memory; this layer sits at the store's door. On
``append`` each record's payload fields (`PAYLOAD_FIELDS`) go through the
codec chain and, when larger than ``offload_over``, to the blob store; on
``load`` they come back. The journal's structure (kinds, positions, names,
sequence numbers) is never touched, and a store without a chain or blobs is
not wrapped at all: today's bytes, read as they are.

An encoded payload is an envelope that no converted payload can be
(converted payloads are msgpack, or the converter's typed form: 0xC1, the
one byte msgpack never uses, then a header length that is never 0)::

    bytes 0-1  0xC1 0x00
    bytes 2..  msgpack [codec ids in encoding order, body, reference]

where the reference is None (the body is the encoded bytes) or
``[blob key, SHA-256 of the blob]`` (the body is empty, the blob holds the
encoded bytes). A payload's codec ids go with it, so key rotation works:
a process decodes what any chain wrote, as long as it has those codecs.
The `Start` record's ``codec`` field (one per run, the reference's) stays
0: a chain per payload lets a run span a change of chain, and keeps the
pure core (`fusee.machine`) exactly the reference's.

The wrapper is installed on the store object itself (`install`): every
part of the engine that holds the store, and a test that holds it, go
through it. Appends stay in call order: an append that must write blobs
first holds the ones after it until it has handed its batch to the store,
and its blobs are synced before (a failed blob write is a `StoreError`:
nothing of the batch is stored, the engine writes it again).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import hashlib
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import msgpack

from fusee import _codec
from fusee.blobs import BlobStore, Directory
from fusee.codecs import PayloadCodec
from fusee.errors import CorruptRecord, PayloadError, PayloadTooLarge, StoreError
from fusee.record import (
    Attempt,
    Cancel,
    Child,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Event,
    Heartbeat,
    Kind,
    Record,
    Send,
    Signal,
    Start,
    Step,
    Update,
    UpdateDone,
    decode,
    encode,
)
from fusee.store import Entry, Store

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_OFFLOAD_OVER",
    "DEFAULT_WARN_RECORDS",
    "MARK",
    "PAYLOAD_FIELDS",
    "BlobRef",
    "Payloads",
    "RecordWatch",
    "blob_refs",
    "default_blobs",
    "delete_run_blobs",
    "install",
    "load_codecs",
    "parse_size",
    "payloads_of",
    "raw_load",
    "reader",
    "run_blobs",
    "too_many_records",
]

log = logging.getLogger("fusee.payloads")

MARK: Final = b"\xc1\x00"
"""The first bytes of an encoded payload (never those of a converted one)."""
# In every encoded record: records without it are passed through unread.
_MARK_BYTE: Final = b"\xc1"

DEFAULT_MAX_PAYLOAD: Final = 4 * 1024 * 1024
"""``Engine.open(max_payload=)``'s default: 4 MiB."""
DEFAULT_OFFLOAD_OVER: Final = 256 * 1024
"""``Engine.open(offload_over=)``'s default: 256 KiB."""
DEFAULT_WARN_RECORDS: Final = 10_000
"""``Engine.open(warn_records=)``'s default: a journal this long should continue as new."""

PAYLOAD_FIELDS: Final[dict[type, tuple[str, ...]]] = {
    Start: ("input",),
    Step: ("payload",),
    Attempt: ("error",),
    Signal: ("payload",),
    Child: ("input",),
    ChildDone: ("payload",),
    Send: ("payload",),
    Cancel: ("reason",),
    Done: ("payload",),
    Update: ("payload",),
    UpdateDone: ("payload",),
    Heartbeat: ("payload",),
    Completed: ("payload",),
    Chunk: ("payload",),
    Event: ("payload",),
}
"""The fields of each record kind that hold a payload (a Start's update too).

Recorded values (`ctx.now`, random numbers, uuids), search attributes and
who-did-it marks (``by``) are not payloads: they stay as they are.
"""

_KIND_OF: Final = {
    Start: Kind.START,
    Step: Kind.STEP,
    Attempt: Kind.ATTEMPT,
    Signal: Kind.SIGNAL,
    Child: Kind.CHILD,
    ChildDone: Kind.CHILD_DONE,
    Send: Kind.SEND,
    Cancel: Kind.CANCEL,
    Done: Kind.DONE,
    Update: Kind.UPDATE,
    UpdateDone: Kind.UPDATE_DONE,
    Heartbeat: Kind.HEARTBEAT,
    Completed: Kind.COMPLETED,
    Chunk: Kind.CHUNK,
    Event: Kind.EVENT,
}
_PAYLOAD_TAGS: Final = frozenset(int(k) for k in _KIND_OF.values())
# Byte 5 of an encoded record is its kind tag (see fusee.record).
_TAG_AT: Final = 5

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|kib|mb|mib|gb|gib)?\s*$", re.IGNORECASE)
_UNITS: Final = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 1000**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(value: object, what: str) -> int:
    """A size in bytes: an int, or text such as ``"4MiB"``, ``"256KiB"``, ``"1.5MB"``.

    Raises:
        ValueError: Not a size (says which option and what it takes).

    Example:
        >>> parse_size("4MiB", "max_payload"), parse_size(1000, "x"), parse_size("2 kb", "x")
        (4194304, 1000, 2000)
    """
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m is not None:
            return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])
    raise ValueError(
        f"{what} takes a size: bytes as an int, or text such as '4MiB', '256KiB', '1MB'; "
        f"got {value!r}"
    )


def load_codecs(spec: str) -> list[PayloadCodec]:
    """The codecs named by ``module:attr`` (a codec, a list of them, or a function making one).

    What ``--codecs`` of the CLI and the UI takes.

    Raises:
        ValueError: ``spec`` is not ``module:attr``, or names no codecs.

    Example:
        >>> load_codecs("fusee.codecs:Zstd")
        [Zstd(level=3)]
    """
    import importlib

    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--codecs takes module:attr (e.g. myapp.keys:CODECS), not {spec!r}")
    value: Any = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    if isinstance(value, type) or (callable(value) and not isinstance(value, PayloadCodec)):
        value = value()  # a class or a factory: keys are often read at call time
    codecs = [value] if isinstance(value, PayloadCodec) else list(value)
    for c in codecs:
        if not isinstance(c, PayloadCodec):
            raise ValueError(f"{spec} holds {c!r}, which is not a fusee.PayloadCodec")
    return codecs


@dataclasses.dataclass(frozen=True, slots=True)
class BlobRef:
    """A blob a journal refers to: its key and the SHA-256 of its bytes.

    Example:
        >>> BlobRef("ab/1/7-0", b"\\x00" * 32).key
        'ab/1/7-0'
    """

    key: str
    digest: bytes


def _run_key(id: str) -> str:
    # Any text may be a workflow id; keys stay ASCII of a fixed shape.
    return hashlib.sha256(id.encode()).hexdigest()[:32]


def _payload_values(rec: Record) -> Iterable[tuple[str, bytes]]:
    fields = PAYLOAD_FIELDS.get(type(rec), ())
    for name in fields:
        value = getattr(rec, name)
        if value:
            yield name, value
    if type(rec) is Start and rec.update is not None and rec.update.payload:
        yield "update", rec.update.payload


def _with(rec: Record, changes: dict[str, bytes]) -> Record:
    update = changes.pop("update", None)
    if update is not None:
        assert isinstance(rec, Start)
        assert rec.update is not None
        changes_any: dict[str, Any] = dict(changes)
        changes_any["update"] = dataclasses.replace(rec.update, payload=update)
        return dataclasses.replace(rec, **changes_any)
    fields: dict[str, Any] = changes
    return dataclasses.replace(rec, **fields)


class RecordWatch:
    """Warns, once per run, about a journal past ``limit`` records.

    The count itself is the run's own (the engine keeps it in the run's
    state, one addition per record); the engine hands it to `check` once a
    turn, not once a record.

    Example:
        >>> w = RecordWatch(2)
        >>> w.check("a", 1, 2); w.check("a", 1, 3); w.check("a", 1, 4)
        >>> w.warned("a", 1)
        True
    """

    __slots__ = ("_warned", "limit", "over")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        # The count past which `check` has something to say: a plain
        # comparison for the engine, None or not.
        self.over: int = limit if limit is not None else sys.maxsize
        self._warned: set[tuple[str, int]] = set()

    def check(self, id: str, run: int, records: int) -> None:
        """Run ``run`` of ``id`` has ``records`` records: logs the warning the first time past."""
        if records > self.over and (id, run) not in self._warned:
            assert self.limit is not None
            self._warned.add((id, run))
            log.warning("%s", too_many_records(id, run, records, self.limit))

    def ended(self, id: str, run: int) -> None:
        """Forgets an ended run."""
        self._warned.discard((id, run))

    def warned(self, id: str, run: int) -> bool:
        """Whether the warning about run ``run`` of ``id`` was logged."""
        return (id, run) in self._warned


def too_many_records(id: str, run: int, records: int, limit: int) -> str:
    """The warning about a long journal (the engine's log and the UI's run page).

    Example:
        >>> too_many_records("feed", 1, 10_001, 10_000)[:43]
        "run 'feed' (run 1) has 10,001 records, over"
    """
    return (
        f"run '{id}' (run {run}) has {records:,} records, over warn_records={limit:,}: "
        "every load and recovery replays them all; continue as new "
        "(ctx.continue_as_new(...)) to start a fresh journal"
    )


class Payloads:
    """An engine's (or a reader's) payload settings: codec chain, blobs, limits.

    Args:
        codecs: The codec chain, applied in list order on the way in.
        blobs: Where payloads over ``offload_over`` go (None: nowhere).
        offload_over: The encoded size above which a payload is offloaded.
        max_payload: The largest converted payload accepted at a door.
        lenient: A reader's mode: a payload that cannot be decoded becomes
            a text placeholder saying why, instead of an error.

    Example:
        >>> p = Payloads([], max_payload="1KiB")
        >>> p.check_size(b"x" * 10, "a signal")
        >>> p.active
        False
    """

    def __init__(
        self,
        codecs: Iterable[PayloadCodec] = (),
        *,
        blobs: BlobStore | None = None,
        offload_over: Any = DEFAULT_OFFLOAD_OVER,
        max_payload: Any = DEFAULT_MAX_PAYLOAD,
        lenient: bool = False,
    ) -> None:
        self.codecs: tuple[PayloadCodec, ...] = tuple(codecs)
        self.by_id: dict[str, PayloadCodec] = {}
        for c in self.codecs:
            if isinstance(c, type):
                raise TypeError(f"codecs takes codec instances: {c.__name__}(...), not the class")
            if not isinstance(c, PayloadCodec):
                raise TypeError(
                    f"codecs takes fusee.PayloadCodec values (id, encode, decode), not {c!r}"
                )
            if not isinstance(c.id, str) or not c.id:
                raise ValueError(f"codec {c!r} needs a non-empty text id")
            if c.id in self.by_id:
                raise ValueError(f"two codecs with id {c.id!r} in one chain")
            self.by_id[c.id] = c
        self._ids = [c.id for c in self.codecs]
        if blobs is not None and not isinstance(blobs, BlobStore):
            raise TypeError(f"blobs takes a fusee.BlobStore (put, get, delete), not {blobs!r}")
        self.blobs = blobs
        self.offload_over = parse_size(offload_over, "offload_over")
        self.max_payload = None if max_payload is None else parse_size(max_payload, "max_payload")
        self.lenient = lenient
        # LSNs of records whose payloads were sealed before their encoding
        # (`seal_step`): the door passes them as they are.
        self.presealed: set[int] = set()

    @property
    def active(self) -> bool:
        """Whether the store needs wrapping (a chain, or a blob store)."""
        return bool(self.codecs) or self.blobs is not None

    def check_size(self, data: bytes, what: str) -> None:
        """Raises `fusee.PayloadTooLarge` when ``data`` is over ``max_payload``."""
        limit = self.max_payload
        if limit is not None and len(data) > limit:
            raise PayloadTooLarge(what, len(data), limit)

    # --- the way in -------------------------------------------------------------------------

    def seal_step(self, payload: bytes) -> bytes | None:
        """A step result's payload through the chain, before its record is encoded.

        The hot path's shortcut (the door would decode and encode the
        record again): None when there is no chain, or when the payload
        may go to the blob store (its key needs the record's position);
        the door seals those. The caller notes the record's LSN in
        `presealed`, so the door does not decode it to look.
        """
        if not self.codecs or not payload or payload[:2] == MARK:
            return None
        body = payload
        for c in self.codecs:
            body = c.encode(body)
        if self.blobs is not None and len(body) > self.offload_over:
            return None
        return MARK + msgpack.packb([self._ids, body, None], use_bin_type=True)

    def seal(self, entries: Sequence[Entry]) -> tuple[list[Entry], list[tuple[str, bytes]]]:
        """``entries`` with their payloads encoded, and the blobs to write before them."""
        out: list[Entry] = []
        puts: list[tuple[str, bytes]] = []
        chain = bool(self.codecs)
        over = self.offload_over if self.blobs is not None else None
        presealed = self.presealed
        for e in entries:
            data = e.data
            if presealed and e.lsn in presealed:
                presealed.discard(e.lsn)
                out.append(e)
                continue
            if (
                len(data) <= _TAG_AT
                or data[_TAG_AT] not in _PAYLOAD_TAGS
                or (not chain and (over is None or len(data) <= over))
            ):
                out.append(e)
                continue
            rec = decode(data)
            changes: dict[str, bytes] = {}
            for i, (name, value) in enumerate(_payload_values(rec)):
                if value[:2] == MARK:
                    continue  # already sealed (a copy of a sealed journal)
                sealed = self._seal_one(value, e, i, puts)
                if sealed is not value:
                    changes[name] = sealed
            out.append(Entry(e.lsn, e.id, e.run, encode(_with(rec, changes))) if changes else e)
        return out, puts

    def _seal_one(self, value: bytes, e: Entry, i: int, puts: list[tuple[str, bytes]]) -> bytes:
        body = value
        for c in self.codecs:
            body = c.encode(body)
        ref: list[Any] | None = None
        if self.blobs is not None and len(body) > self.offload_over:
            key = f"{_run_key(e.id)}/{e.run}/{e.lsn}-{i}"
            puts.append((key, body))
            ref = [key, hashlib.sha256(body).digest()]
            body = b""
        elif not self.codecs:
            return value
        return MARK + msgpack.packb([self._ids, body, ref], use_bin_type=True)

    # --- the way out ------------------------------------------------------------------------

    async def open_entries(
        self, id: str, entries: builtins.list[tuple[int, bytes]]
    ) -> builtins.list[tuple[int, bytes]]:
        """``entries`` (a journal as loaded) with their payloads decoded."""
        out: builtins.list[tuple[int, bytes]] = []
        for lsn, data in entries:
            if data.find(_MARK_BYTE, _TAG_AT + 1) < 0 or data[_TAG_AT] not in _PAYLOAD_TAGS:
                out.append((lsn, data))
                continue
            try:
                rec = decode(data)
            except CorruptRecord:
                out.append((lsn, data))  # the engine's own decode reports it
                continue
            changes: dict[str, bytes] = {}
            for name, value in _payload_values(rec):
                if value[:2] == MARK:
                    changes[name] = await self._open_one(id, rec, lsn, value)
            out.append((lsn, encode(_with(rec, changes))) if changes else (lsn, data))
        return out

    async def _open_one(self, id: str, rec: Record, lsn: int, value: bytes) -> bytes:
        try:
            return await self._decode(value)
        except _Unreadable as e:
            kind = _KIND_OF[type(rec)].name.title().replace("_", "")
            codec = f", codec '{e.codec}'" if e.codec else ""
            error = PayloadError(
                f"cannot read the payload of run '{id}' (run {rec.run}) at position {lsn} "
                f"({kind}{codec}): {e}"
            )
            if self.lenient:
                return _codec.encode(f"<unreadable payload: {error}>")
            raise error from None

    async def _decode(self, value: bytes) -> bytes:
        try:
            ids, body, ref = msgpack.unpackb(value[2:], raw=False, use_list=True)
        except Exception:
            raise _Unreadable("", "its envelope is damaged") from None
        if ref is not None:
            key, digest = ref
            if self.blobs is None:
                raise _Unreadable(
                    "", f"it is kept in blob {key}, and this process has no blob store (blobs=)"
                )
            blob = await asyncio.to_thread(self.blobs.get, key)
            if blob is None:
                raise _Unreadable("", f"its blob {key} is missing from {self.blobs!r}")
            if hashlib.sha256(blob).digest() != digest:
                raise _Unreadable("", f"its blob {key} in {self.blobs!r} was altered")
            body = blob
        for cid in reversed(ids):
            codec = self.by_id.get(cid)
            if codec is None:
                have = ", ".join(self._ids) or "none"
                raise _Unreadable(
                    cid,
                    f"it was encoded with codec '{cid}', which this process does not have "
                    f"(its codecs: {have}); give it the workers' codecs (codecs=[...]; "
                    "--codecs MODULE:ATTR for the fusee command and fusee ui)",
                )
            try:
                body = codec.decode(body)
            except PayloadError as e:
                raise _Unreadable(cid, str(e)) from None
            except Exception as e:
                raise _Unreadable(cid, f"{type(e).__name__}: {e}") from None
        return bytes(body)


class _Unreadable(Exception):
    def __init__(self, codec: str, message: str) -> None:
        super().__init__(message)
        self.codec = codec


def blob_refs(entries: Iterable[tuple[int, bytes]]) -> builtins.list[BlobRef]:
    """The blobs a journal refers to, read from its stored bytes (no codec needed).

    Give it the journal as the store holds it (``install``'s raw load:
    `raw_load`), e.g. to delete a run's blobs with its journal.

    Example:
        >>> blob_refs([])
        []
    """
    refs: builtins.list[BlobRef] = []
    for _lsn, data in entries:
        if data.find(_MARK_BYTE, _TAG_AT + 1) < 0 or data[_TAG_AT] not in _PAYLOAD_TAGS:
            continue
        for _name, value in _payload_values(decode(data)):
            if value[:2] == MARK:
                try:
                    _ids, _body, ref = msgpack.unpackb(value[2:], raw=False)
                except Exception:
                    continue
                if ref is not None:
                    refs.append(BlobRef(ref[0], ref[1]))
    return refs


# --- the store's door ---------------------------------------------------------------------


def _door_of(method: object) -> _Door | None:
    owner = getattr(method, "__self__", None)
    return owner if isinstance(owner, _Door) else None


class _Door:
    """The wrapped ``append`` and ``load`` of one store object."""

    def __init__(self, store: Store, payloads: Payloads) -> None:
        self.payloads = payloads
        # What the store did before this door: its own methods, or what a
        # test (or another layer) put there; an earlier door is replaced.
        before = _door_of(store.append)
        self.raw_append: Callable[..., Awaitable[None]] = (
            before.raw_append if before is not None else store.append
        )
        before = _door_of(store.load)
        self.raw_load: Callable[..., Awaitable[builtins.list[tuple[int, bytes]]]] = (
            before.raw_load if before is not None else store.load
        )
        # Completes once the last append that wrote blobs first has handed
        # its batch to the store (or failed): the appends after it wait.
        self._tail: asyncio.Future[None] | None = None

    def append(
        self, entries: Sequence[Entry], runs: Sequence[Any] = (), **options: Any
    ) -> Awaitable[None]:
        # Installed only for a chain or a blob store (`install`).
        sealed, puts = self.payloads.seal(entries)
        tail = self._tail
        if not puts and (tail is None or tail.done()):
            return self.raw_append(sealed, runs, **options)
        if tail is not None and tail.done():
            tail = None  # its failure, if any, was reported to its caller
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tail = mine
        return self._append_after(tail, mine, puts, sealed, runs, options)

    async def _append_after(
        self,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
        puts: list[tuple[str, bytes]],
        entries: list[Entry],
        runs: Sequence[Any],
        options: dict[str, Any],
    ) -> None:
        try:
            if puts:
                blobs = self.payloads.blobs
                assert blobs is not None
                try:
                    await asyncio.to_thread(_put_all, blobs, puts)
                except Exception as e:
                    raise StoreError(
                        f"writing a blob to {blobs!r} failed ({type(e).__name__}: {e}); "
                        "the records that refer to it were not stored"
                    ) from e
            if before is not None:
                await asyncio.shield(before)
        except BaseException as e:
            if not mine.done():
                mine.set_exception(e if isinstance(e, StoreError) else StoreError(str(e)))
                mine.exception()  # retrieved: the callers after it read it
            raise
        write = self.raw_append(entries, runs, **options)
        mine.set_result(None)
        await write

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        entries = await self.raw_load(id, run, after_lsn=after_lsn)
        return await self.payloads.open_entries(id, entries)


def _put_all(blobs: BlobStore, puts: list[tuple[str, bytes]]) -> None:
    for key, data in puts:
        blobs.put(key, data)


def install(store: Store, payloads: Payloads, *, always: bool = False) -> Store:
    """Makes ``store``'s ``append`` and ``load`` go through ``payloads``; returns ``store``.

    Installing again replaces the earlier door. ``append`` goes through it
    only when ``payloads`` has a chain or a blob store: otherwise the store's
    own ``append`` stays, with nothing in front of it. A `Payloads` that
    needs no door takes an earlier door away, unless ``always`` (an engine
    or a reader: its ``load`` says what an encoded payload needs).

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> store = install(MemoryStore(), Payloads([]), always=True)
        >>> _door_of(store.load) is not None, _door_of(store.append) is None
        (True, True)
    """
    door = _Door(store, payloads)
    if payloads.active:
        store.append = door.append  # type: ignore[method-assign,assignment]
    else:
        _put_back(store, "append", door.raw_append)
    if payloads.active or always:
        store.load = door.load  # type: ignore[method-assign]
    else:
        _put_back(store, "load", door.raw_load)
    return store


def _put_back(store: Store, name: str, raw: Callable[..., Any]) -> None:
    """Makes ``store.<name>`` ``raw`` again, what it was before any door."""
    if getattr(store, name) == raw:
        return
    if getattr(raw, "__self__", None) is store and getattr(type(store), name, None) is getattr(
        raw, "__func__", None
    ):
        # The store's own method: no instance attribute left in front of it.
        delattr(store, name)
    else:
        setattr(store, name, raw)


def payloads_of(store: Store) -> Payloads | None:
    """The `Payloads` installed on ``store`` (None: none).

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> payloads_of(MemoryStore()) is None
        True
    """
    door = _door_of(store.load)
    return door.payloads if door is not None else None


async def raw_load(
    store: Store, id: str, run: int | None = None
) -> builtins.list[tuple[int, bytes]]:
    """A journal as the store holds it (payloads still encoded), through any installed door.

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> async def demo() -> int:
        ...     store = install(MemoryStore(), Payloads([]), always=True)
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, encode(Start(1, "a", "wf")))])
        ...     return len(await raw_load(store, "a"))
        >>> asyncio.run(demo())
        1
    """
    door = _door_of(store.load)
    load = door.raw_load if door is not None else store.load
    entries: builtins.list[tuple[int, bytes]] = await load(id, run)
    return entries


async def run_blobs(store: Store, id: str, run: int | None = None) -> builtins.list[BlobRef]:
    """The blobs run ``run`` of ``id`` refers to (what deleting the run deletes).

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> async def demo() -> list[BlobRef]:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, encode(Start(1, "a", "wf")))])
        ...     return await run_blobs(store, "a", 1)
        >>> asyncio.run(demo())
        []
    """
    return blob_refs(await raw_load(store, id, run))


async def delete_run_blobs(store: Store, id: str, run: int | None = None) -> int:
    """Deletes the blobs of run ``run`` of ``id`` from the store's blob store; returns how many.

    Call it before the run's journal is deleted (its references are read
    from the journal). A store without blobs deletes none.

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> async def demo() -> int:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, encode(Start(1, "a", "wf")))])
        ...     return await delete_run_blobs(store, "a", 1)
        >>> asyncio.run(demo())
        0
    """
    payloads = payloads_of(store)
    if payloads is None or payloads.blobs is None:
        return 0
    refs = await run_blobs(store, id, run)
    blobs = payloads.blobs
    for ref in refs:
        await asyncio.to_thread(blobs.delete, ref.key)
    return len(refs)


def default_blobs(target: str) -> BlobStore | None:
    """The blob store beside an SQLite data directory (``<dir>/blobs``); None for others.

    Example:
        >>> default_blobs("memory") is None, default_blobs("./data")
        (True, Directory('data/blobs'))
    """
    if target == "memory" or "://" in target:
        return None
    from pathlib import Path

    return Directory(Path(target) / "blobs")


def reader(
    store: Store, target: str, codecs: Iterable[PayloadCodec] = (), *, strict: bool = False
) -> Store:
    """``store`` set up for a reader (CLI, UI): ``codecs``, the default blobs, placeholders.

    A payload it cannot decode (no codecs given, a missing key, a missing
    blob) reads as a text placeholder saying why, so a page or a command
    still shows the rest of the journal; with ``strict`` (a replay, a
    check) it raises `fusee.PayloadError` instead.

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> "load" in vars(reader(MemoryStore(), "memory"))
        True
    """
    payloads = Payloads(codecs, blobs=default_blobs(target), max_payload=None, lenient=not strict)
    # Always a door: without codecs it still says what an encoded payload needs.
    return install(store, payloads, always=True)


async def delete_blobs_of(store: Store, ids: Iterable[str]) -> None:
    """Deletes the blobs of every run of ``ids``, which the store has deleted.

    A run's blob keys start with its id's key, so they are found without
    its journal. An id started again at once may lose a blob its new run
    wrote meanwhile: read, that payload is a clear `fusee.PayloadError`,
    never a wrong value.

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> asyncio.run(delete_blobs_of(MemoryStore(), ["a"]))  # a store without blobs
    """
    payloads = payloads_of(store)
    if payloads is None or payloads.blobs is None:
        return
    blobs = payloads.blobs
    for id in ids:
        await asyncio.to_thread(blobs.delete_prefix, _run_key(id) + "/")
