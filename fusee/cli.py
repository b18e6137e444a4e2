"""The ``fusee`` command: look into a store and operate its runs from a shell.

::

    fusee list [--status S] [--workflow W] [--attr K=V]   the runs of a store
    fusee show ID [--follow]                              a run and its journal, as a timeline
    fusee result ID [--wait]                              a run's result
    fusee start MODULE:WORKFLOW ID [JSON]                 start a run
    fusee signal ID NAME [JSON] | cancel ID | resume ID   act on a run
    fusee worker MODULE...                                serve a module's workflows
    fusee replay MODULE...                                replay every journal against the code
    fusee disk-check [DIR]                                the flush latency of a disk

Reading commands (``list``, ``show``, ``result``, ``replay``) open the store
read-only: they work while an engine writes it from another process.

The rule: one engine writes a store. So the commands that change runs
(``start``, ``signal``, ``cancel``, ``resume``) never open an engine: they
drop a command file in the store's inbox (``DATA/inbox/*.json``), and the
one ``fusee worker`` serving the directory (it holds ``DATA/worker.lock``)
applies it with its engine and answers. With no worker running, the command
waits in the inbox and the next worker applies it when it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import fcntl
import importlib
import importlib.util
import json
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Final, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusee import _codec
from fusee._definitions import WorkflowDef
from fusee._definitions import signal as signal_def
from fusee._driver import ReplayHost, RunDriver
from fusee.engine import Engine, IdPolicy
from fusee.errors import DeterminismError, FuseeError, NotFound, PayloadError, StoreError
from fusee.record import (
    DETACHED,
    PAUSED,
    Attempt,
    Attributes,
    Awaiting,
    Cancel,
    Child,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Fired,
    Heartbeat,
    Patch,
    Record,
    Resume,
    Send,
    Signal,
    Start,
    Status,
    Step,
    StreamEnd,
    Timer,
    Update,
    UpdateDone,
    Value,
    Wait,
    Waited,
    decode,
    stream,
    value_kind,
)
from fusee.store import RUN_STATUSES, RunRow, Store, open_store

__all__ = ["main", "writer_lock"]

_FINISHED: Final = frozenset({"completed", "failed", "cancelled"})
_LOCK_FILE: Final = "worker.lock"
_INBOX: Final = "inbox"
_REPLIES: Final = "replies"
_POLL_S: Final = 0.1
# How long a finished command's answer stays in the inbox for its sender.
_REPLY_TTL_S: Final = 3600.0


class _CliError(Exception):
    """A failure to report as one line on stderr, with exit status 1."""


# --- output --------------------------------------------------------------------------------------


class _Output:
    """Where a command writes: rich text for people, or JSON with ``--json``."""

    def __init__(self, stdout: TextIO, stderr: TextIO, as_json: bool) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.json = as_json
        width = None if _isatty(stdout) else int(os.environ.get("COLUMNS", "120") or 120)
        # markup off: run ids, payloads and names are printed as they are.
        self.console = Console(
            file=stdout, markup=False, highlight=False, emoji=False, width=width, soft_wrap=False
        )

    def say(self, *parts: str | tuple[str, str]) -> None:
        """Prints a line made of plain strings and ``(text, style)`` pairs."""
        if not self.json:
            # Long lines stay whole (soft wrap): they are read and grepped as lines.
            self.console.print(Text.assemble(*parts), soft_wrap=True)

    def table(self, table: Table) -> None:
        self.console.print(table)

    def emit(self, value: Any, *, compact: bool = False) -> None:
        """Prints ``value`` as JSON (one line when ``compact``)."""
        text = json.dumps(value, ensure_ascii=False, indent=None if compact else 2)
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def error(self, message: str) -> None:
        self.stderr.write(f"fusee: error: {message}\n")
        self.stderr.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data; what JSON cannot hold becomes text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    return repr(value)


def _payload(data: bytes | None) -> Any:
    """A recorded payload, decoded and made JSON; bytes the codec refuses as their repr."""
    if not data:
        return None
    try:
        return _jsonable(_codec.decode(data))
    except PayloadError:
        return repr(data)


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


def _local(ms: int | None, *, date: bool = True) -> str:
    if ms is None:
        return ""
    t = datetime.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S") if date else t.strftime("%H:%M:%S.%f")[:-3]


_STATUS_STYLE: Final = {
    "running": "cyan",
    "suspended": "blue",
    "paused": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "magenta",
    "continued": "dim",
}


def _row_json(row: RunRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "run": row.run,
        "workflow": row.workflow,
        "status": row.status,
        "started_at": _iso(row.started_ms),
        "finished_at": _iso(row.finished_ms),
        "wake_at": _iso(row.wake_ms),
        "attributes": _jsonable(dict(row.attributes)),
        "parent": row.parent,
    }


# --- the store, read-only ------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> str:
    store: str | None = getattr(args, "store", None)
    data: str | None = getattr(args, "data", None)
    if store is not None and data is not None:
        raise _CliError("pass --data DIR or --store URL, not both")
    target = store if store is not None else (data if data is not None else "data")
    if target == "memory":
        raise _CliError(
            "a memory store keeps nothing between processes; pass the directory of a store"
        )
    return target


def _data_dir(args: argparse.Namespace) -> Path:
    """The store's directory, for the commands that need one (inbox, worker lock)."""
    target = _target(args)
    if "://" in target:
        # Lets open_store say which URLs it knows.
        open_store(target)
        raise _CliError(f"this command needs a store directory, not {target!r}")
    return Path(target)


@contextlib.asynccontextmanager
async def _reading(args: argparse.Namespace) -> AsyncIterator[Store]:
    store = open_store(_target(args), readonly=True)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _row(store: Store, id: str, where: str) -> RunRow:
    row = await store.get(id)
    if row is None:
        raise _CliError(f"no run {id!r} in {where}; `fusee list` shows the runs there are")
    return row


