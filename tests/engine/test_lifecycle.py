"""Run lifecycle: deadlines and delayed starts, live and after a crash, on every store."""

from __future__ import annotations

import datetime

import pytest

import fusee
from fusee.record import Start, decode
from fusee.testing import crash_everywhere

from .conftest import Host, Stores, assert_steps_ran_once, client_of

pytestmark = pytest.mark.asyncio

paid = fusee.signal("paid", int)

LIFE = [pytest.param(False, id="live"), pytest.param(True, id="crashed")]


@fusee.workflow("hold-seat")
async def hold_seat(ctx: fusee.Ctx, seat: str) -> str:
    await ctx.step("reserve", lambda: f"held {seat}")
    try:
        await ctx.wait_for(paid)
    except fusee.Cancelled:
        # Compensation runs when the deadline cancels the run, as for any cancel.
        await ctx.step("release", lambda: f"released {seat}")
        raise
    return await ctx.step("book", lambda: f"booked {seat}")


@fusee.workflow("box-office")
async def box_office(ctx: fusee.Ctx, seat: str) -> str:
    try:
        return await ctx.child(hold_seat, f"hold-{seat}", seat, timeout="10m")
    except fusee.Cancelled as e:
        return f"gave up: {e}"


# --- deadlines -------------------------------------------------------------------------------


@pytest.mark.parametrize("crash", LIFE)
async def test_a_run_past_its_deadline_is_cancelled_and_its_compensation_runs(
    host: Host, crash: bool
) -> None:
    async with host(workflows=[hold_seat], park_after="1s") as t:
        run = await t.start(hold_seat, "seat-1", "A1", timeout="1h")
        await t.advance("30m")
        assert (await run.describe()).status == "suspended"
        if crash:
            # Parked, then lost with its process: the next one still cancels it.
            await t.crash()
        await t.advance("31m")
        with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
            await run.result()
        assert (await run.describe()).status == "cancelled"
        # Reserve, then release: book never ran.
        assert len(t.step_log) == 2
        await t.crash()
        with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
            await run.result()
        assert_steps_ran_once(t)


async def test_a_run_that_ends_before_its_deadline_is_left_alone(host: Host) -> None:
    async with host(workflows=[hold_seat]) as t:
        run = await t.start(hold_seat, "seat-2", "B2", timeout="1h")
        await t.advance("10m")
        await run.signal(paid, 30)
        assert await run.result() == "booked B2"
        await t.crash()
        await t.advance("2h")
        assert await run.result() == "booked B2"
        assert (await run.describe()).status == "completed"


@pytest.mark.parametrize("crash", LIFE)
async def test_a_childs_timeout_cancels_the_child_and_fails_its_future(
    host: Host, crash: bool
) -> None:
    async with host(workflows=[box_office, hold_seat]) as t:
        run = await t.start(box_office, "office-1", "C3")
        await t.advance("5m")
        if crash:
            await t.crash()
        assert await run.result() == "gave up: deadline exceeded"
        with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
            await t.get("hold-C3").result()
        # The child reserved, then released.
        assert len(t.step_log) == 2
        assert_steps_ran_once(t)


async def test_a_childs_deadline_is_never_past_its_parents(host: Host) -> None:
    async with host(workflows=[box_office, hold_seat]) as t:
        started_ms = t.clock.now_ms()
        run = await t.start(box_office, "office-2", "D4", timeout="3m")
        await t.settle()
        # The child asked for 10 minutes; its parent has 3.
        (first, *_) = await t.engine.store.load("hold-D4")
        start = decode(first[1])
        assert isinstance(start, Start)
        assert start.deadline_ms == started_ms + 180_000
        await t.advance("4m")
        with pytest.raises(fusee.Cancelled):
            await t.get("hold-D4").result()
        assert await run.result() == "gave up: deadline exceeded"


async def test_a_timeout_that_is_not_a_positive_duration_is_refused(host: Host) -> None:
    async with host(workflows=[hold_seat]) as t:
        for bad in ("0s", -5, "soon"):
            with pytest.raises(ValueError, match="duration"):
                await t.start(hold_seat, "seat-bad", "Z9", timeout=bad)
        with pytest.raises(fusee.NotFound):
            await t.get("seat-bad").describe()


# --- delayed starts --------------------------------------------------------------------------


@fusee.workflow("reminder")
async def reminder(ctx: fusee.Ctx, text: str) -> str:
    return await ctx.step("send", lambda: f"sent {text}")


