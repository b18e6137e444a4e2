"""A run's journal as a timeline: one `Line` per record, and the table of them.

The rule: every record kind has its branch in `Timeline` (a `match` that
ends in `assert_never`, so the type checker names a kind left out), and a
record that does not decode is shown as a "corrupt" line, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from rich.table import Table
from rich.text import Text

from fusee._jsonview import VALUE_KINDS, SignalMarks, iso, jsonable, recorded_value
from fusee._jsonview import payload as payload_json
from fusee.cli._output import STATUS_STYLE, Output, local_time, short
from fusee.errors import FuseeError
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
    Event,
    Fired,
    Handled,
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
)
from fusee.store import RunRow


@dataclass(slots=True)
class Line:
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
            "time": iso(self.time_ms),
        }


SET_ASIDE: Final = "set aside"
"""A signal's status while a wait refused it (its payload does not fit) and none took it."""
HANDLED: Final = "handled"
"""A signal's status once a handler of the code got it (``ctx.on_signal``)."""


def _status(status: Status) -> str:
    return status.name.lower().replace("_", " ")


class Timeline:
    """Turns records into lines, remembering operation names by journal position."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        # The last heartbeat progress of each step running now, by journal
        # position: (name, progress); a step's end or failed attempt drops it.
        self.progress: dict[int, tuple[str, Any]] = {}
        # The signals' lines by ordinal, marked "set aside" while a wait
        # refused them and none took them.
        self.marks = SignalMarks()
        self.signal_lines: list[Line] = []

    def line(self, lsn: int, data: bytes) -> Line:
        try:
            rec = decode(data)
        except FuseeError as e:
            return Line(lsn, None, "corrupt", "", None, "unreadable", str(e), None)
        line = self._line(lsn, rec)
        if isinstance(rec, Signal):
            self.signal_lines.append(line)
        for ordinal in self.marks.add(rec):
            if ordinal < len(self.signal_lines):
                marks = self.marks
                self.signal_lines[ordinal].status = (
                    HANDLED
                    if marks.is_handled(ordinal)
                    else SET_ASIDE
                    if marks.is_set_aside(ordinal)
                    else ""
                )
        return line

    def _named(self, seq: int, name: str) -> str:
        self.names[seq] = name
        return name

    def _line(self, lsn: int, rec: Record) -> Line:
        names = self.names
        match rec:
            case Start():
                name = rec.wtype + (f" (child of {rec.parent.id})" if rec.parent else "")
                return Line(
                    lsn, None, "start", name, None, "", payload_json(rec.input), rec.started_ms
                )
            case Step():
                self._named(rec.seq, rec.name)
                self.progress.pop(rec.seq, None)
                t = rec.time.started_ms if rec.time is not None else None
                status, value = _status(rec.status), payload_json(rec.payload)
                return Line(lsn, rec.seq, "step", rec.name, rec.attempt, status, value, t)
            case Attempt():
                self._named(rec.seq, rec.name)
                self.progress.pop(rec.seq, None)
                paused = rec.retry_at_ms == PAUSED
                return Line(
                    lsn,
                    rec.seq,
                    "attempt",
                    rec.name,
                    rec.attempt,
                    "paused" if paused else "retrying",
                    payload_json(rec.error),
                    None if paused else rec.retry_at_ms,
                )
            case Resume():
                name = names.get(rec.seq, "")
                return Line(lsn, rec.seq, "resume", name, rec.attempt, "", None, None)
            case Timer():
                name = self._named(rec.seq, rec.name)
                return Line(lsn, rec.seq, "timer", name, None, "set", None, rec.fire_at_ms)
            case Fired():
                return Line(lsn, rec.seq, "fired", names.get(rec.seq, ""), None, "", None, None)
            case Signal():
                by = payload_json(rec.by) if rec.by else None
                name = rec.name + (f" (from {by})" if by is not None else "")
                return Line(lsn, None, "signal", name, None, "", payload_json(rec.payload), None)
            case Wait():
                name = self._named(rec.seq, rec.name)
                due = rec.deadline_ms or None
                return Line(lsn, rec.seq, "wait", name, None, "waiting", None, due)
            case Waited():
                o = rec.outcome
                how = (
                    f"signal #{o.ordinal}"
                    if o.is_signal
                    else ("abandoned" if o.is_abandoned else "timed out")
                )
                return Line(lsn, rec.seq, "waited", names.get(rec.seq, ""), None, how, None, None)
            case Value():
                kind = VALUE_KINDS.get(rec.kind, str(rec.kind))
                return Line(lsn, rec.seq, "value", kind, None, "", recorded_value(rec), None)
            case Child():
                name = self._named(rec.seq, f"{rec.wtype} {rec.id}")
                status = "detached" if rec.flags & DETACHED else "started"
                value = payload_json(rec.input)
                return Line(lsn, rec.seq, "child", name, None, status, value, None)
            case ChildDone():
                name = names.get(rec.seq, "")
                status = _status(rec.status)
                return Line(
                    lsn, rec.seq, "child-done", name, None, status, payload_json(rec.payload), None
                )
            case Send():
                name = f"{rec.name} -> {rec.target}"
                return Line(lsn, rec.seq, "send", name, None, "", payload_json(rec.payload), None)
            case Cancel():
                return Line(lsn, None, "cancel", "", None, "", payload_json(rec.reason), None)
            case Done():
                self.progress.clear()
                status = _status(rec.status)
                return Line(
                    lsn, None, "done", "", None, status, payload_json(rec.payload), rec.finished_ms
                )
            case Update():
                name = f"{rec.name} ({rec.id})"
                return Line(lsn, None, "update", name, None, "", payload_json(rec.payload), None)
            case UpdateDone():
                name = f"#{rec.ordinal}"
                status = _status(rec.status)
                return Line(
                    lsn, rec.seq, "update-done", name, None, status, payload_json(rec.payload), None
                )
            case Heartbeat():
                name = names.get(rec.seq, "")
                progress = payload_json(rec.payload)
                # A running step's name is journaled only when it ends.
                self.progress[rec.seq] = (name or f"step #{rec.seq}", progress)
                return Line(lsn, rec.seq, "heartbeat", name, rec.attempt, "", progress, None)
            case Awaiting():
                name = self._named(rec.seq, rec.name)
                return Line(lsn, rec.seq, "awaiting", name, rec.attempt, "token out", None, None)
            case Completed():
                name = names.get(rec.seq, "")
                status = _status(rec.status)
                value = payload_json(rec.payload)
                return Line(lsn, rec.seq, "completed", name, rec.attempt, status, value, None)
            case Patch():
                return Line(lsn, rec.at, "patch", rec.id, None, "", None, None)
            case Handled():
                # The signal's own line says so too ("handled").
                name = (
                    self.signal_lines[rec.ordinal].name
                    if rec.ordinal < len(self.signal_lines)
                    else ""
                )
                return Line(lsn, None, "handled", name, None, f"signal #{rec.ordinal}", None, None)
            case Attributes():
                value = payload_json(rec.payload)
                return Line(lsn, rec.seq, "attributes", "", None, "", value, None)
            case Event():
                value = payload_json(rec.payload)
                return Line(lsn, rec.seq, "event", rec.key, None, "", value, None)
            case Chunk():
                seq = None if rec.seq == stream.WORKFLOW else rec.seq
                status = f"#{rec.offset}"
                value = payload_json(rec.payload)
                return Line(lsn, seq, "chunk", rec.stream, rec.attempt or None, status, value, None)
            case StreamEnd():
                seq = None if rec.seq == stream.WORKFLOW else rec.seq
                status = f"{_status(rec.status)} after {rec.chunks}"
                return Line(lsn, seq, "stream-end", rec.stream, None, status, None, None)
            case _:
                assert_never(rec)


_KIND_STYLE: Final = {
    "start": "bold",
    "done": "bold",
    "step": "green",
    "attempt": "yellow",
    "signal": "cyan",
    "cancel": "magenta",
    "corrupt": "bold red",
}


def _failure(ln: Line) -> tuple[str, str, str] | None:
    """A failed run's end as (error type, message, traceback), if ``ln`` is one with a traceback."""
    if ln.kind != "done" or not isinstance(ln.payload, list) or len(ln.payload) < 3:
        return None
    if ln.status in ("ok", "cancelled", "continued"):
        return None
    kind, message, traceback = ln.payload[:3]
    return str(kind), str(message), str(traceback)