def _done_record(entries: Sequence[tuple[int, bytes]]) -> Done | None:
    if not entries:
        return None
    rec = decode(entries[-1][1])
    return rec if isinstance(rec, Done) else None


def _outcome(done: Done) -> dict[str, Any]:
    """A run's end as JSON: its result, or its error."""
    value = _payload(done.payload)
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


# --- list ----------------------------------------------------------------------------------------


def _attr_filters(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise _CliError(f"--attr takes KEY=VALUE (VALUE as JSON, or text), not {pair!r}")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


async def _list(args: argparse.Namespace, out: _Output) -> int:
    if args.status is not None and args.status not in RUN_STATUSES:
        raise _CliError(
            f"--status {args.status!r} is not a status; "
            f"use one of {', '.join(sorted(RUN_STATUSES))}"
        )
    attributes = _attr_filters(args.attr)
    async with _reading(args) as store:
        rows = await store.list(
            status=args.status,
            workflow=args.workflow,
            attributes=attributes or None,
            limit=args.limit,
        )
    if out.json:
        out.emit([_row_json(r) for r in rows])
        return 0
    if not rows:
        out.say(("no runs match", "dim"))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("id", "workflow", "status", "run", "started", "finished"):
        table.add_column(name, no_wrap=True)
    table.add_column("attributes", overflow="fold", ratio=1)
    table.add_column("parent", overflow="fold")
    for r in rows:
        table.add_row(
            r.id,
            r.workflow,
            Text(r.status, style=_STATUS_STYLE.get(r.status, "")),
            str(r.run),
            _local(r.started_ms),
            _local(r.finished_ms),
            _short(_jsonable(dict(r.attributes)), 60) if r.attributes else "",
            r.parent or "",
        )
    out.table(table)
    return 0


# --- show: the journal as a timeline -------------------------------------------------------------


@dataclass(slots=True)
class _Line:
    """One journal record, for people and for JSON."""

    lsn: int
    seq: int | None
    kind: str
    name: str
    attempt: int | None
    status: str
    payload: Any
    time_ms: int | None

    def json(self) -> dict[str, Any]:
        return {
            "lsn": self.lsn,
            "seq": self.seq,
            "kind": self.kind,
            "name": self.name,
            "attempt": self.attempt,
            "status": self.status,
            "payload": self.payload,
            "time": _iso(self.time_ms),
        }


_VALUE_KINDS: Final = {
    value_kind.CUSTOM: "custom",
    value_kind.NOW: "now",
    value_kind.RANDOM: "random",
    value_kind.UUID: "uuid",
}


def _value(rec: Value) -> Any:
    data = rec.value
    if rec.kind == value_kind.NOW and len(data) == 8:
        return _iso(int.from_bytes(data, "little"))
    if rec.kind == value_kind.RANDOM and len(data) == 8:
        return (int.from_bytes(data, "little") >> 11) / float(1 << 53)
    if rec.kind == value_kind.UUID and len(data) == 16:
        return str(uuid.UUID(bytes=data))
    return _payload(data)


def _status(status: Status) -> str:
    return status.name.lower().replace("_", " ")


class _Timeline:
    """Turns records into lines, remembering operation names by journal position."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def line(self, lsn: int, data: bytes) -> _Line:
        try:
            rec = decode(data)
        except FuseeError as e:
            return _Line(lsn, None, "corrupt", "", None, "unreadable", str(e), None)
        return self._line(lsn, rec)

    def _named(self, seq: int, name: str) -> str:
        self.names[seq] = name
        return name

    def _line(self, lsn: int, rec: Record) -> _Line:
        names = self.names
        if isinstance(rec, Start):
            name = rec.wtype + (f" (child of {rec.parent.id})" if rec.parent else "")
            return _Line(lsn, None, "start", name, None, "", _payload(rec.input), rec.started_ms)
        if isinstance(rec, Step):
            self._named(rec.seq, rec.name)
            t = rec.time.started_ms if rec.time is not None else None
            return _Line(
                lsn,
                rec.seq,
                "step",
                rec.name,
                rec.attempt,
                _status(rec.status),
                _payload(rec.payload),
                t,
            )
        if isinstance(rec, Attempt):
            self._named(rec.seq, rec.name)
            paused = rec.retry_at_ms == PAUSED
            return _Line(
                lsn,
                rec.seq,
                "attempt",
                rec.name,
                rec.attempt,
                "paused" if paused else "retrying",
                _payload(rec.error),
                None if paused else rec.retry_at_ms,
            )
        if isinstance(rec, Resume):
            return _Line(
                lsn, rec.seq, "resume", names.get(rec.seq, ""), rec.attempt, "", None, None
            )
        if isinstance(rec, Timer):
            name = self._named(rec.seq, rec.name)
            return _Line(lsn, rec.seq, "timer", name, None, "set", None, rec.fire_at_ms)
        if isinstance(rec, Fired):
            return _Line(lsn, rec.seq, "fired", names.get(rec.seq, ""), None, "", None, None)
        if isinstance(rec, Signal):
            by = _payload(rec.by) if rec.by else None
            name = rec.name + (f" (from {by})" if by is not None else "")
            return _Line(lsn, None, "signal", name, None, "", _payload(rec.payload), None)
        if isinstance(rec, Wait):
            name = self._named(rec.seq, rec.name)
            return _Line(lsn, rec.seq, "wait", name, None, "waiting", None, rec.deadline_ms or None)
        if isinstance(rec, Waited):
            o = rec.outcome
            how = (
                f"signal #{o.ordinal}"
                if o.is_signal
                else ("abandoned" if o.is_abandoned else "timed out")
            )
            return _Line(lsn, rec.seq, "waited", names.get(rec.seq, ""), None, how, None, None)
        if isinstance(rec, Value):
            kind = _VALUE_KINDS.get(rec.kind, str(rec.kind))
            return _Line(lsn, rec.seq, "value", kind, None, "", _value(rec), None)
        if isinstance(rec, Child):
            name = self._named(rec.seq, f"{rec.wtype} {rec.id}")
            status = "detached" if rec.flags & DETACHED else "started"
            return _Line(lsn, rec.seq, "child", name, None, status, _payload(rec.input), None)
        if isinstance(rec, ChildDone):
            return _Line(
                lsn,
                rec.seq,
                "child-done",
                names.get(rec.seq, ""),
                None,
                _status(rec.status),
                _payload(rec.payload),
                None,
            )
        if isinstance(rec, Send):
            name = f"{rec.name} -> {rec.target}"
            return _Line(lsn, rec.seq, "send", name, None, "", _payload(rec.payload), None)
        if isinstance(rec, Cancel):
            return _Line(lsn, None, "cancel", "", None, "", _payload(rec.reason), None)
        if isinstance(rec, Done):
            return _Line(
                lsn,
                None,
                "done",
                "",
                None,
                _status(rec.status),
                _payload(rec.payload),
                rec.finished_ms,
            )
        if isinstance(rec, Update):
            name = f"{rec.name} ({rec.id})"
            return _Line(lsn, None, "update", name, None, "", _payload(rec.payload), None)
        if isinstance(rec, UpdateDone):
            return _Line(
                lsn,
                rec.seq,
                "update-done",
                f"#{rec.ordinal}",
                None,
                _status(rec.status),
                _payload(rec.payload),
                None,
            )
        if isinstance(rec, Heartbeat):
            return _Line(
                lsn,
                rec.seq,
                "heartbeat",
                names.get(rec.seq, ""),
                rec.attempt,
                "",
                _payload(rec.payload),
                None,
            )
        if isinstance(rec, Awaiting):
            name = self._named(rec.seq, rec.name)
            return _Line(lsn, rec.seq, "awaiting", name, rec.attempt, "token out", None, None)
        if isinstance(rec, Completed):
            return _Line(
                lsn,
                rec.seq,
                "completed",
                names.get(rec.seq, ""),
                rec.attempt,
                _status(rec.status),
                _payload(rec.payload),
                None,
            )
        if isinstance(rec, Patch):
            return _Line(lsn, rec.at, "patch", rec.id, None, "", None, None)
        if isinstance(rec, Attributes):
            return _Line(lsn, rec.seq, "attributes", "", None, "", _payload(rec.payload), None)
        if isinstance(rec, Chunk):
            seq = None if rec.seq == stream.WORKFLOW else rec.seq
            return _Line(
                lsn,
                seq,
                "chunk",
                rec.stream,
                rec.attempt or None,
                f"#{rec.offset}",
                _payload(rec.payload),
                None,
            )
        assert isinstance(rec, StreamEnd)
        seq = None if rec.seq == stream.WORKFLOW else rec.seq
        status = f"{_status(rec.status)} after {rec.chunks}"
        return _Line(lsn, seq, "stream-end", rec.stream, None, status, None, None)


_KIND_STYLE: Final = {
    "start": "bold",
    "done": "bold",
    "step": "green",
    "attempt": "yellow",
    "signal": "cyan",
    "cancel": "magenta",
    "corrupt": "bold red",
}


def _timeline_table(lines: Iterable[_Line], *, header: bool) -> Table:
    # Fixed widths, so that the batches `--follow` prints line up.
    table = Table(box=None, pad_edge=False, show_header=header, header_style="bold")
    table.add_column("lsn", justify="right", width=6, no_wrap=True)
    table.add_column("seq", justify="right", width=4, no_wrap=True)
    table.add_column("kind", width=11, no_wrap=True)
    table.add_column("name", width=22, overflow="fold")
    table.add_column("att", justify="right", width=3, no_wrap=True)
    table.add_column("status", width=12, overflow="fold")
    table.add_column("time", width=12, no_wrap=True)
    table.add_column("payload", overflow="fold", ratio=1)
    for ln in lines:
        failed = ln.status in ("failed", "retrying", "paused", "timed out", "unreadable")
        table.add_row(
            str(ln.lsn),
            "" if ln.seq is None else str(ln.seq),
            Text(ln.kind, style=_KIND_STYLE.get(ln.kind, "")),
            ln.name,
            "" if ln.attempt is None else str(ln.attempt),
            Text(ln.status, style="red" if failed else ""),
            _local(ln.time_ms, date=False),
            "" if ln.payload is None else _short(ln.payload, 200),
        )
    return table


def _header(out: _Output, row: RunRow, where: str) -> None:
    out.say(
        ("run ", "bold"),
        (row.id, "bold"),
        f"  workflow {row.workflow}  run {row.run}  status ",
        (row.status, _STATUS_STYLE.get(row.status, "")),
        f"  in {where}",
    )
    facts = [f"started {_local(row.started_ms)}"]
    if row.finished_ms is not None:
        facts.append(f"finished {_local(row.finished_ms)}")
    if row.wake_ms is not None:
        facts.append(f"wakes {_local(row.wake_ms)}")
    if row.parent:
        facts.append(f"parent {row.parent}")
    if row.attributes:
        facts.append(f"attributes {_short(_jsonable(dict(row.attributes)), 80)}")
    out.say(("  " + "  ".join(facts), "dim"))


async def _show(args: argparse.Namespace, out: _Output) -> int:
    where = _target(args)
    async with _reading(args) as store:
        row = await _row(store, args.id, where)
        run = args.run if args.run is not None else row.run
        try:
            entries = await store.load(args.id, run)
        except NotFound:
            raise _CliError(
                f"run {run} of {args.id!r} has no records in {where}; its latest run is {row.run}"
            ) from None
        timeline = _Timeline()
        lines = [timeline.line(lsn, data) for lsn, data in entries]
        if not args.follow:
            if out.json:
                out.emit({"run": _row_json(row), "records": [ln.json() for ln in lines]})
            else:
                _header(out, row, where)
                out.table(_timeline_table(lines, header=True))
            return 0
        return await _follow(args, out, store, row, run, timeline, lines)


async def _follow(
    args: argparse.Namespace,
    out: _Output,
    store: Store,
    row: RunRow,
    run: int,
    timeline: _Timeline,
    lines: list[_Line],
) -> int:
    """Prints records as they land, until the run ends (or Ctrl-C, or --max-seconds)."""
    loop = asyncio.get_running_loop()
    deadline = None if args.max_seconds is None else loop.time() + args.max_seconds

    def show(batch: list[_Line], *, header: bool) -> None:
        if out.json:
            for ln in batch:
                out.emit({"id": args.id, "run": run, **ln.json()}, compact=True)
        elif batch or header:
            out.table(_timeline_table(batch, header=header))

    if not out.json:
        _header(out, row, _target(args))
    show(lines, header=True)
    last = lines[-1].lsn if lines else 0
    following_latest = args.run is None
    while True:
        ended = row.run == run and row.status in _FINISHED
        if ended and (any(ln.kind == "done" for ln in lines) or not following_latest):
            if not out.json:
                out.say((f"run {args.id!r} {row.status}", "bold"))
            return 0
        if deadline is not None and loop.time() >= deadline:
            return 0
        await asyncio.sleep(_POLL_S)
        latest = await store.get(args.id)
        if latest is None:
            raise _CliError(f"run {args.id!r} is no longer in the store")
        fresh = [
            timeline.line(lsn, data) for lsn, data in await store.load(args.id, run, after_lsn=last)
        ]
        if fresh:
            last = fresh[-1].lsn
            lines.extend(fresh)
            show(fresh, header=False)
        if following_latest and latest.run != run and latest.status != "continued":
            # Continued as new: follow the new run from its start.
            run, timeline, lines, last = latest.run, _Timeline(), [], 0
            if not out.json:
                out.say((f"continued as new: run {run}", "bold"))
        row = latest


# --- result --------------------------------------------------------------------------------------


async def _result(args: argparse.Namespace, out: _Output) -> int:
    where = _target(args)
    loop = asyncio.get_running_loop()
    deadline = None if args.timeout is None else loop.time() + args.timeout
    async with _reading(args) as store:
        while True:
            row = await _row(store, args.id, where)
            if row.status in _FINISHED:
                done = _done_record(await store.load(args.id, row.run))
                if done is None:
                    raise _CliError(f"run {args.id!r} is {row.status} but its journal has no end")
                break
            if not args.wait:
                raise _CliError(
                    f"run {args.id!r} has not finished ({row.status}); "
                    "pass --wait to wait for its result"
                )
            if deadline is not None and loop.time() >= deadline:
                raise _CliError(
                    f"run {args.id!r} did not finish within {args.timeout:g}s ({row.status})"
                )
            await asyncio.sleep(_POLL_S)
    outcome = _outcome(done)
    if out.json:
        out.emit({"id": row.id, "run": row.run, **outcome})
    elif outcome["status"] == "completed":
        out.console.print(json.dumps(outcome["result"], ensure_ascii=False, indent=2))
    else:
        err = outcome["error"]
        out.error(f"run {row.id!r} {outcome['status']}: {err['type']}: {err['message']}")
    return 0 if outcome["status"] == "completed" else 1


# --- the worker lock and the inbox ---------------------------------------------------------------


@contextlib.contextmanager
def writer_lock(directory: str | os.PathLike[str], *, commands: bool = False) -> Iterator[None]:
    """Holds ``DIRECTORY/worker.lock``, the mark of the one process that writes a store.

    ``fusee worker`` holds it while it runs. A program that opens an engine
    on a directory may hold it too: then a second copy of the program, or a
    worker, is refused with a clear error instead of both writing the store.
    The lock is an flock: the kernel drops it when the process dies, even by
    ``kill -9``, so a stale file never blocks anyone.

    Args:
        directory: The store's directory (created if missing).
        commands: Whether this process applies the commands that ``fusee
            start/signal/cancel/resume`` queue in ``DIRECTORY/inbox/`` (only
            ``fusee worker`` does); those commands refuse to queue for a
            holder that does not.

    Raises:
        fusee.StoreError: Another process holds the lock.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with writer_lock(d):
        ...         print("this process writes", d == d)
        this process writes True
    """
    path = Path(directory) / _LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+", encoding="utf-8")
    try:
        # A few tries: a `fusee` command probing the lock holds it for an instant.
        for attempt in range(20):
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 19:
                    raise StoreError(_held_by(_read_holder(path), path.parent)) from None
                time.sleep(0.05)
        f.seek(0)
        f.truncate()
        info = {"pid": os.getpid(), "argv": " ".join(sys.argv)[:200], "commands": commands}
        f.write(json.dumps(info))
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    finally:
        f.close()


def _held_by(holder: dict[str, Any] | None, data: Path) -> str:
    who = _holder_text(holder)
    hint = (
        "stop it first, or send it commands with `fusee start/signal/cancel/resume`"
        if holder is not None and holder.get("commands")
        else "stop it first"
    )
    return f"{who} already writes the store in {data}; one engine writes a store: {hint}"


def _holder_text(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "another process"
    argv = holder.get("argv")
    return f"another process (pid {holder.get('pid', '?')}{f': {argv}' if argv else ''})"


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _worker_holder(data: Path) -> dict[str, Any] | None:
    """What the worker serving ``data`` wrote in its lock file, or None if none runs."""
    path = data / _LOCK_FILE
    try:
        f = path.open("r", encoding="utf-8")
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or {"pid": "?", "commands": True}
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def _write_atomically(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _post(data: Path, command: dict[str, Any]) -> str:
    """Queues ``command`` in ``data``'s inbox, durably; returns its name."""
    inbox = data / _INBOX
    (inbox / _REPLIES).mkdir(parents=True, exist_ok=True)
    # Names sort in arrival order: the worker applies commands oldest first.
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}.json"
    _write_atomically(inbox / name, command)
    return name