@pytest.mark.parametrize("crash", LIFE)
async def test_a_delayed_run_is_queued_until_its_time(host: Host, crash: bool) -> None:
    async with host(workflows=[reminder]) as t:
        now = datetime.datetime.fromtimestamp(t.clock.now_ms() / 1000, datetime.UTC)
        run = await t.start(reminder, "remind-1", "pay rent", delay="10m")
        info = await run.describe()
        assert info.status == "queued"
        assert info.wake_at == now + datetime.timedelta(minutes=10)
        await t.advance("9m")
        assert (await run.describe()).status == "queued"
        assert t.step_log == []
        if crash:
            await t.crash()
        await t.advance("1m")
        assert await run.result() == "sent pay rent"
        assert (await run.describe()).wake_at is None
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", LIFE)
async def test_a_run_started_at_a_time_can_be_started_early(host: Host, crash: bool) -> None:
    async with host(workflows=[reminder]) as t:
        at = datetime.datetime.fromtimestamp(t.clock.now_ms() / 1000 + 86_400, datetime.UTC)
        run = await t.start(reminder, "remind-2", "call mum", start_at=at)
        assert (await run.describe()).wake_at == at
        if crash:
            await t.crash()
        await run.start_now()
        assert await run.result() == "sent call mum"
        # A second call, once it started, changes nothing.
        await run.start_now()
        assert_steps_ran_once(t)


async def test_a_delayed_run_can_be_cancelled_before_it_starts(host: Host) -> None:
    async with host(workflows=[reminder]) as t:
        run = await t.start(reminder, "remind-3", "never", delay="1h")
        await run.cancel("not needed")
        with pytest.raises(fusee.Cancelled, match="not needed"):
            await run.result()
        await t.crash()
        await t.advance("2h")
        assert (await run.describe()).status == "cancelled"
        assert t.step_log == []


async def test_a_delay_with_a_deadline_counts_the_deadline_from_the_start_call(
    host: Host,
) -> None:
    async with host(workflows=[hold_seat]) as t:
        run = await t.start(hold_seat, "seat-late", "E5", delay="30m", timeout="1h")
        await t.advance("45m")
        assert (await run.describe()).status in ("running", "suspended")
        await t.advance("20m")
        with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
            await run.result()


@fusee.workflow("follow-up")
async def follow_up(ctx: fusee.Ctx, text: str) -> str:
    first = await ctx.step("first", lambda: f"first {text}")
    later = await ctx.child(reminder, f"{ctx.info.id}-later", text, delay="1h")
    return f"{first}, then {later}"


@pytest.mark.parametrize("crash", LIFE)
async def test_a_delayed_child_is_queued_until_its_time(host: Host, crash: bool) -> None:
    async with host(workflows=[follow_up, reminder]) as t:
        run = await t.start(follow_up, "fu-1", "hello")
        await t.advance("30m")
        child = await t.get("fu-1-later").describe()
        assert child.status == "queued"
        assert child.wake_at is not None
        if crash:
            await t.crash()
        await t.advance("29m")
        assert (await t.get("fu-1-later").describe()).status == "queued"
        await t.advance("1m")
        assert await run.result() == "first hello, then sent hello"
        assert_steps_ran_once(t)


nudge = fusee.signal("nudge", int)
seen_q = fusee.query("seen")


@fusee.workflow("mailbox")
async def mailbox(ctx: fusee.Ctx) -> list[int]:
    got: list[int] = []
    ctx.on_query(seen_q, lambda _: list(got))
    while (n := await ctx.wait_for(nudge, timeout="3h")) is not None:
        got.append(n)
    return got


@fusee.workflow("nudger")
async def nudger(ctx: fusee.Ctx, target: str) -> str:
    ctx.send(target, nudge, 1, delay="1h")
    ctx.send(target, nudge, 2)  # goes at once: a delayed send holds back no other
    return "sent"


@pytest.mark.parametrize("crash", LIFE)
async def test_a_delayed_send_goes_once_after_its_delay(host: Host, crash: bool) -> None:
    async with host(workflows=[mailbox, nudger]) as t:
        box = await t.start(mailbox, "box-1")
        sender = await t.start(nudger, "nudger-1", "box-1")
        assert await sender.result() == "sent"
        await t.advance("30m")
        if crash:
            await t.crash()
        await t.advance("29m")
        assert await box.query(seen_q) == [2]
        await t.advance("1m")
        assert await box.query(seen_q) == [2, 1]
        await t.advance("4h")
        assert await box.result() == [2, 1]


