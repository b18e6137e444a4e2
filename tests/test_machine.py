"""The reference's tests of the journal machine, ported, and more of its rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusee.errors import DeterminismError
from fusee.machine import (
    Arm,
    AsyncCompleted,
    AwaitStart,
    CancelAll,
    ChildCompleted,
    Deliver,
    DeliverLive,
    DeliverUpdate,
    Idle,
    LiveStep,
    OpKind,
    Outcome,
    RunMachine,
    SignalMatched,
    Stalled,
    StepCompleted,
    StepStart,
    StreamOpen,
    TimerFired,
    WaitTimedOut,
)
from fusee.record import (
    DETACHED,
    PAUSED,
    Attempt,
    Cancel,
    Chunk,
    Fired,
    Meta,
    Patch,
    Record,
    Resume,
    Signal,
    Start,
    Status,
    Step,
    StreamEnd,
    UpdateRequest,
    Value,
    Waited,
    WaitOutcome,
    stream,
    value_kind,
)


def p(s: str) -> bytes:
    return s.encode()


def start() -> Start:
    return Start(run=1, id="wf", wtype="t", version=1, started_ms=10, input=p("in"))


def ok(payload: str) -> StepCompleted:
    return StepCompleted(Status.OK, p(payload))


def drain(m: RunMachine, journal: list[Record]) -> list[tuple[int, Outcome]]:
    """Delivers everything deliverable, appending live records to ``journal``."""
    out: list[tuple[int, Outcome]] = []
    while True:
        n = m.next()
        if isinstance(n, Deliver):
            if n.record is not None:
                journal.append(n.record)
            out.append((n.seq, n.outcome))
        elif isinstance(n, DeliverLive):
            journal.append(n.record.record(m.run(), n.seq, n.outcome))
            out.append((n.seq, n.outcome))
        elif isinstance(n, CancelAll):
            if n.record is not None:
                journal.append(n.record)
            out.extend((s, Outcome(Status.CANCELLED, n.reason)) for s in n.seqs)
        elif isinstance(n, DeliverUpdate):
            continue
        else:
            return out


def test_live_then_replay_in_journal_order() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, sa = m.begin_step("a")
    b, _ = m.begin_step("b")
    assert sa == StepStart.run(1, 0)
    # b finishes before a.
    m.complete(b, ok("B"))
    m.complete(a, ok("A"))
    got = drain(m, journal)
    assert [g[0] for g in got] == [b, a]

    # Replay delivers b before a even though a is registered first.
    r = RunMachine(journal, 3)
    assert r.begin_step("a")[1] == StepStart.REPLAY
    assert r.begin_step("b")[1] == StepStart.REPLAY
    scratch: list[Record] = []
    got = drain(r, scratch)
    assert scratch == []
    assert got == [(b, Outcome.ok(p("B"))), (a, Outcome.ok(p("A")))]
    assert not r.is_replaying()


def test_mismatched_name_is_a_determinism_error() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    m.complete(s, ok("1"))
    drain(m, journal)
    r = RunMachine(journal, 2)
    with pytest.raises(DeterminismError) as e:
        r.begin_step("refund")
    assert e.value.seq == 0
    assert str(e.value) == (
        "determinism error at journal position 0: "
        "the journal recorded step 'charge' here but the code called step 'refund'"
    )


@pytest.mark.parametrize(
    ("call", "called"),
    [
        pytest.param(lambda m: m.begin_sleep("charge", 5), "sleep 'charge'", id="sleep"),
        pytest.param(lambda m: m.begin_wait("charge", 0), "wait 'charge'", id="wait"),
        pytest.param(
            lambda m: m.begin_child("charge", "c", 0, 0, b""), "child 'charge'", id="child"
        ),
        pytest.param(lambda m: m.send("x", "charge", b""), "send 'charge'", id="send"),
        pytest.param(lambda m: m.value(0, lambda: b""), "value ''", id="value"),
        pytest.param(lambda m: m.set_attributes(b""), "setAttributes ''", id="attributes"),
        pytest.param(lambda m: m.set_event("charge", b""), "setEvent 'charge'", id="event"),
    ],
)
def test_another_kind_of_operation_at_a_step_is_a_determinism_error(
    call: Callable[[RunMachine], object], called: str
) -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    m.complete(s, ok("1"))
    drain(m, journal)
    r = RunMachine(journal, 2)
    with pytest.raises(
        DeterminismError, match=f"recorded step 'charge' here but the code called {called}"
    ):
        call(r)


def test_live_completions_wait_for_replay() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.begin_step("b")
    m.complete(a, ok("A"))
    drain(m, journal)
    # Crash: b never finished. On replay, b runs live; its completion must
    # wait until a's recorded result has been delivered.
    r = RunMachine(journal, 2)
    assert r.begin_step("a") == (a, StepStart.REPLAY)
    b2, sb = r.begin_step("b")
    assert not sb.is_replay
    r.complete(b2, ok("B"))
    more: list[Record] = []
    got = drain(r, more)
    assert [g[0] for g in got] == [a, b2]
    assert len(more) == 1


def test_retries_resume_from_the_journal() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("flaky")
    journal.append(_some(m.step_retry(s, 500, p("e1"))))
    journal.append(_some(m.step_retry(s, 900, p("e2"))))
    r = RunMachine(journal, 3)
    assert r.begin_step("flaky")[1] == StepStart.run(3, 900)


def _some(x: Record | None) -> Record:
    assert x is not None
    return x


def test_a_paused_step_resumes_with_a_fresh_budget() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    journal.append(_some(m.step_retry(s, 500, p("e1"))))
    assert not m.is_suspended()
    journal.append(_some(m.step_retry(s, PAUSED, p("e2"))))
    assert m.step_paused(s)
    assert m.is_paused()
    assert m.is_suspended()
    # A crash while paused: the step is still paused.
    r = RunMachine(journal, 3)
    assert r.is_paused()
    assert r.begin_step("charge")[1] == StepStart.run(3, PAUSED)
    assert r.step_paused(s)
    assert r.is_suspended()
    # Live: the resume names the last attempt; the next is the 3rd in the
    # journal and the 1st of the new budget.
    resumed = m.resume(p("cli:ana"))
    assert resumed == [Resume(run=1, seq=s, attempt=2, by=p("cli:ana"))]
    assert not m.step_paused(s)
    assert not m.is_paused()
    assert m.resume(None) == []
    journal.extend(resumed)
    journal.append(_some(m.step_retry(s, 900, p("e3"))))
    # Replay: attempts count from the resume; the journal's go on.
    r = RunMachine(journal, 4)
    assert r.begin_step("charge")[1] == StepStart.run(2, 900)
    assert r.step_retry(s, 950, p("e4")) == Attempt(
        run=1, seq=s, name="charge", attempt=4, retry_at_ms=950, error=p("e4")
    )


def test_a_resume_before_the_code_reaches_the_step() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    journal.append(_some(m.step_retry(s, PAUSED, p("e1"))))
    # Loaded from the journal; the code has not run yet.
    r = RunMachine(journal, 2)
    assert r.is_paused()
    assert len(r.resume(None)) == 1
    assert not r.is_paused()
    assert r.begin_step("charge")[1] == StepStart.run(1, 0)
    assert not r.step_paused(s)


def test_cancellation_replays_at_the_same_point() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    w, arm = m.begin_wait("approve", 0)
    assert arm.record is not None
    journal.append(arm.record)
    m.request_cancel(p("stop"))
    got = drain(m, journal)
    assert len(got) == 2
    assert all(g[1].status == Status.CANCELLED for g in got)
    # Compensation after cancellation runs normally.
    c, _ = m.begin_step("undo")
    m.complete(c, ok("u"))
    drain(m, journal)
    journal.append(m.finish(Status.CANCELLED, p("stop"), 99))

    r = RunMachine(journal, 9)
    assert r.begin_step("a") == (a, StepStart.run(1, 0))
    assert r.begin_wait("approve", 0) == (w, Arm.ARMED)
    none: list[Record] = []
    got = drain(r, none)
    assert len(got) == 2
    assert none == []
    assert r.begin_step("undo")[1] == StepStart.REPLAY
    assert drain(r, none)[0][1] == Outcome.ok(p("u"))
    assert r.recorded_done() is not None


def test_repeated_terminal_cancel_replays_without_hiding_other_deliveries() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    m.begin_step("charge")
    m.request_cancel(p("stop"))
    assert len(drain(m, journal)) == 1
    m.request_cancel(p("retry"))
    assert drain(m, journal) == []
    assert len(journal) == 2
    journal.append(Cancel(run=1, reason=p("retry"), by=None))
    replay = RunMachine(journal, 3)
    replay.begin_step("charge")
    assert isinstance(replay.next(), CancelAll)
    replay.check_end()
    # Compensation started after that cancellation. Its historical
    # cancellation must still be delivered before the workflow returns.
    replay.begin_step("undo")
    with pytest.raises(DeterminismError):
        replay.check_end()
    assert isinstance(replay.next(), CancelAll)
    replay.check_end()


def test_values_and_waits_replay() -> None:
    journal: list[Record] = [start(), Signal(run=1, name="go", dedup=0, payload=p("yes"))]
    m = RunMachine(journal, 2)
    _, now, rec = m.value(value_kind.NOW, lambda: p("12345678"))
    journal.append(_some(rec))
    assert now == b"12345678"
    w, arm = m.begin_wait("go", 0)
    journal.append(_some(arm.record))
    m.complete(w, SignalMatched(0, p("yes")))
    drain(m, journal)

    r = RunMachine(journal, 5)
    _, v, rec = r.value(value_kind.NOW, lambda: p("other"))
    assert (v, rec) == (b"12345678", None)
    assert r.begin_wait("go", 0)[1] == Arm.REPLAY
    assert r.next() == Deliver(w, Outcome.ok(p("yes")), None)


def test_stall_is_reported_only_when_nothing_live_is_pending() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    m.begin_step("a")
    b, _ = m.begin_step("b")
    m.complete(b, ok("B"))
    drain(m, journal)
    # On replay the code starts "a" (live: it never finished) but never
    # starts "b", whose result the journal delivers next.
    r = RunMachine(journal, 2)
    a, _ = r.begin_step("a")
    assert r.next() == Stalled()
    assert r.stall_error() is None, "step a is live work"
    r.forget(a)
    err = r.stall_error()
    assert err is not None
    assert "step 'b'" in err.message
    assert err.seq == b


def test_updates_are_deliveries_in_journal_order() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.offer_update(77, "add", "u1", p("5"))
    n = m.next()
    assert isinstance(n, DeliverUpdate)
    assert n.live == 77
    assert n.ordinal == 0
    ord_, rec = m.accept_update(n.name, n.id, n.payload)
    journal.append(rec)
    # The handler runs a step and returns.
    h, _ = m.begin_step("handler-step")
    m.complete(h, ok("H"))
    drain(m, journal)
    _, done = m.update_done(ord_, Status.OK, p("6"))
    journal.append(_some(done))
    m.complete(a, ok("A"))
    drain(m, journal)

    # Replay: the update is delivered at its place, the handler's step and
    # result are recorded, nothing is appended.
    r = RunMachine(journal, 9)
    assert r.begin_step("a")[1] == StepStart.REPLAY
    n = r.next()
    assert isinstance(n, DeliverUpdate)
    assert n.ordinal == 0
    assert n.live is None
    assert r.begin_step("handler-step")[1] == StepStart.REPLAY
    n2 = r.next()
    assert isinstance(n2, Deliver)
    assert n2.seq == h
    assert r.update_done(0, Status.OK, p("6"))[1] is None
    n3 = r.next()
    assert isinstance(n3, Deliver)
    assert n3.seq == a
    assert not r.is_replaying()


def test_the_result_of_another_update_is_a_determinism_error() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    _, done = m.update_done(0, Status.OK, b"")
    journal.append(_some(done))
    with pytest.raises(DeterminismError, match=r"update #0 here but the code returned update #1"):
        RunMachine(journal, 2).update_done(1, Status.OK, b"")


def test_an_update_with_the_start_is_delivered_first() -> None:
    s = Start(1, "wf", "t", update=UpdateRequest("bump", "u-1", p("3")))
    m = RunMachine.fresh(s, 1)
    assert m.next() == DeliverUpdate(0, "bump", "u-1", p("3"), None)
    m.offer_update(5, "bump", "u-2", p("4"))
    n = m.next()
    assert isinstance(n, DeliverUpdate)
    assert n.ordinal == 1
    assert n.live == 5


def test_async_completion_checks_the_attempt() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, st = m.begin_await("approval")
    assert st == AwaitStart.run(1, 0)
    # The token function failed once and is retried.
    journal.append(_some(m.step_retry(s, 5, p("smtp down"))))
    journal.append(_some(m.awaiting(s)))
    assert m.is_suspended()
    # A token from the first attempt is stale.
    assert not m.complete(s, AsyncCompleted(1, Status.OK, p("x")))
    assert m.complete(s, AsyncCompleted(2, Status.OK, p("yes")))
    got = drain(m, journal)
    assert got == [(s, Outcome.ok(p("yes")))]
    # Replay after the token went out waits instead of running again.
    r = RunMachine(journal[:3], 3)
    assert r.begin_await("approval")[1] == AwaitStart.waiting(2)
    r = RunMachine(journal, 4)
    assert r.begin_await("approval")[1] == AwaitStart.REPLAY


def test_patches_take_no_position() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok("A"))
    drain(m, journal)
    b, _ = m.begin_step("b")
    m.complete(b, ok("B"))
    drain(m, journal)
    # Old code ran a then b. New code asks for a patch between them:
    # replaying, it must take the old branch and keep b at seq 1.
    r = RunMachine(journal, 3)
    r.begin_step("a")
    assert r.patched("fix") == (False, None)
    assert r.begin_step("b") == (1, StepStart.REPLAY)
    # Past the journal the patch applies, and is remembered.
    on, rec = r.patched("later")
    assert on
    j2 = [*journal, _some(rec)]
    r2 = RunMachine(j2, 4)
    r2.begin_step("a")
    r2.begin_step("b")
    assert r2.patched("later") == (True, None)


def test_a_finished_run_replays_patched_after_its_last_operation_as_the_old_branch() -> None:
    # Old code ran a and ended; the new code asks for a patch after a. A
    # query replays the finished run: it must see the branch the run took.
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok("A"))
    drain(m, journal)
    journal.append(m.finish(Status.OK, p("done"), 20))
    r = RunMachine(journal, len(journal))
    r.begin_step("a")
    drain(r, [])
    assert r.patched("fix") == (False, None)
    assert r.recorded_done() == (Status.OK, p("done"))


def test_an_unfinished_run_takes_a_patch_after_its_last_operation() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok("A"))
    drain(m, journal)
    r = RunMachine(journal, len(journal))
    r.begin_step("a")
    drain(r, [])
    on, rec = r.patched("fix")
    assert on
    assert rec == Patch(1, 1, "fix")


def test_heartbeat_progress_survives_into_the_retry() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("export")
    journal.append(_some(m.heartbeat(s, p("page-7"))))
    r = RunMachine(journal, 2)
    r.begin_step("export")
    assert r.progress(s) == p("page-7")


def test_a_queued_completion_is_taken_once_and_in_order() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    n = 20_000
    seqs = [m.begin_step("s")[0] for _ in range(n)]

    def done(i: int) -> StepCompleted:
        return StepCompleted(Status.OK, p(str(i)))

    # Completed back to front, each reported twice: only the first counts.
    for s in reversed(seqs):
        assert m.complete(s, done(s))
        assert not m.complete(s, done(s + 1))
    got = drain(m, journal)
    assert [g[0] for g in got] == list(reversed(seqs))
    assert all(o.payload == p(str(s)) for s, o in got)
    # Delivered: the operation is no longer pending, so a late report is ignored.
    assert not m.complete(seqs[0], done(0))
    assert m.next() == Idle()


# --- beyond the reference's tests: construction, fast path, streams, ... ----------


@pytest.mark.parametrize(
    "journal",
    [
        pytest.param([], id="empty"),
        pytest.param([Fired(1, 0)], id="no-start"),
    ],
)
def test_a_journal_without_a_start_is_refused(journal: list[Record]) -> None:
    with pytest.raises(DeterminismError, match="journal does not begin with a start record"):
        RunMachine(journal, 1)


def test_a_second_start_is_refused() -> None:
    with pytest.raises(DeterminismError, match="journal holds a second start record"):
        RunMachine([start(), start()], 2)


def test_a_journal_whose_records_disagree_about_a_position_is_refused() -> None:
    journal: list[Record] = [start(), Step(1, 0, "a", 1, Status.OK, b""), Fired(1, 0)]
    with pytest.raises(DeterminismError, match="journal is inconsistent: step 'a' and sleep ''"):
        RunMachine(journal, 3)


def test_a_wait_on_a_signal_the_journal_lacks_is_refused() -> None:
    journal: list[Record] = [start(), Waited(1, 0, WaitOutcome.signal(3))]
    with pytest.raises(DeterminismError, match="consumed a signal the journal does not hold"):
        RunMachine(journal, 2)


def test_the_run_info_comes_from_the_start_record() -> None:
    s = Start(7, "order-1", "checkout", version=2, started_ms=5, input=b"x", meta=Meta(b"tp"))
    info = RunMachine.fresh(s, 1).info()
    assert (info.run, info.id, info.wtype, info.version, info.input, info.trace) == (
        7,
        "order-1",
        "checkout",
        2,
        b"x",
        b"tp",
    )


def test_a_lone_live_step_is_taken_at_once() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    assert m.take_live_step(s) == LiveStep("a", 1)
    assert m.is_idle()
    # With two pending, the fast path declines and changes nothing.
    a, _ = m.begin_step("a")
    m.begin_step("b")
    assert m.take_live_step(a) is None
    assert m.pending_len() == 2


def test_delivers_only_sees_a_lone_queued_step() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    assert not m.delivers_only(s)
    m.complete(s, ok("x"))
    assert m.delivers_only(s)


def test_a_value_of_another_kind_is_a_determinism_error() -> None:
    m = RunMachine.fresh(start(), 1)
    _, _, rec = m.value(value_kind.RANDOM, lambda: b"r")
    r = RunMachine([start(), _some(rec)], 2)
    with pytest.raises(
        DeterminismError, match="recorded value kind 2 here but the code asked for kind 1"
    ):
        r.now(5)


def test_now_is_recorded_and_replayed() -> None:
    m = RunMachine.fresh(start(), 1)
    t, rec = m.now(1_700_000_000_000)
    assert t == 1_700_000_000_000
    assert isinstance(rec, Value)
    r = RunMachine([start(), rec], 2)
    assert r.now(5) == (1_700_000_000_000, None)


def test_sleeps_fire_and_replay() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, arm = m.begin_sleep("nap", 1000)
    journal.append(_some(arm.record))
    assert m.is_suspended()
    m.complete(s, TimerFired())
    assert drain(m, journal) == [(s, Outcome.ok(b""))]
    assert journal[-1] == Fired(1, s)
    # A crash before the timer fired: armed, not appended again.
    assert RunMachine(journal[:2], 2).begin_sleep("nap", 1000)[1] == Arm.ARMED
    assert RunMachine(journal, 3).begin_sleep("nap", 1000)[1] == Arm.REPLAY


def test_a_wait_times_out_and_replays_as_timed_out() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    w, arm = m.begin_wait("go", 50)
    journal.append(_some(arm.record))
    m.complete(w, WaitTimedOut())
    assert drain(m, journal) == [(w, Outcome.empty(Status.TIMED_OUT))]
    r = RunMachine(journal, 3)
    r.begin_wait("go", 50)
    assert r.next() == Deliver(w, Outcome.empty(Status.TIMED_OUT), None)


def test_a_forgotten_wait_is_recorded_as_abandoned_once() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    w, arm = m.begin_wait("go", 0)
    journal.append(_some(arm.record))
    rec = m.forget(w)
    assert rec == Waited(1, w, WaitOutcome.ABANDONED)
    assert m.forget(w) is None
    journal.append(rec)
    r = RunMachine(journal, 3)
    assert r.begin_wait("go", 0)[1] == Arm.ARMED
    assert r.forget(w) is None


def test_children_deliver_and_detached_ones_do_not_wait() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    c, arm = m.begin_child("ship", "ship-1", 0, 0, b"in")
    journal.append(_some(arm.record))
    d, darm = m.begin_child("audit", "audit-1", DETACHED, 0, b"")
    assert darm.record is not None
    assert m.pending_len() == 1
    m.complete(c, ChildCompleted(Status.FAILED, b"boom"))
    assert drain(m, journal) == [(c, Outcome(Status.FAILED, b"boom"))]
    assert not m.complete(d, ChildCompleted(Status.OK, b""))


def test_a_completion_before_replay_reaches_the_operation_is_held() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok("A"))
    drain(m, journal)
    _, arm = m.begin_sleep("nap", 10)
    journal.append(_some(arm.record))
    r = RunMachine(journal, 3)
    # The timer fires while the code has not started the sleep yet.
    assert not r.complete(1, TimerFired())
    r.begin_step("a")
    assert r.begin_sleep("nap", 10)[1] == Arm.ARMED
    got = drain(r, [])
    assert [g[0] for g in got] == [0, 1]


def test_cancel_is_not_queued_twice() -> None:
    m = RunMachine.fresh(start(), 1)
    m.begin_step("a")
    m.request_cancel(b"one")
    m.request_cancel_by(b"two", b"cli")
    n = m.next()
    assert isinstance(n, CancelAll)
    assert n.reason == b"one"
    assert n.record == Cancel(1, b"one", None)
    assert m.next() == Idle()


def test_suspension_needs_every_pending_operation_to_wait_outside() -> None:
    m = RunMachine.fresh(start(), 1)
    assert not m.is_suspended()
    m.begin_sleep("nap", 10)
    assert m.is_suspended()
    m.begin_step("a")
    assert not m.is_suspended()


def test_offered_updates_can_be_taken_back() -> None:
    m = RunMachine.fresh(start(), 1)
    m.begin_step("a")
    m.offer_update(1, "u", "i1", b"")
    m.request_cancel(b"x")
    m.offer_update(2, "u", "i2", b"")
    assert m.take_offered_updates() == [1, 2]
    assert isinstance(m.next(), CancelAll)
    assert m.next() == Idle()


def test_the_key_names_the_run_and_the_position() -> None:
    m = RunMachine.fresh(Start(3, "order-1", "t"), 1)
    assert m.key(4) == "order-1/3/4"


def test_workflow_streams_replay_their_chunks_without_appending() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    assert m.stream_open("tokens", None) == StreamOpen(0, False)
    journal.append(_some(m.stream_append("tokens", None, b"a")))
    journal.append(_some(m.stream_append("tokens", None, b"b")))
    journal.append(_some(m.stream_close("tokens", None)))
    assert journal[-1] == StreamEnd(1, stream.WORKFLOW, "tokens", 2, Status.OK)
    r = RunMachine(journal, 4)
    assert r.stream_open("tokens", None) == StreamOpen(0, True)
    assert r.stream_append("tokens", None, b"a") is None
    assert r.stream_append("tokens", None, b"b") is None
    assert r.stream_close("tokens", None) is None
    assert r.stream_len("tokens") == 2


def test_a_step_stream_ends_with_the_step_and_continues_after_a_retry() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("gen")
    assert m.stream_open("out", s) == StreamOpen(0, False)
    chunk = m.stream_append("out", s, b"x")
    assert chunk == Chunk(1, s, 1, "out", 0, b"x")
    journal.append(chunk)
    with pytest.raises(RuntimeError, match="written by the step at journal position 0"):
        m.stream_append("out", None, b"y")
    assert m.owns_streams(s)
    assert m.take_live_step(s) is None
    # A crash: the step runs again and knows its earlier chunk.
    r = RunMachine(journal, 2)
    s2, _ = r.begin_step("gen")
    assert r.stream_open("out", s2) == StreamOpen(1, False)
    assert m.stream_ends(s, Status.OK) == [StreamEnd(1, s, "out", 1, Status.OK)]
    assert not m.owns_streams(s)
    with pytest.raises(RuntimeError, match="stream 'out' is closed"):
        m.stream_append("out", None, b"z")


def test_steps_append_to_a_workflow_stream_the_workflow_completes() -> None:
    m = RunMachine.fresh(start(), 1)
    assert m.stream_open("events", None) == StreamOpen(0, False)
    first = _some(m.stream_append("events", None, b"w"))
    s, _ = m.begin_step("model")
    assert m.stream_open("events", s) == StreamOpen(0, False)
    chunk = _some(m.stream_append("events", s, b"x"))
    assert chunk == Chunk(1, s, 1, "events", 1, b"x")
    # The step's writer leaves the workflow's stream open (engine/_streams.py).
    assert m.stream_of_workflow("events")
    assert not m.stream_of_workflow("other")
    assert not m.owns_streams(s)
    assert m.stream_ends(s, Status.OK) == []
    # A crash before the step's result: the step runs again after its chunk.
    r = RunMachine([start(), first, chunk], 2)
    assert r.stream_open("events", None) == StreamOpen(0, False)
    assert r.stream_append("events", None, b"w") is None
    s2, _ = r.begin_step("model")
    assert r.stream_open("events", s2) == StreamOpen(1, False)
    assert m.stream_close("events", None) == StreamEnd(1, stream.WORKFLOW, "events", 2, Status.OK)


def test_a_stream_from_a_step_that_no_longer_runs_is_refused() -> None:
    m = RunMachine.fresh(start(), 1)
    with pytest.raises(RuntimeError, match="no longer running"):
        m.stream_open("out", 5)


def test_a_late_or_unknown_completion_is_ignored() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    assert not m.complete(s, AsyncCompleted(1, Status.OK, b""))
    m.forget(s)
    assert not m.complete(s, ok("x"))
    assert m.next() == Idle()


def test_finish_refuses_while_the_journal_still_delivers() -> None:
    journal: list[Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    m.complete(s, ok("A"))
    drain(m, journal)
    r = RunMachine(journal, 2)
    with pytest.raises(DeterminismError, match="returned but its journal holds 1 more deliveries"):
        r.finish(Status.OK, b"", 5)


# --- property: replay equals live ---------------------------------------------------

_NAMES = ("a", "b", "c")
_Call = tuple[Any, ...]


def _apply(m: RunMachine, call: _Call, open_ops: set[int]) -> tuple[object, list[Record]]:
    """Makes one call of workflow code; returns what the code sees and the records."""
    kind = call[0]
    recs: list[Record] = []
    seen: object
    if kind == "step":
        seq, _ = m.begin_step(str(call[1]))
        open_ops.add(seq)
        seen = seq
    elif kind == "await":
        seq, _ = m.begin_await(str(call[1]))
        open_ops.add(seq)
        seen = seq
    elif kind in ("sleep", "wait", "child"):
        if kind == "sleep":
            seq, arm = m.begin_sleep(str(call[1]), 100)
        elif kind == "wait":
            seq, arm = m.begin_wait(str(call[1]), 0)
        else:
            seq, arm = m.begin_child(str(call[1]), f"c-{call[1]}", int(call[2]), 0, b"in")
        if arm.record is not None:
            recs.append(arm.record)
        if kind != "child" or not int(call[2]) & DETACHED:
            open_ops.add(seq)
        seen = seq
    elif kind == "value":
        rec: Record | None
        seq, v, rec = m.value(int(call[1]), lambda: bytes(call[2]))
        recs += [rec] if rec is not None else []
        seen = (seq, v)
    elif kind == "send":
        seq, rec = m.send("other", str(call[1]), b"s")
        recs += [rec] if rec is not None else []
        seen = seq
    elif kind == "attributes":
        seq, rec = m.set_attributes(b"{}")
        recs += [rec] if rec is not None else []
        seen = seq
    elif kind == "patched":
        on, prec = m.patched(str(call[1]))
        recs += [prec] if prec is not None else []
        seen = on
    elif kind == "forget":
        seq = int(call[1])
        open_ops.discard(seq)
        wrec = m.forget(seq)
        recs += [wrec] if wrec is not None else []
        seen = seq
    else:
        assert kind == "update_done"
        seq, urec = m.update_done(int(call[1]), Status.OK, b"u")
        recs += [urec] if urec is not None else []
        seen = seq
    return seen, recs


def _seen(n: object) -> object:
    """What the code observes of a delivery (records and live tokens aside)."""
    if isinstance(n, Deliver | DeliverLive):
        return ("op", n.seq, n.outcome)
    if isinstance(n, CancelAll):
        return ("cancel", n.seqs, n.reason)
    assert isinstance(n, DeliverUpdate)
    return ("update", n.ordinal, n.name, n.id, n.payload)


@st.composite
def _reaction(draw: st.DrawFn, open_ops: set[int]) -> list[_Call]:
    calls: list[_Call] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(
            st.sampled_from(
                [
                    "step",
                    "step",
                    "await",
                    "sleep",
                    "wait",
                    "child",
                    "value",
                    "send",
                    "attributes",
                    "patched",
                    "forget",
                ]
            )
        )
        name = draw(st.sampled_from(_NAMES))
        if kind == "child":
            calls.append((kind, name, draw(st.sampled_from([0, DETACHED]))))
        elif kind == "value":
            calls.append((kind, draw(st.integers(0, 3)), draw(st.binary(max_size=4))))
        elif kind == "forget":
            if open_ops:
                calls.append((kind, draw(st.sampled_from(sorted(open_ops)))))
        else:
            calls.append((kind, name))
    return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_replay_delivers_what_live_delivered_and_appends_nothing(data: st.DataObject) -> None:
    m = RunMachine.fresh(start(), 1)
    journal: list[Record] = [start()]
    open_ops: set[int] = set()
    signals = 0
    token = 0
    # The code's first turn, then one reaction per delivery.
    first = data.draw(_reaction(open_ops).filter(bool))
    seen_live: list[object] = []
    for call in first:
        s, recs = _apply(m, call, open_ops)
        seen_live.append(s)
        journal += recs
    turns: list[tuple[object, list[_Call]]] = []

    for _ in range(data.draw(st.integers(1, 40))):
        live = sorted(s for s in open_ops if m.is_live_pending(s))
        action = data.draw(
            st.sampled_from(
                ["deliver", "deliver", "complete", "complete", "cancel", "update", "resume"]
            )
        )
        if action == "deliver":
            n = m.next()
            if isinstance(n, Stalled | Idle):
                continue
            if isinstance(n, Deliver | CancelAll) and n.record is not None:
                journal.append(n.record)
            elif isinstance(n, DeliverLive):
                journal.append(n.record.record(m.run(), n.seq, n.outcome))
            if isinstance(n, Deliver | DeliverLive):
                open_ops.discard(n.seq)
            elif isinstance(n, CancelAll):
                open_ops.difference_update(n.seqs)
            reaction = data.draw(_reaction(open_ops))
            if isinstance(n, DeliverUpdate):
                assert n.live is not None
                ordinal, urec = m.accept_update(n.name, n.id, n.payload)
                journal.append(urec)
                reaction = [*reaction, ("update_done", ordinal)]
            turns.append((_seen(n), reaction))
            for call in reaction:
                s, recs = _apply(m, call, open_ops)
                seen_live.append(s)
                journal += recs
        elif action == "complete" and live:
            seq = data.draw(st.sampled_from(live))
            kind = m.pending_kind(seq)
            status = data.draw(st.sampled_from([Status.OK, Status.FAILED]))
            payload = data.draw(st.binary(max_size=3))
            if kind == OpKind.STEP:
                if m.step_paused(seq):
                    continue
                how = data.draw(st.sampled_from(["done", "retry", "pause", "heartbeat"]))
                if how == "done":
                    m.complete(seq, StepCompleted(status, payload))
                elif how == "heartbeat":
                    journal.append(_some(m.heartbeat(seq, payload)))
                else:
                    at = PAUSED if how == "pause" else 50
                    journal.append(_some(m.step_retry(seq, at, b"err")))
            elif kind == OpKind.AWAIT:
                token_out = m.awaiting(seq)
                if token_out is not None:
                    journal.append(token_out)
                else:
                    attempt = m.await_attempt(seq)
                    assert attempt is not None
                    m.complete(seq, AsyncCompleted(attempt, status, payload))
            elif kind == OpKind.SLEEP:
                m.complete(seq, TimerFired())
            elif kind == OpKind.WAIT:
                if data.draw(st.booleans()):
                    journal.append(Signal(1, "sig", signals, payload))
                    m.complete(seq, SignalMatched(signals, payload))
                    signals += 1
                else:
                    m.complete(seq, WaitTimedOut())
            else:
                m.complete(seq, ChildCompleted(status, payload))
        elif action == "cancel":
            m.request_cancel(data.draw(st.binary(max_size=2)))
        elif action == "update":
            token += 1
            m.offer_update(token, "bump", f"u{token}", b"p")
        elif action == "resume":
            journal.extend(m.resume(None))

    # Replay: the same calls at the same turns see the same things, the same
    # deliveries come in the same order, and nothing is appended.
    r = RunMachine(journal, len(journal))
    replay_ops: set[int] = set()
    seen_replay: list[object] = []
    appended: list[Record] = []
    for call in first:
        s, recs = _apply(r, call, replay_ops)
        seen_replay.append(s)
        appended += recs
    for seen, reaction in turns:
        n = r.next()
        assert not isinstance(n, Stalled | Idle), f"replay stalled before {seen}"
        assert _seen(n) == seen
        assert getattr(n, "record", None) is None
        assert getattr(n, "live", None) is None
        for call in reaction:
            s, recs = _apply(r, call, replay_ops)
            seen_replay.append(s)
            appended += recs
    assert seen_replay == seen_live
    assert appended == []
    assert not r.is_replaying()