async def _await_reply(data: Path, name: str, timeout_s: float) -> dict[str, Any] | None:
    """The worker's answer to command ``name``; None if no worker is left to answer."""
    path = data / _INBOX / _REPLIES / name
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    checked = loop.time()
    while True:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            pass
        else:
            with contextlib.suppress(OSError):
                path.unlink()
            reply: dict[str, Any] = json.loads(text)
            return reply
        now = loop.time()
        if now >= deadline:
            raise _CliError(
                f"the worker on {data} did not answer within {timeout_s:g}s; the command "
                f"stays queued as {data / _INBOX / name} and is applied when the worker gets to it"
            )
        if now - checked >= 1.0:
            checked = now
            # The worker answers before it drops the command: a command still
            # there with no worker left waits for the next one.
            if _worker_holder(data) is None and (data / _INBOX / name).exists():
                return None
        await asyncio.sleep(0.05)


async def _send_command(
    args: argparse.Namespace, out: _Output, command: dict[str, Any], what: str
) -> int:
    data = _data_dir(args)
    holder = _worker_holder(data)
    if holder is not None and not holder.get("commands"):
        raise _CliError(
            f"{_holder_text(holder)} writes the store in {data} and takes no commands; "
            f"act on the run from that program, or stop it and run `fusee worker MODULE "
            f"--data {data}`"
        )
    name = _post(data, command)
    report: dict[str, Any] = {"command": command["op"], "id": command["id"], "queued": name}
    if holder is None or args.no_wait:
        if holder is None:
            message = (
                f"queued {what}: no worker is running on {data}; "
                f"`fusee worker MODULE --data {data}` applies it when it starts"
            )
        else:
            message = f"queued {what} for the worker (pid {holder.get('pid', '?')})"
        if out.json:
            out.emit({**report, "applied": False, "ok": True, "message": message})
        else:
            out.say(message)
        return 0
    reply = await _await_reply(data, name, args.timeout)
    if reply is None:
        message = (
            f"the worker on {data} stopped before applying {what}; it stays queued for the next one"
        )
        if out.json:
            out.emit({**report, "applied": False, "ok": True, "message": message})
        else:
            out.say(message)
        return 0
    ok = bool(reply.get("ok"))
    message = str(reply.get("message", ""))
    if out.json:
        out.emit({**report, "applied": True, "ok": ok, "message": message})
    elif ok:
        out.say(message)
    if not ok:
        if not out.json:
            out.error(message)
        return 1
    return 0