async def test_start_now_of_an_unknown_run_raises_not_found(host: Host) -> None:
    async with host(workflows=[reminder]) as t:
        with pytest.raises(fusee.NotFound):
            await t.get("nobody").start_now()


async def test_a_start_with_both_delay_and_start_at_is_refused(host: Host) -> None:
    async with host(workflows=[reminder]) as t:
        at = datetime.datetime.now(datetime.UTC)
        with pytest.raises(ValueError, match="not both"):
            await t.start(reminder, "remind-4", "x", delay="1m", start_at=at)


# --- dynamic handlers ------------------------------------------------------------------------

rename = fusee.update("rename", str)
tag = fusee.update("tag")
anything = fusee.query("anything")
close = fusee.signal("close", bool)


@fusee.workflow("ledger")
async def ledger(ctx: fusee.Ctx) -> list[str]:
    notes: list[str] = []

    def named(title: str) -> str:
        info = ctx.current_update()
        assert info is not None
        notes.append(f"{info.name}:{title}")
        return f"renamed to {title}"

    async def any_update(name: str, payload: object) -> str:
        info = ctx.current_update()
        assert info is not None
        assert info.name == name
        recorded = await ctx.step("note", lambda: f"{name}={payload}")
        notes.append(f"{recorded} [{info.id}]")
        return recorded

    def refuse_blank(name: str, payload: object) -> None:
        if payload is None:
            raise ValueError(f"update {name!r} needs a payload")

    ctx.on_update(rename, named)
    ctx.on_update(None, any_update, refuse_blank)
    ctx.on_query(None, lambda name, arg: {"asked": name, "arg": arg, "notes": list(notes)})
    assert ctx.current_update() is None
    await ctx.wait_for(close)
    return notes


@pytest.mark.parametrize("crash", LIFE)
async def test_dynamic_handlers_take_every_name_no_other_handler_names(
    host: Host, crash: bool
) -> None:
    async with host(workflows=[ledger]) as t:
        run = await t.start(ledger, "book-1")
        assert await run.update(rename, "Q3") == "renamed to Q3"
        assert await run.update(tag, "urgent", id="u-tag") == "tag=urgent"
        with pytest.raises(fusee.UpdateRejected, match="needs a payload"):
            await run.update(tag, None)
        if crash:
            await t.crash()
        answer = await run.query(anything, 7)
        assert answer == {
            "asked": "anything",
            "arg": 7,
            "notes": ["rename:Q3", "tag=urgent [u-tag]"],
        }
        # A repeat of an update id returns what the first returned.
        assert await run.update(tag, "urgent", id="u-tag") == "tag=urgent"
        await run.signal(close, True)
        assert await run.result() == ["rename:Q3", "tag=urgent [u-tag]"]
        assert_steps_ran_once(t)


# --- cancelling another run from workflow code -----------------------------------------------


@fusee.workflow("usher")
async def usher(ctx: fusee.Ctx, seat: str) -> str:
    await ctx.step("decide", lambda: "let go")
    ctx.cancel(f"seat-{seat}", reason="customer left")
    return await ctx.step("after", lambda: "ushered")


@fusee.workflow("supervisor")
async def supervisor(ctx: fusee.Ctx, seat: str) -> str:
    kid = ctx.child(hold_seat, f"hold-{seat}", seat)
    await ctx.sleep("let-it-reserve", "1m")
    ctx.cancel(f"hold-{seat}")
    try:
        return await kid
    except fusee.Cancelled as e:
        return f"child cancelled: {e}"


async def test_ctx_cancel_cancels_another_run_and_its_compensation_runs_once(
    host: Host,
) -> None:
    async with host(workflows=[usher, hold_seat]) as t:
        seat = await t.start(hold_seat, "seat-F6", "F6")
        await t.settle()
        run = await t.start(usher, "usher-1", "F6")
        assert await run.result() == "ushered"
        with pytest.raises(fusee.Cancelled, match="customer left"):
            await seat.result()
        await t.crash()
        await t.settle()
        with pytest.raises(fusee.Cancelled, match="customer left"):
            await seat.result()
        assert_steps_ran_once(t)


async def test_ctx_cancel_is_delivered_exactly_once_whatever_the_crash() -> None:
    result = await crash_everywhere(supervisor, "G7", workflows=[hold_seat])
    assert result == "child cancelled: cancelled by run 'crash-everywhere'"


async def test_ctx_cancel_of_a_run_that_ended_leaves_it_alone(host: Host) -> None:
    async with host(workflows=[usher, reminder]) as t:
        done = await t.start(reminder, "seat-H8", "done already")
        assert await done.result() == "sent done already"
        run = await t.start(usher, "usher-2", "H8")
        assert await run.result() == "ushered"
        assert await done.result() == "sent done already"


