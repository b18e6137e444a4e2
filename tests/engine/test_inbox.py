"""The engine serves its store's inbox: commands are applied once and answered, on every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fusee
from fusee import _codec
from fusee.remote import decode_error, decode_payload, encode_error, encode_payload
from fusee.store import Answer, Command
from fusee.testing import TestEngine

from .conftest import HeldWrites, Host, Stores, assert_steps_ran_once

go = fusee.signal("go", bool)
count = fusee.query("count")
bump = fusee.update("bump", int)


@fusee.workflow("gate")
async def gate(ctx: fusee.Ctx, n: int) -> int:
    seen = {"signals": 0}

    async def bumped(by: int) -> int:
        result: int = await ctx.step("bump", lambda: by + 1)
        return result

    ctx.on_query(count, lambda _: seen["signals"])
    ctx.on_update(bump, bumped)
    while True:
        ok = await ctx.wait_for(go)
        seen["signals"] += 1
        if ok:
            break
    return await ctx.step("finish", lambda: n * 2)


async def answered(t: TestEngine, id: str) -> Answer:
    """The engine's answer to command ``id``, once it is there."""
    done = asyncio.Event()
    t.engine.inbox.on_answer = lambda c, ok, fields: done.set() if c.id == id else None
    answer = await t.store.get_answer(id)
    if answer is None:
        # The hook was set before looking: an answer written after the look sets it.
        await done.wait()
        answer = await t.store.get_answer(id)
    assert answer is not None
    return answer


async def apply(t: TestEngine, command: Command) -> Answer:
    """Posts ``command`` to the engine's store and waits for the engine's answer."""
    await t.store.post_command(command)
    return await answered(t, command.id)


def start(id: str, n: int, policy: str = "reject", workflow: str = "gate") -> Command:
    payload = {"workflow": workflow, "input": _codec.encode(n), "id_policy": policy}
    return Command.new("start", id, encode_payload(payload))


def signal(id: str, value: Any, dedup: str | None = None, name: str = "go") -> Command:
    payload = {"name": name, "payload": _codec.encode(value)}
    return Command.new("signal", id, encode_payload(payload), dedup=dedup)


def value_of(answer: Answer) -> Any:
    assert answer.ok, decode_error(decode_payload(answer.payload)["error"])
    return _codec.decode(decode_payload(answer.payload)["value"])


def error_of(answer: Answer) -> BaseException:
    assert not answer.ok
    return decode_error(decode_payload(answer.payload)["error"])


async def test_a_start_and_signals_posted_to_the_inbox_run_the_workflow(host: Host) -> None:
    async with host(workflows=[gate]) as t:
        assert (await apply(t, start("g-1", 21))).ok
        assert (await apply(t, signal("g-1", False, dedup="d-1"))).ok
        assert (await apply(t, signal("g-1", False, dedup="d-1"))).ok  # a duplicate: ignored
        query = Command.new("query", "g-1", encode_payload({"name": "count"}))
        assert value_of(await apply(t, query)) == 1
        update = Command.new(
            "update", "g-1", encode_payload({"name": "bump", "payload": _codec.encode(4)})
        )
        assert value_of(await apply(t, update)) == 5
        assert (await apply(t, signal("g-1", True))).ok
        assert await t.get("g-1").result() == 42
        await t.crash()
        assert await t.get("g-1").result() == 42
        assert_steps_ran_once(t)


@pytest.mark.parametrize(
    ("command", "error"),
    [
        pytest.param(
            start("g-1", 1, workflow="nope"), fusee.UnknownWorkflow, id="unknown-workflow"
        ),
        pytest.param(start("g-1", 1), fusee.AlreadyExists, id="taken-id"),
        pytest.param(signal("nobody", True), fusee.NotFound, id="no-run"),
        pytest.param(
            Command.new(
                "start", "g-2", encode_payload({"workflow": "gate", "input": _codec.encode("x")})
            ),
            fusee.PayloadError,
            id="bad-input",
        ),
        pytest.param(
            Command.new(
                "complete", "", encode_payload({"token": "junk", "value": _codec.encode(1)})
            ),
            ValueError,
            id="bad-token",
        ),
    ],
)
async def test_a_command_that_fails_is_answered_with_its_error_type(
    host: Host, command: Command, error: type[BaseException]
) -> None:
    async with host(workflows=[gate]) as t:
        await t.start(gate, "g-1", 1)
        raised = error_of(await apply(t, command))
        assert type(raised) is error
        assert str(raised)