def timeline_table(lines: Iterable[Line], *, header: bool, full: bool = False) -> Table:
    """The lines as a table; ``full`` shows payloads whole (a failed end's traceback aside)."""
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
        failed = ln.status in ("failed", "retrying", "paused", "timed out", "unreadable", SET_ASIDE)
        payload = ln.payload
        if _failure(ln) is not None:
            # A traceback is unreadable folded in a cell: `print_failure` prints
            # it under the table, line by line (with --full).
            payload = payload[:2]
        table.add_row(
            str(ln.lsn),
            "" if ln.seq is None else str(ln.seq),
            Text(ln.kind, style=_KIND_STYLE.get(ln.kind, "")),
            ln.name,
            "" if ln.attempt is None else str(ln.attempt),
            Text(ln.status, style="red" if failed else ""),
            local_time(ln.time_ms, date=False),
            "" if payload is None else short(payload, None if full else 200),
        )
    return table


def print_failure(out: Output, lines: Sequence[Line], id: str, *, full: bool) -> None:
    """Prints how a failed run failed: its whole traceback when ``full``, else where to see it."""
    got = _failure(lines[-1]) if lines else None
    if got is None:
        return
    kind, message, traceback = got
    if not full:
        out.say((f"  `fusee show {id} --full` prints the whole traceback", "dim"))
        return
    out.say(("error: ", "bold red"), f"{kind}: {message}")
    for text in traceback.rstrip("\n").splitlines():
        out.say(text)


def print_bug(out: Output, row: RunRow, *, full: bool) -> None:
    """Prints what a run paused by a bug in its code raised: its traceback when ``full``."""
    if row.error is None:
        return
    lines = row.error.rstrip("\n").splitlines()
    out.say(("paused by a bug in its code: ", "bold red"), lines[-1] if lines else "")
    if full:
        for text in lines:
            out.say(text)
    else:
        out.say((f"  `fusee show {row.id} --full` prints the whole traceback", "dim"))
    out.say((f"  deploy a fix, then `fusee resume {row.id}` replays it on the new code", "dim"))


def print_header(out: Output, row: RunRow, where: str) -> None:
    out.say(
        ("run ", "bold"),
        (row.id, "bold"),
        f"  workflow {row.workflow}  run {row.run}  status ",
        (row.status, STATUS_STYLE.get(row.status, "")),
        f"  in {where}",
    )
    facts = [f"started {local_time(row.started_ms)}"]
    if row.finished_ms is not None:
        facts.append(f"finished {local_time(row.finished_ms)}")
    if row.wake_ms is not None:
        facts.append(f"wakes {local_time(row.wake_ms)}")
    if row.parent:
        facts.append(f"parent {row.parent}")
    if row.attributes:
        facts.append(f"attributes {short(jsonable(dict(row.attributes)), 80)}")
    out.say(("  " + "  ".join(facts), "dim"))
