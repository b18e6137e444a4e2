"""A run's journal as the UI shows it: operations by position, with their attempts.

`Timeline` takes a journal's ``(lsn, data)`` records one at a time, in log
order, and keeps what the run page draws: one entry per journal position
(by its ``seq``: each operation, and an update handler's return), the
positions with no record yet (``gaps``), the run's signals, updates and
streams, its outcome, and the times the records carry (``anchors``).
Everything it holds is JSON data already: payloads are decoded once, when
their record arrives.

The rule: a timeline only reads records, it never infers what they do not
say. A time the journal does not carry is None (the page places such a
record between the times around it), a record it cannot decode becomes a
``corrupt`` entry, never a guess, and an operation still open when the run's
end is recorded ends there, as that end says (cancelled, or abandoned).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from fusee._jsonview import VALUE_KINDS, SignalMarks, iso, jsonable, payload, recorded_value
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
    value_kind,
)
from fusee.store import RunRow

__all__ = ["Timeline", "iso", "jsonable", "payload", "row_json"]

# A stream keeps its last chunks only: a stream of a million tokens must not
# make a page of a million lines.
STREAM_TAIL: Final = 50

OPEN: Final = frozenset({"running", "retrying", "paused", "waiting", "set", "started"})
"""The statuses of an operation that has not ended (a detached child's is not one)."""


def row_json(row: RunRow) -> dict[str, Any]:
    """A run's row as the API serves it: the CLI's fields, with the times in ms too.

    Example:
        >>> row_json(RunRow("a", 1, "wf", "running", 0))["started_at"]
        '1970-01-01T00:00:00+00:00'
    """
    return {
        "id": row.id,
        "run": row.run,
        "workflow": row.workflow,
        "status": row.status,
        "started_at": iso(row.started_ms),
        "finished_at": iso(row.finished_ms),
        "wake_at": iso(row.wake_ms),
        "started_ms": row.started_ms,
        "finished_ms": row.finished_ms,
        "wake_ms": row.wake_ms,
        "attributes": jsonable(dict(row.attributes)),
        "parent": row.parent,
        "error": row.error,
    }


def _error(data: bytes) -> dict[str, Any]:
    """A recorded error (``[type, message]``, or ``[type, message, traceback]``)."""
    value = payload(data)
    if isinstance(value, list) and len(value) >= 2:
        error = {"type": str(value[0]), "message": str(value[1])}
        if len(value) >= 3:
            error["traceback"] = str(value[2])
        return error
    return {"type": "Error", "message": "" if value is None else str(value)}


def _status(status: Status) -> str:
    return status.name.lower().replace("_", " ")


def _outcome(rec: Done) -> dict[str, Any]:
    out: dict[str, Any] = {"lsn": None, "finished_ms": rec.finished_ms}
    if rec.status is Status.OK:
        out.update(status="completed", result=payload(rec.payload))
    elif rec.status is Status.CONTINUED:
        out.update(status="continued", result=payload(rec.payload))
    elif rec.status is Status.CANCELLED:
        out.update(status="cancelled", error={"type": "Cancelled", "message": payload(rec.payload)})
    else:
        out.update(status="failed", error=_error(rec.payload))
    if rec.by:
        out["by"] = payload(rec.by)
    return out


class Timeline:
    """A run's journal folded into what the run page shows, record by record.

    `add` takes the records in log order; `json` returns the whole timeline
    and `changes` only what changed since it was last called (what the
    run's event stream sends).

    Example:
        >>> from fusee import _codec
        >>> from fusee.record import encode
        >>> t = Timeline()
        >>> t.add(1, encode(Start(run=1, id="a", wtype="wf", started_ms=1000)))
        >>> t.add(2, encode(Attempt(1, 0, "charge", 1, 1500, _codec.encode(["OSError", "down"]))))
        >>> t.add(3, encode(Step(1, 0, "charge", 2, Status.OK, _codec.encode(7))))
        >>> op = t.json()["operations"][0]
        >>> (op["name"], op["status"], op["result"], [a["error"] for a in op["attempts"]])
        ('charge', 'ok', 7, [{'type': 'OSError', 'message': 'down'}, None])
    """

    def __init__(self) -> None:
        self.records = 0
        self.last_lsn = 0
        self.start: dict[str, Any] | None = None
        self.outcome: dict[str, Any] | None = None
        self.cancel: dict[str, Any] | None = None
        self.ops: dict[int, dict[str, Any]] = {}
        self.signals: list[dict[str, Any]] = []
        self._marks = SignalMarks()
        self.updates: list[dict[str, Any]] = []
        self.streams: dict[str, dict[str, Any]] = {}
        self.patches: list[dict[str, Any]] = []
        self.corrupt: list[dict[str, Any]] = []
        # (lsn, ms): the times the records carry, never decreasing, in log order.
        self.anchors: list[list[int]] = []
        self._dirty: dict[str, set[Any]] = {}
        self._new_anchors = 0
        self._head_dirty = False
        self._prev_lsn = 0

    # --- input ---------------------------------------------------------------------------------

    def add(self, lsn: int, data: bytes) -> None:
        """Folds in the record at ``lsn`` (records come in log order)."""
        self.records += 1
        self._prev_lsn = self.last_lsn
        self.last_lsn = lsn
        try:
            rec = decode(data)
        except FuseeError as e:
            self.corrupt.append({"key": lsn, "lsn": lsn, "error": str(e)})
            self._touch("corrupt", lsn)
            return
        self._fold(lsn, rec)

    def _touch(self, section: str, key: Any) -> None:
        self._dirty.setdefault(section, set()).add(key)

    def _anchor(self, lsn: int, ms: int) -> None:
        # Times only move forward: a lower bound (a timer fires at or after
        # its time) below an earlier time says nothing new.
        if self.anchors:
            last = self.anchors[-1]
            if lsn == last[0]:
                # Two times from one record (added in this same call): the later.
                last[1] = max(last[1], ms)
                return
            ms = max(ms, last[1])
        self.anchors.append([lsn, ms])
        self._new_anchors += 1

    def _op(self, lsn: int, seq: int, kind: str, name: str) -> dict[str, Any]:
        op = self.ops.get(seq)
        if op is None:
            op = self.ops[seq] = {
                "key": seq,
                "seq": seq,
                "kind": kind,
                "name": name,
                "status": "running",
                # The record before the operation's first: where its bar begins
                # when the journal has no time for its start.
                "begin_lsn": self._prev_lsn,
                "first_lsn": lsn,
                "last_lsn": lsn,
                "end_lsn": None,
                "result": None,
                "error": None,
                "attempts": [],
            }
        op["last_lsn"] = lsn
        self._touch("operations", seq)
        return op

    def _fold(self, lsn: int, rec: Record) -> None:
        if isinstance(rec, Start):
            self._fold_start(lsn, rec)
        elif isinstance(rec, Step | Attempt | Resume | Heartbeat):
            self._fold_step(lsn, rec)
        elif isinstance(rec, Timer):
            op = self._op(lsn, rec.seq, "timer", rec.name)
            op.update(status="set", fire_at_ms=rec.fire_at_ms)
        elif isinstance(rec, Fired):
            op = self._op(lsn, rec.seq, "timer", "")
            op.update(status="fired", end_lsn=lsn)
            if op.get("fire_at_ms") is not None:
                self._anchor(lsn, op["fire_at_ms"])
        elif isinstance(rec, Wait | Waited | Signal | Handled):
            self._fold_wait(lsn, rec)
        elif isinstance(rec, Value):
            op = self._op(lsn, rec.seq, "value", VALUE_KINDS.get(rec.kind, str(rec.kind)))
            op.update(status="recorded", end_lsn=lsn, result=recorded_value(rec))
            if rec.kind == value_kind.NOW and len(rec.value) == 8:
                self._anchor(lsn, int.from_bytes(rec.value, "little"))
        elif isinstance(rec, Child | ChildDone):
            self._fold_child(lsn, rec)
        elif isinstance(rec, Send):
            op = self._op(lsn, rec.seq, "send", rec.name)
            op.update(status="sent", end_lsn=lsn, target=rec.target, result=payload(rec.payload))
        elif isinstance(rec, Cancel):
            self.cancel = {"lsn": lsn, "reason": payload(rec.reason), "by": payload(rec.by)}
            self._head_dirty = True
        elif isinstance(rec, Done):
            self.outcome = _outcome(rec)
            self.outcome["lsn"] = lsn
            self._head_dirty = True
            self._anchor(lsn, rec.finished_ms)
            self._cut_off(lsn, "cancelled" if rec.status is Status.CANCELLED else "abandoned")
        elif isinstance(rec, Update | UpdateDone):
            self._fold_update(lsn, rec)
        elif isinstance(rec, Awaiting | Completed):
            self._fold_completion(lsn, rec)
        elif isinstance(rec, Patch):
            self.patches.append({"key": rec.id, "lsn": lsn, "at": rec.at, "id": rec.id})
            self._touch("patches", rec.id)
        elif isinstance(rec, Attributes):
            op = self._op(lsn, rec.seq, "attributes", "set_attributes")
            op.update(status="set", end_lsn=lsn, result=payload(rec.payload))
        elif isinstance(rec, Event):
            op = self._op(lsn, rec.seq, "event", rec.key)
            op.update(status="set", end_lsn=lsn, result=payload(rec.payload))
        else:
            self._fold_stream(lsn, rec)

    def _cut_off(self, lsn: int, status: str) -> None:
        """The run ended at ``lsn``: what it still waited for ends there with ``status``.

        The journal records no end of such an operation (a wait, a timer, a
        step in flight when the run was cancelled, an update's handler): the
        run's end is its end.
        """
        for op in self.ops.values():
            if op["end_lsn"] is not None or op["status"] not in OPEN:
                continue
            op.update(status=status, end_lsn=lsn, cut_off=True)
            for attempt in op["attempts"]:
                if attempt["status"] in OPEN:
                    attempt["status"] = status
            self._touch("operations", op["seq"])
        for update in self.updates:
            if update["status"] in OPEN:
                update["status"] = status
                self._touch("updates", update["ordinal"])

    def _fold_start(self, lsn: int, rec: Start) -> None:
        self.start = {
            "lsn": lsn,
            "run": rec.run,
            "workflow": rec.wtype,
            "started_ms": rec.started_ms,
            "deadline_ms": rec.deadline_ms or None,
            "parent": None
            if rec.parent is None
            else {"id": rec.parent.id, "run": rec.parent.run, "seq": rec.parent.seq},
            "input": payload(rec.input),
        }
        self._head_dirty = True
        self._anchor(lsn, rec.started_ms)

    def _fold_step(self, lsn: int, rec: Step | Attempt | Resume | Heartbeat) -> None:
        name = rec.name if isinstance(rec, Step | Attempt) else ""
        op = self._op(lsn, rec.seq, "step", name)
        if name and not op["name"]:
            op["name"] = name
        attempts: list[dict[str, Any]] = op["attempts"]
        if isinstance(rec, Resume):
            if attempts:
                attempts[-1]["resumed_lsn"] = lsn
            op["status"] = "running"
            return
        number = rec.attempt
        attempt = next((a for a in attempts if a["attempt"] == number), None)
        if attempt is None:
            previous = attempts[-1] if attempts else None
            # The run asked for this attempt at the previous one's retry time:
            # it ran at or after it.
            due_ms = None
            if previous is not None and previous.get("retry_at_ms") is not None:
                due_ms = previous["retry_at_ms"]
                self._anchor(lsn, due_ms)
            attempt = {
                "attempt": number,
                "status": "running",
                "lsn": None,
                "after_lsn": previous["lsn"] if previous is not None else op["begin_lsn"],
                "due_ms": due_ms,
                "started_ms": None,
                "run_ms": None,
                "queue_ms": None,
                "error": None,
                "retry_at_ms": None,
                "paused": False,
                "progress": None,
                "heartbeats": 0,
            }
            attempts.append(attempt)
        if isinstance(rec, Heartbeat):
            attempt["progress"] = payload(rec.payload)
            attempt["heartbeats"] += 1
            op["progress"] = attempt["progress"]
            return
        attempt["lsn"] = lsn
        if isinstance(rec, Attempt):
            attempt["error"] = _error(rec.error)
            paused = rec.retry_at_ms == PAUSED
            attempt["status"] = "failed"
            attempt["paused"] = paused
            attempt["retry_at_ms"] = None if paused else rec.retry_at_ms
            op["status"] = "paused" if paused else "retrying"
            return
        status = _status(rec.status)
        attempt["status"] = status
        op.update(status=status, end_lsn=lsn)
        if rec.status is Status.OK:
            op["result"] = payload(rec.payload)
        else:
            attempt["error"] = op["error"] = _error(rec.payload)
        if rec.time is not None:
            attempt["started_ms"] = rec.time.started_ms
            attempt["run_ms"] = rec.time.elapsed_us / 1000
            if attempt["due_ms"] is not None:
                attempt["queue_ms"] = max(0, rec.time.started_ms - attempt["due_ms"])
            self._anchor(lsn, rec.time.started_ms + rec.time.elapsed_us // 1000)

    def _fold_wait(self, lsn: int, rec: Wait | Waited | Signal | Handled) -> None:
        if not isinstance(rec, Handled):
            self._fold_signal(lsn, rec)
        # After the record is in: a signal's "set_aside" says a wait refused
        # it (its payload does not fit) and none took it.
        for ordinal in self._marks.add(rec):
            if ordinal < len(self.signals):
                self.signals[ordinal]["set_aside"] = self._marks.is_set_aside(ordinal)
                self.signals[ordinal]["handled"] = self._marks.is_handled(ordinal)
                self._touch("signals", ordinal)

    def _fold_signal(self, lsn: int, rec: Wait | Waited | Signal) -> None:
        if isinstance(rec, Signal):
            ordinal = len(self.signals)
            self.signals.append(
                {
                    "key": ordinal,
                    "ordinal": ordinal,
                    "lsn": lsn,
                    "name": rec.name,
                    "payload": payload(rec.payload),
                    "by": payload(rec.by),
                    "consumed_by": None,
                    "handled": False,
                    "set_aside": False,
                }
            )
            self._touch("signals", ordinal)
            return
        if isinstance(rec, Wait):
            op = self._op(lsn, rec.seq, "wait", rec.name)
            op.update(status="waiting", signal=rec.name, deadline_ms=rec.deadline_ms or None)
            return
        op = self._op(lsn, rec.seq, "wait", "")
        o = rec.outcome
        op["end_lsn"] = lsn
        if o.is_signal:
            op["status"] = "signalled"
            op["ordinal"] = o.ordinal
            if o.ordinal < len(self.signals):
                signal = self.signals[o.ordinal]
                signal["consumed_by"] = rec.seq
                op["result"] = signal["payload"]
                self._touch("signals", o.ordinal)
        elif o.is_abandoned:
            op["status"] = "abandoned"
        else:
            op["status"] = "timed out"
            if op.get("deadline_ms"):
                self._anchor(lsn, op["deadline_ms"])

    def _fold_child(self, lsn: int, rec: Child | ChildDone) -> None:
        if isinstance(rec, Child):
            op = self._op(lsn, rec.seq, "child", rec.wtype)
            detached = bool(rec.flags & DETACHED)
            op.update(
                status="detached" if detached else "started",
                child={"id": rec.id, "workflow": rec.wtype, "detached": detached},
                input=payload(rec.input),
            )
            return
        op = self._op(lsn, rec.seq, "child", "")
        op.update(status=_status(rec.status), end_lsn=lsn)
        if rec.status is Status.OK:
            op["result"] = payload(rec.payload)
        else:
            op["error"] = _error(rec.payload)

    def _fold_update(self, lsn: int, rec: Update | UpdateDone) -> None:
        if isinstance(rec, Update):
            ordinal = len(self.updates)
            self.updates.append(
                {
                    "key": ordinal,
                    "ordinal": ordinal,
                    "lsn": lsn,
                    "name": rec.name,
                    "id": rec.id,
                    "payload": payload(rec.payload),
                    "status": "running",
                    "result": None,
                    "error": None,
                    "done_lsn": None,
                    "seq": None,
                }
            )
            self._touch("updates", ordinal)
            return
        known = rec.ordinal < len(self.updates)
        # The handler's return takes a position of the journal: a row of its own,
        # from the update's arrival to its return.
        op = self._op(lsn, rec.seq, "update", self.updates[rec.ordinal]["name"] if known else "")
        op.update(status=_status(rec.status), end_lsn=lsn, ordinal=rec.ordinal)
        if known:
            op["first_lsn"] = self.updates[rec.ordinal]["lsn"]
        if rec.status is Status.OK:
            op["result"] = payload(rec.payload)
        else:
            op["error"] = _error(rec.payload)
        if not known:
            return
        update = self.updates[rec.ordinal]
        update.update(status=op["status"], done_lsn=lsn, seq=rec.seq)
        update["result"], update["error"] = op["result"], op["error"]
        self._touch("updates", rec.ordinal)

    def _fold_completion(self, lsn: int, rec: Awaiting | Completed) -> None:
        name = rec.name if isinstance(rec, Awaiting) else ""
        op = self._op(lsn, rec.seq, "completion", name)
        if name and not op["name"]:
            op["name"] = name
        attempts: list[dict[str, Any]] = op["attempts"]
        attempt = next((a for a in attempts if a["attempt"] == rec.attempt), None)
        if attempt is None:
            attempt = {
                "attempt": rec.attempt,
                "status": "waiting",
                "lsn": lsn,
                "after_lsn": attempts[-1]["lsn"] if attempts else op["begin_lsn"],
                "error": None,
            }
            attempts.append(attempt)
        if isinstance(rec, Awaiting):
            op["status"] = "waiting"
            return
        status = _status(rec.status)
        attempt.update(status=status, lsn=lsn)
        op.update(status=status, end_lsn=lsn)
        if rec.status is Status.OK:
            op["result"] = payload(rec.payload)
        else:
            attempt["error"] = op["error"] = _error(rec.payload)

    def _fold_stream(self, lsn: int, rec: Chunk | StreamEnd) -> None:
        s = self.streams.get(rec.stream)
        if s is None:
            s = self.streams[rec.stream] = {
                "key": rec.stream,
                "name": rec.stream,
                "seq": None if rec.seq == stream.WORKFLOW else rec.seq,
                "chunks": 0,
                "tail": [],
                "status": "open",
                "lsn": lsn,
            }
        s["lsn"] = lsn
        if isinstance(rec, Chunk):
            s["chunks"] += 1
            tail: list[Any] = s["tail"]
            tail.append({"offset": rec.offset, "payload": payload(rec.payload)})
            if len(tail) > STREAM_TAIL:
                del tail[0]
        else:
            s["status"] = _status(rec.status)
            s["chunks"] = rec.chunks
        self._touch("streams", rec.stream)

    # --- output --------------------------------------------------------------------------------

    def gaps(self) -> list[int]:
        """The positions below the last one that have no record (yet).

        An operation the code started writes its first record when it has
        one: a step in flight has none until it ends. The page shows each
        such position, so that no position is skipped unseen.
        """
        top = max(self.ops, default=-1)
        if len(self.ops) == top + 1:
            return []
        return [seq for seq in range(top) if seq not in self.ops]

    def _head(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "outcome": self.outcome,
            "cancel": self.cancel,
            "records": self.records,
            "last_lsn": self.last_lsn,
            "gaps": self.gaps(),
        }

    def mark(self) -> None:
        """Forgets what changed so far: `changes` reports what is added from now on."""
        self._dirty = {}
        self._new_anchors = 0
        self._head_dirty = False

    def json(self) -> dict[str, Any]:
        """The whole timeline, operations by position (and `mark`s it)."""
        self.mark()
        return {
            **self._head(),
            "operations": [self.ops[k] for k in sorted(self.ops)],
            "signals": list(self.signals),
            "updates": list(self.updates),
            "streams": [self.streams[k] for k in sorted(self.streams)],
            "patches": list(self.patches),
            "corrupt": list(self.corrupt),
            "anchors": list(self.anchors),
        }

    def changes(self) -> dict[str, Any] | None:
        """What changed since the last `json` or `changes`: None when nothing did.

        Lists hold the changed items whole (each has a ``key``, to replace the
        item with that key, or to add it); ``anchors`` holds the new ones only.
        """
        if not self._dirty and not self._new_anchors and not self._head_dirty:
            return None
        sections: Mapping[str, Mapping[Any, dict[str, Any]]] = {
            "operations": self.ops,
            "signals": dict(enumerate(self.signals)),
            "updates": dict(enumerate(self.updates)),
            "streams": self.streams,
            "patches": {p["key"]: p for p in self.patches},
            "corrupt": {c["key"]: c for c in self.corrupt},
        }
        out: dict[str, Any] = self._head()
        for section, keys in self._dirty.items():
            items = sections[section]
            out[section] = [items[k] for k in sorted(keys) if k in items]
        out["anchors"] = self.anchors[len(self.anchors) - self._new_anchors :]
        self.mark()
        return out