def _parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise _CliError(f"{what} is not valid JSON ({e}): {text!r}") from None


async def _check_running(args: argparse.Namespace, id: str, verb: str) -> None:
    """Fails early, without queueing, when run ``id`` is unknown or has finished."""
    where = _target(args)
    async with _reading(args) as store:
        row = await _row(store, id, where)
    if row.status in _FINISHED:
        raise _CliError(f"run {id!r} has finished ({row.status}); there is nothing to {verb}")


async def _signal(args: argparse.Namespace, out: _Output) -> int:
    payload = _parse_json(args.payload, "the signal's payload")
    await _check_running(args, args.id, "signal")
    command = {
        "op": "signal",
        "id": args.id,
        "name": args.name,
        "payload": payload,
        "dedup": args.dedup,
    }
    return await _send_command(args, out, command, f"signal {args.name!r} to run {args.id!r}")


async def _cancel(args: argparse.Namespace, out: _Output) -> int:
    await _check_running(args, args.id, "cancel")
    command = {"op": "cancel", "id": args.id, "reason": args.reason}
    return await _send_command(args, out, command, f"cancel of run {args.id!r}")


async def _resume(args: argparse.Namespace, out: _Output) -> int:
    await _check_running(args, args.id, "resume")
    return await _send_command(
        args, out, {"op": "resume", "id": args.id}, f"resume of run {args.id!r}"
    )


