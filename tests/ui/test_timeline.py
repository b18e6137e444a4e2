"""`fusee.ui._timeline.Timeline`: records folded into what the run page shows."""

from __future__ import annotations

from fusee import _codec
from fusee.record import (
    PAUSED,
    Attempt,
    Cancel,
    Done,
    Handled,
    Heartbeat,
    Record,
    Resume,
    Signal,
    Start,
    Status,
    Step,
    StepTime,
    Timer,
    Update,
    UpdateDone,
    Wait,
    Waited,
    WaitOutcome,
    encode,
)
from fusee.ui._timeline import Timeline


def fold(*records: Record) -> Timeline:
    t = Timeline()
    for lsn, rec in enumerate(records, 1):
        t.add(lsn, encode(rec))
    return t


def err(message: str) -> bytes:
    return _codec.encode(["TimeoutError", message])


def test_queue_delay_and_run_time_come_from_a_steps_recorded_time() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=1_000),
        Attempt(1, 0, "fetch", 1, 2_000, err("slow")),
        Step(1, 0, "fetch", 2, Status.OK, _codec.encode("page"), StepTime(2_250, 40_000)),
    )
    [op] = t.json()["operations"]
    first, second = op["attempts"]
    assert first["retry_at_ms"] == 2_000
    assert (second["due_ms"], second["started_ms"]) == (2_000, 2_250)
    assert second["queue_ms"] == 250
    assert second["run_ms"] == 40.0
    # The step's end is a time the journal carries.
    assert t.anchors[-1] == [3, 2_290]


def test_heartbeats_and_a_resume_after_a_pause_are_kept_per_attempt() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=0),
        Heartbeat(1, 0, 1, _codec.encode({"pct": 40})),
        Heartbeat(1, 0, 1, _codec.encode({"pct": 80})),
        Attempt(1, 0, "load", 1, PAUSED, err("gave up")),
        Resume(1, 0, 1),
    )
    [op] = t.json()["operations"]
    [attempt] = op["attempts"]
    assert (attempt["progress"], attempt["heartbeats"]) == ({"pct": 80}, 2)
    assert attempt["paused"] is True
    assert attempt["resumed_lsn"] == 5
    assert op["status"] == "running"
    assert op["progress"] == {"pct": 80}


def test_updates_get_their_result_by_ordinal() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf"),
        Update(1, "bump", "u-1", _codec.encode(3)),
        UpdateDone(1, 0, 0, Status.OK, _codec.encode(4)),
    )
    [update] = t.json()["updates"]
    assert (update["name"], update["id"], update["payload"]) == ("bump", "u-1", 3)
    assert (update["status"], update["result"]) == ("ok", 4)


def test_changes_hold_only_what_changed_since_the_last_call() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=5),
        Step(1, 0, "one", 1, Status.OK, _codec.encode(1)),
    )
    t.json()
    assert t.changes() is None
    t.add(3, encode(Step(1, 1, "two", 1, Status.OK, _codec.encode(2))))
    t.add(4, encode(Done(1, Status.OK, 99, _codec.encode("done"))))
    changes = t.changes()
    assert changes is not None
    assert [op["name"] for op in changes["operations"]] == ["two"]
    assert changes["outcome"]["result"] == "done"
    assert changes["anchors"] == [[4, 99]]
    assert t.changes() is None


def test_a_record_that_does_not_decode_is_shown_as_corrupt() -> None:
    t = Timeline()
    t.add(1, encode(Start(run=1, id="a", wtype="wf")))
    t.add(2, b"\x01garbage")
    [corrupt] = t.json()["corrupt"]
    assert corrupt["lsn"] == 2
    assert "journal record" in corrupt["error"]


def test_a_runs_end_is_sent_as_the_end_of_what_it_waited_for() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=5),
        Wait(1, 0, "go", 0),
        Timer(1, 1, "nap", 3_600_000),
    )
    t.json()
    t.add(4, encode(Cancel(1, _codec.encode("out of stock"))))
    t.add(5, encode(Done(1, Status.CANCELLED, 99, _codec.encode("out of stock"))))
    changes = t.changes()
    assert changes is not None
    assert [(op["name"], op["status"], op["end_lsn"]) for op in changes["operations"]] == [
        ("go", "cancelled", 5),
        ("nap", "cancelled", 5),
    ]


def test_positions_without_a_record_are_listed_as_gaps() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf"),
        Timer(1, 1, "nap", 10),
        Step(1, 3, "late", 1, Status.OK, _codec.encode(1)),
    )
    assert t.json()["gaps"] == [0, 2]
    t.add(4, encode(Step(1, 0, "slow", 1, Status.OK, _codec.encode(0))))
    changes = t.changes()
    assert changes is not None
    assert changes["gaps"] == [2]


def test_a_signal_a_wait_set_aside_is_marked_until_a_later_wait_takes_it() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=0),
        Wait(1, 0, "count", 0),
        Signal(1, "count", 0, _codec.encode("five")),
        Signal(1, "count", 0, _codec.encode(5)),
        Waited(1, 0, WaitOutcome.signal(1)),
    )
    shown = t.json()["signals"]
    assert [(s["payload"], s["set_aside"], s["consumed_by"]) for s in shown] == [
        ("five", True, None),
        (5, False, 0),
    ]
    # A later wait (of another type) takes it: the mark goes.
    t.add(6, encode(Wait(1, 1, "count", 0)))
    t.add(7, encode(Waited(1, 1, WaitOutcome.signal(0))))
    [changed] = t.changes()["signals"]  # type: ignore[index]
    assert (changed["ordinal"], changed["set_aside"], changed["consumed_by"]) == (0, False, 1)


def test_a_signal_a_handler_got_is_marked_handled_never_set_aside() -> None:
    t = fold(
        Start(run=1, id="a", wtype="wf", started_ms=0),
        Wait(1, 0, "count", 0),
        Signal(1, "note", 0, _codec.encode("hi")),
        Signal(1, "count", 0, _codec.encode("five")),
    )
    assert [(s["handled"], s["set_aside"]) for s in t.json()["signals"]] == [
        (False, False),
        (False, True),
    ]
    # The count's wait refused it, and a handler of "count" got it.
    t.add(5, encode(Handled(1, 0)))
    t.add(6, encode(Handled(1, 1)))
    changed = t.changes()["signals"]  # type: ignore[index]
    assert [(s["ordinal"], s["handled"], s["set_aside"], s["consumed_by"]) for s in changed] == [
        (0, True, False, None),
        (1, True, False, None),
    ]
