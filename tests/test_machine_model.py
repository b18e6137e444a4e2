"""RunMachine against a small model of the reference's rules (hypothesis stateful).

The model keeps what the rules say the machine must do: every operation the
code starts takes the next sequence number; live completions are delivered
one at a time, in the order they arrived; each delivery's record is
appended before the code sees it, so the journal holds them in delivery
order; after a crash the code runs again against its journal, gets exactly
the recorded deliveries back in the same order while live completions that
arrive meanwhile wait, and appends nothing it appended before.

``FUSEE_MACHINE_CASES`` sets the number of cases (default 300, a few
seconds; a simulator run sets it to 10,000).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fusee.machine import (
    CancelAll,
    ChildCompleted,
    Completion,
    Deliver,
    DeliverLive,
    DeliverUpdate,
    Idle,
    Next,
    Outcome,
    RunMachine,
    SignalMatched,
    Stalled,
    StepCompleted,
    StepStart,
    TimerFired,
    WaitTimedOut,
)
from fusee.record import (
    Cancel,
    Child,
    ChildDone,
    Done,
    Fired,
    Patch,
    Record,
    Signal,
    Start,
    Status,
    Step,
    Timer,
    Value,
    Wait,
    Waited,
    WaitOutcome,
)

CASES = int(os.environ.get("FUSEE_MACHINE_CASES", "300"))
RUN = 1
START = Start(run=RUN, id="model", wtype="t", version=1, started_ms=10, input=b"in")
NAMES = st.sampled_from(["a", "b"])
PAYLOADS = st.binary(max_size=2)
ENDS = st.sampled_from([Status.OK, Status.FAILED])

# What the code saw of a delivery: ("op", seq, outcome) or ("cancel", seqs, reason).
Seen = tuple[object, ...]
# One event of the code's life: a call and what it returned, or a delivery.
Event = tuple[str, object, object]


def seen(n: Next) -> tuple[Seen, Record | None]:
    """What the code sees of a delivery, and the record the host appends first."""
    if isinstance(n, Deliver):
        return ("op", n.seq, n.outcome), n.record
    if isinstance(n, DeliverLive):
        return ("op", n.seq, n.outcome), n.record.record(RUN, n.seq, n.outcome)
    assert isinstance(n, CancelAll), f"unexpected delivery {n!r}"
    return ("cancel", n.seqs, n.reason), n.record


@dataclass
class Op:
    """An operation the code started and the model holds pending."""

    kind: str
    name: str


@dataclass
class Queued:
    """A delivery waiting for its turn: an operation's result, or a cancellation."""

    seq: int | None
    outcome: Outcome
    record: Record
    cancel: bytes | None = None


@dataclass
class Model:
    """The reference's rules, as state."""

    next_seq: int = 0
    pending: dict[int, Op] = field(default_factory=dict)
    queue: list[Queued] = field(default_factory=list)
    queued: set[int] = field(default_factory=set)
    cancel_queued: bool = False
    last_cancel_at: int | None = None
    # The highest position the journal mentioned when this life's machine
    # was built, and the patch markers it knows: `patched` decides on them.
    loaded_max: int = -1
    patches: set[tuple[int, str]] = field(default_factory=set)
    done: bool = False


class MachineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.journal: list[Record] = [START]
        self.m = RunMachine.fresh(START, 1)
        self.model = Model()
        self.code: list[Event] = []
        self.delivered: list[object] = []

    # -- the host ------------------------------------------------------------

    def append(self, record: Record) -> None:
        self.journal.append(record)
        self.m.gate = len(self.journal)

    def live(self) -> bool:
        return not self.model.done

    # -- the code starts operations ---------------------------------------------

    def began(self, kind: str, name: str, seq: int) -> None:
        assert seq == self.model.next_seq, "a sequence number is the order of the calls"
        self.model.next_seq += 1
        if kind != "value":
            self.model.pending[seq] = Op(kind, name)

    @precondition(live)
    @rule(name=NAMES)
    def step(self, name: str) -> None:
        seq, start = self.m.begin_step(name)
        assert start == StepStart.run(1, 0)
        assert self.m.gate == len(self.journal), "a step waits for every record before it"
        self.began("step", name, seq)
        self.code.append(("call", ("step", name), seq))

    @precondition(live)
    @rule(name=NAMES)
    def sleep(self, name: str) -> None:
        seq, arm = self.m.begin_sleep(name, 100)
        assert arm.record == Timer(RUN, seq, name, 100)
        self.append(arm.record)
        self.began("sleep", name, seq)
        self.code.append(("call", ("sleep", name), seq))

    @precondition(live)
    @rule(name=NAMES)
    def wait(self, name: str) -> None:
        seq, arm = self.m.begin_wait(name, 0)
        assert arm.record == Wait(RUN, seq, name, 0)
        self.append(arm.record)
        self.began("wait", name, seq)
        self.code.append(("call", ("wait", name), seq))

    @precondition(live)
    @rule(name=NAMES)
    def child(self, name: str) -> None:
        seq, arm = self.m.begin_child(name, f"c-{name}", 0, 0, b"in")
        assert arm.record == Child(RUN, seq, name, f"c-{name}", 0, 0, b"in")
        self.append(arm.record)
        self.began("child", name, seq)
        self.code.append(("call", ("child", name), seq))

    @precondition(live)
    @rule(kind=st.integers(0, 3), value=PAYLOADS)
    def value(self, kind: int, value: bytes) -> None:
        seq, got, rec = self.m.value(kind, lambda: value)
        assert got == value
        assert rec == Value(RUN, seq, kind, value)
        self.append(rec)
        self.began("value", "", seq)
        self.code.append(("call", ("value", kind, value), (seq, got)))

    @precondition(live)
    @rule(id=NAMES)
    def patched(self, id: str) -> None:
        at = self.model.next_seq
        on, rec = self.m.patched(id)
        if (at, id) in self.model.patches:
            assert (on, rec) == (True, None)
        else:
            # Live code is past its journal: the new branch, remembered.
            assert self.model.loaded_max < at
            assert on
            assert rec == Patch(RUN, at, id)
            self.model.patches.add((at, id))
            self.append(rec)
        self.code.append(("call", ("patched", id), on))

    @precondition(lambda self: self.live() and self.model.pending)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.model.pending)))
        op = self.model.pending.pop(seq)
        self.model.queued.discard(seq)
        rec = self.m.forget(seq)
        if op.kind == "wait":
            assert rec == Waited(RUN, seq, WaitOutcome.ABANDONED)
            self.append(rec)
        else:
            assert rec is None
        self.code.append(("call", ("forget", seq), seq))

    # -- completions, cancellation, deliveries ------------------------------------

    def completion(self, seq: int, data: st.DataObject) -> tuple[Completion, Queued]:
        """A live completion for pending ``seq``, and the delivery it must become."""
        op = self.model.pending[seq]
        if op.kind == "step":
            status, payload = data.draw(ENDS), data.draw(PAYLOADS)
            rec: Record = Step(RUN, seq, op.name, 1, status, payload, None)
            return StepCompleted(status, payload), Queued(seq, Outcome(status, payload), rec)
        if op.kind == "sleep":
            return TimerFired(), Queued(seq, Outcome.empty(Status.OK), Fired(RUN, seq))
        if op.kind == "wait":
            if data.draw(st.booleans()):
                return WaitTimedOut(), Queued(
                    seq,
                    Outcome.empty(Status.TIMED_OUT),
                    Waited(RUN, seq, WaitOutcome.TIMED_OUT),
                )
            # The shard records the signal, then offers it to the wait.
            ordinal = sum(isinstance(r, Signal) for r in self.journal)
            payload = data.draw(PAYLOADS)
            self.append(Signal(RUN, op.name, ordinal, payload))
            return SignalMatched(ordinal, payload), Queued(
                seq, Outcome.ok(payload), Waited(RUN, seq, WaitOutcome.signal(ordinal))
            )
        assert op.kind == "child"
        status, payload = data.draw(ENDS), data.draw(PAYLOADS)
        return ChildCompleted(status, payload), Queued(
            seq, Outcome(status, payload), ChildDone(RUN, seq, status, payload)
        )

    def waiting(self) -> list[int]:
        return sorted(set(self.model.pending) - self.model.queued)

    @precondition(lambda self: self.live() and self.waiting())
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.waiting()))
        c, queued = self.completion(seq, data)
        assert self.m.complete(seq, c), "a completion of a pending operation is taken"
        self.model.queue.append(queued)
        self.model.queued.add(seq)

    @precondition(lambda self: self.live() and self.model.next_seq > 0)
    @rule(data=st.data())
    def complete_late(self, data: st.DataObject) -> None:
        waiting = self.waiting()
        others = [s for s in range(self.model.next_seq) if s not in waiting]
        if not others:
            return
        seq = data.draw(st.sampled_from(others))
        assert not self.m.complete(seq, TimerFired()), "a second or late completion is ignored"

    @precondition(live)
    @rule(reason=PAYLOADS)
    def cancel(self, reason: bytes) -> None:
        self.m.request_cancel(reason)
        model = self.model
        if model.cancel_queued:
            return  # the queued cancellation covers this one
        if not model.pending and model.last_cancel_at == model.next_seq:
            return  # nothing new to cancel at this position
        model.cancel_queued = True
        model.queue.append(
            Queued(None, Outcome.empty(Status.CANCELLED), Cancel(RUN, reason), cancel=reason)
        )

    def expected_next(self) -> tuple[Seen, Record] | None:
        model = self.model
        while model.queue:
            q = model.queue.pop(0)
            if q.cancel is not None:
                model.cancel_queued = False
                model.last_cancel_at = model.next_seq
                seqs = tuple(sorted(model.pending))
                model.pending.clear()
                model.queued.clear()
                return ("cancel", seqs, q.cancel), q.record
            assert q.seq is not None
            if q.seq not in model.pending:
                continue  # dropped or cancelled meanwhile: never delivered
            del model.pending[q.seq]
            model.queued.discard(q.seq)
            return ("op", q.seq, q.outcome), q.record
        return None

    @precondition(live)
    @rule()
    def deliver(self) -> None:
        n = self.m.next()
        expected = self.expected_next()
        if expected is None:
            assert isinstance(n, Idle), f"{n!r} delivered with nothing queued"
            return
        got, rec = seen(n)
        assert (got, rec) == expected, "one delivery at a time, in completion order"
        assert rec is not None
        self.append(rec)
        self.delivered.append(got[:2] if got[0] == "op" else ("cancel",))
        self.code.append(("delivery", got, None))

    @precondition(lambda self: self.live() and not self.model.pending and not self.model.queue)
    @rule()
    def finish(self) -> None:
        self.append(self.m.finish(Status.OK, b"end", 20))
        self.model.done = True

    # -- crashes --------------------------------------------------------------

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Everything but the journal is lost; the code runs again from its start."""
        r = RunMachine(self.journal, len(self.journal))
        assert r.gate == len(self.journal)
        self.m = r
        recorded = {rec.seq for rec in self.journal if isinstance(rec, Step)}
        loaded_max = max(
            (getattr(rec, "seq", -1) for rec in self.journal if not isinstance(rec, Signal)),
            default=-1,
        )
        patches = {(rec.at, rec.id) for rec in self.journal if isinstance(rec, Patch)}
        done = self.model.done
        # Operations without a recorded result run again; their completions
        # may arrive at any point of the replay, before or after the code
        # starts them again.
        unrecorded = sorted(self.model.pending)
        arrived: list[tuple[int, Queued]] = []
        early: dict[int, Queued] = {}
        for t, (what, call, result) in enumerate(self.code):
            taken_seqs = {q.seq for _, q in arrived} | set(early)
            waiting = [s for s in unrecorded if s not in taken_seqs]
            arrives: bool = bool(waiting) and data.draw(st.booleans())
            if arrives:
                seq = data.draw(st.sampled_from(waiting))
                c, queued = self.completion(seq, data)
                taken = r.complete(seq, c)
                if seq < r.next_seq():
                    assert taken
                    arrived.append((t, queued))
                else:
                    assert not taken, "held until the code starts the operation again"
                    early[seq] = queued
            if what == "delivery":
                n = r.next()
                assert not isinstance(n, Stalled | Idle | DeliverUpdate), f"replay stopped at {t}"
                got, rec = seen(n)
                assert got == call, "replay hands back the recorded deliveries in order"
                assert rec is None, "replay appends nothing"
                continue
            assert isinstance(call, tuple)
            assert self.replay_call(r, call, recorded) == result, (
                "replayed calls see what live ones saw"
            )
            if call[0] in ("step", "sleep", "wait", "child") and result in early:
                assert isinstance(result, int)
                arrived.append((t, early.pop(result)))
            if done or loaded_max >= r.next_seq():
                # New code asking for a patch where the journal has passed.
                assert r.patched("probe") == (False, None)
        assert not early
        assert not r.is_replaying()
        if done:
            r.check_end()
            assert r.patched("probe") == (False, None)
        self.model.queue = [q for _, q in arrived]
        self.model.queued = {q.seq for q in self.model.queue if q.seq is not None}
        self.model.cancel_queued = False
        self.model.loaded_max = loaded_max
        self.model.patches = patches

    def replay_call(self, r: RunMachine, call: tuple[object, ...], recorded: set[int]) -> object:
        """Makes a call of the code again; it must append nothing.

        ``recorded``: the steps whose results the journal holds (they do not run again).
        """
        kind = call[0]
        if kind == "step":
            seq, start = r.begin_step(str(call[1]))
            assert start.is_replay == (seq in recorded)
            return seq
        if kind in ("sleep", "wait", "child"):
            name = str(call[1])
            if kind == "sleep":
                seq, arm = r.begin_sleep(name, 100)
            elif kind == "wait":
                seq, arm = r.begin_wait(name, 0)
            else:
                seq, arm = r.begin_child(name, f"c-{name}", 0, 0, b"in")
            assert arm.record is None
            return seq
        if kind == "value":
            seq, got, rec = r.value(int(str(call[1])), lambda: b"other")
            assert rec is None
            return (seq, got)
        if kind == "patched":
            on, prec = r.patched(str(call[1]))
            assert prec is None
            return on
        assert kind == "forget"
        seq = int(str(call[1]))
        assert r.forget(seq) is None
        return seq

    # -- invariants -----------------------------------------------------------

    @invariant()
    def nothing_is_recorded_twice(self) -> None:
        keys = [
            (type(rec).__name__, rec.seq)
            for rec in self.journal
            if isinstance(rec, Step | Fired | Waited | ChildDone | Timer | Wait | Child | Value)
        ]
        results = [
            rec.seq for rec in self.journal if isinstance(rec, Step | Fired | Waited | ChildDone)
        ]
        patches = [(rec.at, rec.id) for rec in self.journal if isinstance(rec, Patch)]
        assert len(keys) == len(set(keys))
        assert len(results) == len(set(results)), "one result per operation"
        assert len(patches) == len(set(patches))
        assert sum(isinstance(rec, Done) for rec in self.journal) <= 1

    @invariant()
    def the_journal_records_deliveries_in_delivery_order(self) -> None:
        recorded = [
            ("cancel",) if isinstance(rec, Cancel) else ("op", rec.seq)
            for rec in self.journal
            if isinstance(rec, Step | Fired | ChildDone | Cancel)
            or (isinstance(rec, Waited) and not rec.outcome.is_abandoned)
        ]
        assert recorded == self.delivered

    @invariant()
    def the_gate_is_never_above_the_last_record(self) -> None:
        assert self.m.gate <= len(self.journal)


MachineModel.TestCase.settings = settings(
    max_examples=CASES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# About 20 ms a case on a loaded 2-core machine: the suite's 120 s per test
# is not enough for 10,000.
test_the_machine_follows_the_reference_rules = pytest.mark.timeout(max(120, CASES // 10))(
    MachineModel.TestCase
)