async def _start(args: argparse.Namespace, out: _Output) -> int:
    module_spec, sep, wf_name = args.workflow.rpartition(":")
    if not sep or not module_spec or not wf_name:
        raise _CliError(
            f"expected MODULE:WORKFLOW (like examples.checkout:checkout), not {args.workflow!r}"
        )
    value = _parse_json(args.input, "the input")
    workflows = _workflows_of([_import(module_spec)], module_spec)
    wf = _pick(workflows, wf_name, module_spec)
    try:
        wf.decode_input(_codec.encode(value))
    except PayloadError as e:
        raise _CliError(f"the input does not fit workflow {wf.name!r}: {e}") from None
    data = _data_dir(args)
    if (data / "fusee.db").exists():
        async with _reading(args) as store:
            row = await store.get(args.id)
        if row is not None and args.id_policy == "reject":
            raise _CliError(
                f"run {args.id!r} exists ({row.status}); pass --id-policy replace to start "
                "over once it has finished"
            )
    command = {
        "op": "start",
        "id": args.id,
        "workflow": wf.name,
        "input": value,
        "id_policy": args.id_policy,
    }
    return await _send_command(args, out, command, f"start of run {args.id!r} ({wf.name})")


# --- modules and their workflows -----------------------------------------------------------------


def _import(spec: str) -> ModuleType:
    """Imports a module by dotted name (from the current directory too) or by file path."""
    try:
        if spec.endswith(".py") or os.sep in spec or "/" in spec:
            path = Path(spec)
            if not path.is_file():
                raise _CliError(f"no module file {spec!r}")
            name = path.stem
            loaded = sys.modules.get(name)
            if loaded is not None:
                if Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
                    return loaded
                name = f"fusee_cli_{name}_{secrets.token_hex(2)}"
            parent = str(path.resolve().parent)
            if parent not in sys.path:
                sys.path.insert(0, parent)
            found = importlib.util.spec_from_file_location(name, path)
            if found is None or found.loader is None:
                raise _CliError(f"cannot import {spec!r}: not a Python module")
            module = importlib.util.module_from_spec(found)
            # Registered before it runs: the codec resolves its classes' hints through it.
            sys.modules[name] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return module
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
        return importlib.import_module(spec)
    except _CliError:
        raise
    except (Exception, SystemExit) as e:
        raise _CliError(f"cannot import module {spec!r}: {type(e).__name__}: {e}") from None