async def test_a_cancel_and_a_signal_to_a_finished_run_are_answered(host: Host) -> None:
    async with host(workflows=[gate]) as t:
        await t.start(gate, "g-1", 1)
        cancel = Command.new("cancel", "g-1", encode_payload({"reason": "no stock"}))
        assert (await apply(t, cancel)).ok
        with pytest.raises(fusee.Cancelled, match="no stock"):
            await t.get("g-1").result()
        raised = error_of(await apply(t, signal("g-1", True)))
        assert isinstance(raised, fusee.FuseeError)
        assert "has finished" in str(raised)


async def test_a_signal_retried_with_its_dedup_id_after_the_run_ended_is_answered_as_applied(
    host: Host,
) -> None:
    async with host(workflows=[gate]) as t:
        run = await t.start(gate, "g-1", 2)
        assert (await apply(t, signal("g-1", True, dedup="pay-1"))).ok
        assert await run.result() == 4
        assert (await apply(t, signal("g-1", True, dedup="pay-1"))).ok
        raised = error_of(await apply(t, signal("g-1", True, dedup="pay-2")))
        assert "has finished" in str(raised)


async def test_a_command_posted_while_no_engine_runs_is_applied_when_one_starts(
    stores: Stores, fusee_engine: Any
) -> None:
    store = stores.new()
    await store.open()
    commands = [start("g-1", 5), signal("g-1", True)]
    for command in commands:
        await store.post_command(command)
    await store.close()
    async with fusee_engine(workflows=[gate], store=store) as t:
        assert [(await answered(t, c.id)).ok for c in commands] == [True, True]
        assert await t.get("g-1").result() == 10


async def test_a_command_is_applied_once_across_a_crash_before_its_answer(host: Host) -> None:
    async with host(workflows=[gate]) as t:
        started = start("g-1", 3)
        signalled = signal("g-1", False)
        applied: list[str] = []
        both = asyncio.Event()
        real = t.store.answer_command

        async def lost(id: str, ok: bool, payload: bytes) -> None:
            applied.append(id)  # applied, then the engine dies before the answer is written
            if len(applied) == 2:
                both.set()

        t.store.answer_command = lost  # type: ignore[method-assign]
        await t.store.post_command(started)
        await t.store.post_command(signalled)
        await both.wait()
        t.store.answer_command = real  # type: ignore[method-assign]
        await t.crash()
        assert (await answered(t, started.id)).ok  # its own start, found again: not AlreadyExists
        assert (await answered(t, signalled.id)).ok
        assert (await apply(t, signal("g-1", True))).ok
        assert await t.get("g-1").result() == 6
        query = Command.new("query", "g-1", encode_payload({"name": "count"}))
        assert value_of(await apply(t, query)) == 2  # the signal taken twice counted once
        assert_steps_ran_once(t)


def test_errors_cross_the_wire_with_their_type_and_fields() -> None:
    cases: list[BaseException] = [
        fusee.RunFinished("o-1", "completed", "signal 'go'"),
        fusee.UpdateRejected("bump", "o-1", "ValueError", "too big"),
        fusee.DeterminismError(3, "recorded step 'a'", location="app.py:9"),
        fusee.NotFound("no run 'x'"),
        ValueError("bad token"),
    ]
    for error in cases:
        back = decode_error(encode_error(error))
        assert type(back) is type(error)
        assert str(back) == str(error)
    assert decode_error(encode_error(fusee.RunFinished("o-1", "failed", "x"))).status == "failed"  # type: ignore[attr-defined]
    other = decode_error(encode_error(KeyError("sku")))
    assert type(other) is fusee.FuseeError
    assert str(other) == "KeyError: 'sku'"


@fusee.workflow("ender")
async def ender(ctx: fusee.Ctx) -> bool:
    return bool(await ctx.wait_for(go))


async def test_a_signal_resent_to_a_queued_run_its_first_copy_ended_is_answered_as_applied(
    host: Host,
) -> None:
    # The first copy waited in the queue with the run, which then started,
    # took it and ended, its journal not yet in the store when the copy
    # sent again arrives: answered once that journal is durable.
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[ender], queues=[q]) as t:
        blocker = await t.start(ender, "blocker", queue=q)
        await t.start(ender, "g-2", queue=q)
        await t.settle()
        assert (await apply(t, signal("g-2", True, dedup="s-1"))).ok
        with HeldWrites(t.engine.store) as held:
            unblock = asyncio.ensure_future(blocker.signal(go, True))
            await held.waiting.wait()
            resent = signal("g-2", True, dedup="s-1")
            await t.store.post_command(resent)
            for _ in range(20):
                await asyncio.sleep(0)
            held.release()
            await unblock
            assert (await answered(t, resent.id)).ok
        assert await t.get("g-2").result() is True
