"""Messages a run took count once across continue-as-new: its dedup ids and update ids carry.

Each behaviour holds live and after a crash, on every store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fusee
from fusee.engine import _carry
from fusee.engine._carry import carried_by, carried_of
from fusee.record import Meta, Signal, Start, Status, decode
from fusee.testing import crash_everywhere

from .conftest import HeldWrites, Host

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
stop = fusee.signal("stop", int)
add = fusee.update("add", int)


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, total: int) -> int:
    """Adds each `go` to its total, continuing as new after each one, until a `stop`.

    `add` updates add to the total too and answer the new total.
    """
    box = [total]

    def on_add(value: int) -> int:
        box[0] += value
        return box[0]

    ctx.on_update(add, on_add)
    index, value = await fusee.select(ctx.wait_for(go), ctx.wait_for(stop))
    if index == 1:
        return box[0]
    box[0] += value or 0
    ctx.continue_as_new(box[0])


async def _runs(t: Any, id: str) -> int:
    return (await t.get(id).describe()).run  # type: ignore[no-any-return]


async def test_a_signal_resent_with_its_dedup_id_after_continue_as_new_counts_once(
    host: Host,
) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1", 0)
        await run.signal(go, 5, dedup="g-1")
        await t.settle()
        assert await _runs(t, "t-1") == 2
        await run.signal(go, 5, dedup="g-1")  # the resend: acknowledged, not delivered
        await t.settle()
        assert await _runs(t, "t-1") == 2
        await t.crash()
        await run.signal(go, 5, dedup="g-1")
        await run.signal(go, 1, dedup="g-2")
        await t.settle()
        assert await _runs(t, "t-1") == 3
        await t.crash()
        await run.signal(go, 5, dedup="g-1")  # two runs later
        await run.signal(stop, 0)
        assert await run.result() == 6


async def test_an_update_resent_with_its_id_after_continue_as_new_answers_the_first_result(
    host: Host,
) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1", 0)
        assert await run.update(add, 3, id="u-1") == 3
        await run.signal(go, 10, dedup="g-1")
        await t.settle()
        assert await _runs(t, "t-1") == 2
        assert await run.update(add, 3, id="u-1") == 3  # not applied again
        await t.crash()
        assert await run.update(add, 3, id="u-1") == 3
        assert await run.update(add, 1, id="u-2") == 14
        await run.signal(stop, 0)
        assert await run.result() == 14
        # Ended: a repeat still answers from what the last run's Start carried.
        assert await run.update(add, 3, id="u-1") == 3


async def test_dedup_ids_carry_across_a_crash_at_every_record() -> None:
    async def drive(t: Any, run: fusee.Run[int]) -> None:
        for key, value in [("g-1", 1), ("g-1", 1), ("g-2", 2), ("g-1", 1)]:
            try:
                await run.signal(go, value, dedup=key)
                await t.settle()
            except fusee.RunFinished:
                return
        try:
            await run.update(add, 4, id="u-1")
            await run.signal(stop, 0, dedup="s")
        except fusee.RunFinished:
            return

    assert await crash_everywhere(tally, 0, drive=drive) == 7


async def test_a_repeated_update_is_answered_only_once_its_outcome_is_durable(host: Host) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1", 0)
        await t.settle()
        with HeldWrites(t.engine.store) as held:
            first = asyncio.ensure_future(run.update(add, 2, id="u-1"))
            await held.waiting.wait()
            # The first caller gives up (a client's timeout); its outcome is
            # recorded but not durable, so a crash now would lose it.
            first.cancel()
            again = asyncio.ensure_future(run.update(add, 2, id="u-1"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not again.done()
            held.release()
            assert await again == 2
        await t.crash()
        assert await run.update(add, 2, id="u-1") == 2
        await run.signal(stop, 0)
        assert await run.result() == 2


async def test_what_a_start_carries_is_bounded_to_the_newest(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_carry, "DEDUPS_KEPT", 2)
    monkeypatch.setattr(_carry, "UPDATES_KEPT", 1)
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1", 0)
        for i in range(3):
            assert await run.update(add, 1, id=f"u-{i}") == 1 + 11 * i
            await run.signal(go, 10, dedup=f"g-{i}")
            await t.settle()
        row = await t.engine.store.get("t-1")
        assert row is not None
        assert row.run == 4
        (start_entry, *_) = await t.engine.store.load("t-1", row.run)
        start = decode(start_entry[1])
        assert isinstance(start, Start)
        dedups, updates = carried_of(start.meta)
        assert len(dedups) == 2
        assert [u for u, _, _ in updates] == ["u-2"]
        # Beyond the bound a resend counts again, as the docs say.
        await run.signal(go, 10, dedup="g-0")
        await run.signal(stop, 0)
        assert await run.result() == 43


async def test_carried_keeps_each_id_once_at_its_newest_position() -> None:
    meta = carried_by(
        ([1, 2, 3], [("u-1", Status.OK, b"\x01")]),
        [Signal(2, "go", 2, b""), Signal(2, "go", 0, b""), Signal(2, "go", 4, b"")],
        [("u-1", Status.FAILED, b"x"), ("u-2", Status.OK, b"\x02")],
    )
    assert carried_of(meta) == (
        [1, 3, 2, 4],
        [("u-1", Status.FAILED, b"x"), ("u-2", Status.OK, b"\x02")],
    )
    assert carried_by(([], []), [Signal(1, "go", 0, b"")], []) is None


async def test_a_carried_blob_that_does_not_decode_is_a_corrupt_record() -> None:
    with pytest.raises(fusee.CorruptRecord, match="carried messages do not decode"):
        carried_of(Meta(carried=b"\xc1"))