def _workflows_of(modules: Iterable[ModuleType], what: str) -> list[WorkflowDef[Any, Any]]:
    found: dict[str, WorkflowDef[Any, Any]] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, WorkflowDef):
                other = found.get(value.name)
                if other is not None and other is not value:
                    raise _CliError(
                        f"two workflows are named {value.name!r} ({other.location} and "
                        f"{value.location}); an engine runs one definition per name"
                    )
                found[value.name] = value
    if not found:
        raise _CliError(f"{what} defines no workflows (no @fusee.workflow at its top level)")
    return [found[k] for k in sorted(found)]


def _pick(
    workflows: Sequence[WorkflowDef[Any, Any]], name: str, what: str
) -> WorkflowDef[Any, Any]:
    for wf in workflows:
        if wf.name == name or wf.fn.__name__ == name:
            return wf
    names = ", ".join(wf.name for wf in workflows)
    raise _CliError(f"{what} has no workflow {name!r} (it has: {names})")


# --- worker --------------------------------------------------------------------------------------


async def _apply(engine: Engine, command: dict[str, Any], name: str) -> dict[str, Any]:
    """Applies one inbox command with the worker's engine; returns the answer."""
    op = command.get("op")
    id = str(command.get("id", ""))
    try:
        if op == "start":
            policy = IdPolicy(command.get("id_policy") or "reject")
            await engine.start(command["workflow"], id, command.get("input"), id_policy=policy)
            return {"ok": True, "message": f"started run {id!r} ({command['workflow']})"}
        if op == "signal":
            # Without a dedup id of its own, the command's name is one: a
            # command applied again after a worker crash signals once.
            dedup = command.get("dedup") or f"inbox/{name}"
            await engine.get(id).signal(
                signal_def(command["name"]), command.get("payload"), dedup=dedup
            )
            return {"ok": True, "message": f"signal {command['name']!r} delivered to run {id!r}"}
        if op == "cancel":
            await engine.get(id).cancel(command.get("reason") or "cancelled from the fusee command")
            return {"ok": True, "message": f"run {id!r} cancelled"}
        if op == "resume":
            await engine.get(id).resume()
            return {"ok": True, "message": f"run {id!r} resumed"}
        if op == "stop":
            return {"ok": True, "message": "worker stopping", "stop": True}
        return {"ok": False, "message": f"unknown command {op!r}"}
    except (FuseeError, ValueError, KeyError, TypeError) as e:
        return {"ok": False, "message": f"{op} of run {id!r} failed: {e}"}