@fusee.workflow("self-canceller")
async def self_canceller(ctx: fusee.Ctx) -> str:
    try:
        ctx.cancel(ctx.info.id)
    except ValueError as e:
        return str(e)
    return "cancelled itself"


async def test_ctx_cancel_refuses_the_runs_own_id(host: Host) -> None:
    async with host(workflows=[self_canceller]) as t:
        assert "cannot cancel its own run" in await t.execute(self_canceller, "me")


# --- a bug in workflow code pauses its run ---------------------------------------------------

# What is deployed: the test "ships the fix" by flipping it.
DEPLOYED = {"fixed": False}


@fusee.workflow("quote", on_error="pause")
async def quote(ctx: fusee.Ctx, sku: str) -> str:
    price = await ctx.step("price", lambda: 12)
    if not DEPLOYED["fixed"]:
        prices: dict[str, int] = {}
        price = prices[sku]  # the bug: a lookup in the wrong table
    return await ctx.step("confirm", lambda: f"{sku} at {price}")


@fusee.workflow("strict-quote")
async def strict_quote(ctx: fusee.Ctx, sku: str) -> str:
    await ctx.step("price", lambda: 12)
    if sku == "refused":
        raise fusee.Failure("no such product")
    return {"A": "ok"}[sku]


@pytest.mark.parametrize("crash", LIFE)
async def test_a_bug_pauses_the_run_with_its_traceback_and_resume_replays_the_fix(
    host: Host, crash: bool
) -> None:
    DEPLOYED["fixed"] = False
    async with host(workflows=[quote]) as t:
        run = await t.start(quote, "quote-1", "A1")
        with pytest.raises(fusee.RunPaused, match="KeyError: 'A1'"):
            await run.result()
        info = await run.describe()
        assert info.status == "paused"
        assert info.error is not None
        assert "prices[sku]" in info.error
        assert [i.id async for i in t.list(status="paused")] == ["quote-1"]
        if crash:
            # Recovered on the same code, it pauses again at the same place.
            await t.crash()
            with pytest.raises(fusee.RunPaused, match="KeyError"):
                await run.result()
        DEPLOYED["fixed"] = True
        await run.resume()
        assert await run.result() == "A1 at 12"
        assert (await run.describe()).error is None
        await t.crash()
        assert await run.result() == "A1 at 12"
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", LIFE)
async def test_a_bug_paused_runs_traceback_is_read_from_the_store_until_its_resume(
    host: Host, stores: Stores, crash: bool
) -> None:
    DEPLOYED["fixed"] = False
    async with host(workflows=[quote]) as t, client_of(stores, t.store) as client:
        run = await t.start(quote, "quote-2", "B2")
        with pytest.raises(fusee.RunPaused):
            await run.result()
        if crash:
            await t.crash()
        # Another process (a web app's Client) reads the run from its row.
        theirs = client.get("quote-2")
        info = await theirs.describe()
        assert info.status == "paused"
        assert info.error is not None
        assert "prices[sku]" in info.error
        assert info.error.rstrip().endswith("KeyError: 'B2'")
        listed = [i async for i in client.list(status="paused")]
        assert [(i.id, i.error) for i in listed] == [("quote-2", info.error)]
        DEPLOYED["fixed"] = True
        await theirs.resume()
        assert await theirs.result() == "B2 at 12"
        assert (await theirs.describe()).error is None
        assert_steps_ran_once(t)


@pytest.mark.parametrize(
    ("on_error", "sku", "status"),
    [
        pytest.param("fail", "B", "failed", id="default-fails"),
        pytest.param("pause", "B", "paused", id="engine-wide-pause"),
        pytest.param("pause", "refused", "failed", id="failure-still-fails"),
    ],
)
async def test_what_a_bug_does_follows_the_engines_choice_and_a_failure_always_fails(
    host: Host, on_error: str, sku: str, status: str
) -> None:
    async with host(workflows=[strict_quote], on_error=on_error) as t:
        run = await t.start(strict_quote, f"sq-{sku}", sku)
        with pytest.raises((fusee.WorkflowFailed, fusee.RunPaused)):
            await run.result()
        assert (await run.describe()).status == status


async def test_on_error_takes_fail_or_pause_only() -> None:
    with pytest.raises(ValueError, match=r"'fail'.*'pause'"):
        fusee.workflow("w", on_error="retry")