async def _drain_inbox(engine: Engine, data: Path, out: _Output) -> bool:
    """Applies the queued commands, oldest first; True when one asked the worker to stop."""
    inbox = data / _INBOX
    stop = False
    for path in sorted(inbox.glob("*.json")):
        try:
            command = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(command, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            reply: dict[str, Any] = {"ok": False, "message": f"unreadable command: {e}"}
        else:
            reply = await _apply(engine, command, path.name)
        stop = stop or bool(reply.get("stop"))
        _write_atomically(inbox / _REPLIES / path.name, reply)
        path.unlink(missing_ok=True)
        mark = ("  > ", "cyan") if reply["ok"] else ("  ! ", "red")
        out.say(mark, str(reply["message"]))
    return stop


def _prune_replies(data: Path) -> None:
    cutoff = time.time() - _REPLY_TTL_S
    for path in (data / _INBOX / _REPLIES).glob("*.json"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()


async def _report_finished(engine: Engine, reported: set[tuple[str, int]], out: _Output) -> None:
    for status in sorted(_FINISHED):
        async for info in engine.list(status=status):
            if (info.id, info.run) in reported:
                continue
            reported.add((info.id, info.run))
            done = _done_record(await engine.store.load(info.id, info.run))
            if done is None:
                continue
            outcome = _outcome(done)
            if outcome["status"] == "completed":
                detail = _short(outcome["result"], 160)
                out.say(("  ✓ ", "green"), f"{info.id} ({info.workflow}) completed: {detail}")
            else:
                err = outcome["error"]
                out.say(
                    ("  ✗ ", "red"),
                    f"{info.id} ({info.workflow}) {outcome['status']}: {err['type']}: "
                    + _short(err["message"], 160),
                )


async def _worker(args: argparse.Namespace, out: _Output) -> int:
    data = _data_dir(args)
    modules = [_import(spec) for spec in args.modules]
    workflows = _workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    data.mkdir(parents=True, exist_ok=True)
    (data / _INBOX / _REPLIES).mkdir(parents=True, exist_ok=True)
    with writer_lock(data, commands=True):
        try:
            async with await Engine.open(
                data, workflows=workflows, durability=args.durability
            ) as engine:
                await _serve(engine, data, workflows, args, out)
        finally:
            out.say(("fusee worker stopped; unfinished runs resume when a worker starts", "dim"))
    return 0


async def _serve(
    engine: Engine,
    data: Path,
    workflows: Sequence[WorkflowDef[Any, Any]],
    args: argparse.Namespace,
    out: _Output,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if args.max_seconds is None else loop.time() + args.max_seconds
    # SIGTERM (a process manager's stop) ends the worker as Ctrl-C does.
    terminated = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, terminated.set)
    unfinished = len(await engine.store.unfinished())
    out.say(
        ("fusee worker", "bold"),
        f" (pid {os.getpid()}) on {data}: workflows "
        + ", ".join(wf.name for wf in workflows)
        + f"; {unfinished} unfinished run(s) recovered; Ctrl-C stops it",
    )
    reported: set[tuple[str, int]] = set()
    for status in _FINISHED:
        async for info in engine.list(status=status):
            reported.add((info.id, info.run))
    _prune_replies(data)
    next_scan = loop.time()
    while True:
        stop = await _drain_inbox(engine, data, out)
        now = loop.time()
        if stop or now >= next_scan:
            await _report_finished(engine, reported, out)
            next_scan = now + 0.5
        if stop or terminated.is_set() or (deadline is not None and now >= deadline):
            return
        await asyncio.sleep(_POLL_S)


# --- replay --------------------------------------------------------------------------------------


def _replay_one(
    wf: WorkflowDef[Any, Any], entries: list[tuple[int, bytes]]
) -> str | DeterminismError:
    """Replays one journal against ``wf``; "ok", a problem, or the divergence."""
    try:
        records = [decode(data) for _, data in entries]
    except FuseeError as e:
        return f"unreadable journal: {e}"
    driver = RunDriver(ReplayHost(), wf, records, entries[-1][0])
    try:
        driver.start()
    except Exception as e:
        return f"replay raised {type(e).__name__}: {e}"
    finally:
        driver.close()
    return driver.error if driver.error is not None else "ok"


async def _replay(args: argparse.Namespace, out: _Output) -> int:
    modules = [_import(spec) for spec in args.modules]
    workflows = {
        wf.name: wf for wf in _workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    }
    where = _target(args)
    results: list[dict[str, Any]] = []
    async with _reading(args) as store:
        rows = [await _row(store, args.id, where)] if args.id else await store.list()
        for row in rows:
            item: dict[str, Any] = {
                "id": row.id,
                "run": row.run,
                "workflow": row.workflow,
                "status": row.status,
                "outcome": "ok",
                "seq": None,
                "message": None,
                "location": None,
            }
            wf = workflows.get(row.workflow)
            if wf is None:
                # A finished run needs no code; an unfinished one cannot go on without it.
                item["outcome"] = "skipped" if row.status in _FINISHED else "unknown workflow"
                item["message"] = f"workflow {row.workflow!r} is not in {', '.join(args.modules)}"
            else:
                got = _replay_one(wf, await store.load(row.id, row.run))
                if isinstance(got, DeterminismError):
                    item.update(
                        outcome="diverged",
                        seq=got.seq,
                        message=got.message,
                        location=got.location,
                    )
                elif got != "ok":
                    item.update(outcome="error", message=got)
            results.append(item)
    bad = [r for r in results if r["outcome"] not in ("ok", "skipped")]
    if out.json:
        out.emit({"runs": results, "problems": len(bad)})
    else:
        for r in results:
            if r["outcome"] == "ok":
                out.say(("  ok        ", "green"), f"{r['id']} (run {r['run']}, {r['workflow']})")
            elif r["outcome"] == "skipped":
                out.say(("  skipped   ", "dim"), f"{r['id']}: {r['message']}")
            else:
                where_ = f" at journal position {r['seq']}" if r["seq"] is not None else ""
                at = f"\n              at {r['location']}" if r["location"] else ""
                out.say(
                    (f"  {r['outcome']:<9} ", "bold red"),
                    f"{r['id']} (run {r['run']}, {r['workflow']}){where_}: {r['message']}{at}",
                )
        verdict = (
            f"{len(results)} journal(s) replayed: {len(bad)} problem(s)"
            if bad
            else f"{len(results)} journal(s) replayed against the code: no divergence"
        )
        out.say((verdict, "bold red" if bad else "bold green"))
    return 1 if bad else 0


# --- disk-check ----------------------------------------------------------------------------------


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def _disk_check(args: argparse.Namespace, out: _Output) -> int:
    if args.dir is not None:
        directory = Path(args.dir)
    else:
        data = Path(args.store or args.data or "data")
        directory = data if data.is_dir() else Path(".")
    if not directory.is_dir():
        raise _CliError(f"no directory {str(directory)!r} to measure")
    if args.count < 1 or args.size < 1:
        raise _CliError("--count and --size must be 1 or more")
    block = os.urandom(args.size)
    fd, path = tempfile.mkstemp(prefix=".fusee-disk-check-", dir=directory)
    latencies: list[float] = []
    try:
        for _ in range(args.count):
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fsync(fd)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()
    p50, p99, worst = _quantile(latencies, 0.5), _quantile(latencies, 0.99), latencies[-1]
    report = {
        "dir": str(directory.resolve()),
        "count": args.count,
        "size": args.size,
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "max_us": round(worst, 1),
        "commits_per_s": round(1e6 / p50) if p50 > 0 else None,
    }
    if out.json:
        out.emit(report)
        return 0
    out.say(
        ("flush latency ", "bold"),
        f"of {report['dir']} ({args.count} x {args.size} B write + fsync): ",
        (f"p50 {p50:,.0f} µs  p99 {p99:,.0f} µs  max {worst:,.0f} µs", "bold"),
    )
    out.say(
        (
            f"  durability='fsync' pays one flush per group commit: at most about "
            f"{report['commits_per_s']:,} commits/s on this disk, each carrying every record "
            "appended meanwhile",
            "dim",
        )
    )
    return 0


# --- the parser and main -------------------------------------------------------------------------


_EPILOG: Final = """\
the store: --data DIR (default ./data) or --store URL; reading commands open it
read-only and work while an engine writes it.

changing runs: start, signal, cancel and resume never write the store. They queue
a command in DIR/inbox/; the `fusee worker` serving DIR (it holds DIR/worker.lock)
applies it with its engine and answers. Without a worker the command stays queued
until one starts. One engine writes a store: never run two workers, or a worker
and your own program, on one directory.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusee",
        description="Inspect and operate fusee stores: durable execution for Python.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    store_args = argparse.ArgumentParser(add_help=False)
    where = store_args.add_argument_group("the store")
    where.add_argument(
        "--data", metavar="DIR", default=argparse.SUPPRESS, help="store directory (default ./data)"
    )
    where.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS, help="a store URL or directory"
    )
    where.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser.add_argument("--data", metavar="DIR", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", metavar="URL", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", default=False, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"fusee {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=description or help,
            parents=[store_args],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    p = command("list", "list runs (newest last)")
    p.add_argument("--status", help=f"one of {', '.join(sorted(RUN_STATUSES))}")
    p.add_argument("--workflow", metavar="W", help="a workflow name")
    p.add_argument(
        "--attr", metavar="K=V", action="append", default=[], help="a search attribute (repeat)"
    )
    p.add_argument("--limit", type=int, help="at most this many")
    p.set_defaults(handler=_list)

    p = command(
        "show",
        "a run and its journal, as a timeline",
        "Show a run and its journal as a timeline: log position (lsn), journal position "
        "(seq), kind, name, attempt, status, time (when it happened, or for a timer, a wait "
        "or a retry, when it is due) and payload (decoded).",
    )
    p.add_argument("id", help="the run's workflow id")
    p.add_argument("--run", type=int, help="an earlier run of that id (default: the latest)")
    p.add_argument(
        "--follow", "-f", action="store_true", help="print records as they land, until the run ends"
    )
    p.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
    p.set_defaults(handler=_show)

    p = command("result", "a run's result (exit status 1 if it failed or was cancelled)")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="wait for the run to finish")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds"
    )
    p.set_defaults(handler=_result)

    def acting(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--no-wait", action="store_true", help="queue the command; do not wait for the worker"
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="S",
            help="how long to wait for the worker's answer (default 30)",
        )

    act = (
        "Queued in DIR/inbox/ for the `fusee worker` serving DIR, which applies it and "
        "answers; with no worker running it stays queued until one starts."
    )
    p = command("start", "start a run", f"Start a run. {act}")
    p.add_argument("workflow", metavar="MODULE:WORKFLOW", help="e.g. examples.checkout:checkout")
    p.add_argument("id", help="the run's workflow id")
    p.add_argument("input", nargs="?", metavar="JSON", help="the input (default null)")
    p.add_argument(
        "--id-policy",
        choices=[p.value for p in IdPolicy],
        default="reject",
        help="when the id is taken (default reject)",
    )
    acting(p)
    p.set_defaults(handler=_start)

    p = command("signal", "send a signal to a run", f"Send a signal to a run. {act}")
    p.add_argument("id")
    p.add_argument("name", help="the signal's name")
    p.add_argument("payload", nargs="?", metavar="JSON", help="its payload (default null)")
    p.add_argument("--dedup", help="a dedup id: a second signal with it is ignored")
    acting(p)
    p.set_defaults(handler=_signal)

    p = command("cancel", "cancel a run", f"Cancel a run. {act}")
    p.add_argument("id")
    p.add_argument("--reason", default="cancelled from the fusee command")
    acting(p)
    p.set_defaults(handler=_cancel)

    p = command("resume", "resume a run's paused steps", f"Resume a run's paused steps. {act}")
    p.add_argument("id")
    acting(p)
    p.set_defaults(handler=_resume)

    p = command(
        "worker",
        "serve the workflows of modules",
        "Serve the workflows (every fusee.workflow) that MODULEs define, until Ctrl-C: "
        "recover the store's unfinished runs, apply the commands queued in DIR/inbox/, and "
        "print runs as they finish. It holds DIR/worker.lock: one worker per store.",
    )
    p.add_argument("modules", nargs="+", metavar="MODULE", help="dotted name or file path")
    p.add_argument("--durability", choices=["fsync", "none"], default="fsync", help="default fsync")
    p.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
    p.set_defaults(handler=_worker)

    p = command(
        "replay",
        "replay every journal against the current code",
        "Replay each run's journal against the workflows of MODULEs and list every "
        "divergence with its run, journal position and code line; exit status 1 if any. "
        "Run it before deploying changed workflow code.",
    )
    p.add_argument("modules", nargs="+", metavar="MODULE", help="dotted name or file path")
    p.add_argument("--id", help="only this run")
    p.set_defaults(handler=_replay)

    p = command(
        "disk-check",
        "measure the flush latency of a disk",
        "Write 4 KiB and fsync, COUNT times, in a temporary file under DIR (default: the "
        "store's directory, or the current one); print p50, p99 and max in microseconds.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR")
    p.add_argument("--count", type=int, default=300, help="flushes to time (default 300)")
    p.add_argument("--size", type=int, default=4096, help="bytes per write (default 4096)")
    p.set_defaults(handler=_disk_check)
    return parser


def _version() -> str:
    from fusee import __version__

    return __version__


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs the ``fusee`` command; returns its exit status.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        stdout: Where output goes (default: ``sys.stdout``).
        stderr: Where errors go, one line each (default: ``sys.stderr``).

    Returns:
        0 on success; 1 on an error, a failed or cancelled run (``result``) or
        a divergence (``replay``); 2 on a usage error; 130 on Ctrl-C.

    Example:
        >>> import sys
        >>> main(["list", "--data", "/nonexistent/store"], stderr=sys.stdout)  # doctest: +ELLIPSIS
        fusee: error: no fusee store in /nonexistent/store...
        1
    """
    out_stream = stdout if stdout is not None else sys.stdout
    err_stream = stderr if stderr is not None else sys.stderr
    parser = _parser()
    try:
        with contextlib.redirect_stdout(out_stream), contextlib.redirect_stderr(err_stream):
            args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    out = _Output(out_stream, err_stream, bool(args.json))
    handler: Callable[[argparse.Namespace, _Output], Coroutine[Any, Any, int] | int]
    handler = args.handler
    try:
        result = handler(args, out)
        if asyncio.iscoroutine(result):
            return asyncio.run(result)
        assert isinstance(result, int)
        return result
    except _CliError as e:
        out.error(str(e))
        return 1
    except FuseeError as e:
        out.error(str(e))
        return 1
    except OSError as e:
        out.error(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
        return 1
    except ValueError as e:
        out.error(str(e))
        return 1
    except KeyboardInterrupt:
        # Ctrl-C is how a worker and `show --follow` are meant to end.
        return 0 if args.command in ("worker", "show") else 130
    except Exception as e:
        if os.environ.get("FUSEE_DEBUG"):
            raise
        out.error(f"unexpected {type(e).__name__}: {e} (set FUSEE_DEBUG=1 for the traceback)")
        return 1
