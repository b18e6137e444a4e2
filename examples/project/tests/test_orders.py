"""The order workflow: live, on a virtual clock, across a crash, and crashed at every record."""

from __future__ import annotations

from typing import Any

import fusee
from fusee.pytest_plugin import EngineFactory
from fusee.testing import TestEngine, crash_everywhere

from shop.orders import Order, Outcome, notify, packed, process_order

ORDER = Order("o-1", "ada@example.com", 1290)
# Annotated: mypy joins workflows of different input types to `object`.
WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [process_order, notify]


async def test_a_packed_order_ships_after_a_crash(fusee_engine: EngineFactory) -> None:
    async with fusee_engine(workflows=WORKFLOWS) as t:
        run = await t.start(process_order, "o-1", ORDER)
        await t.advance("1h")  # a virtual hour: the run waits for the warehouse
        await t.crash()  # as a restarted process: recovered from the store
        await run.signal(packed, "TRK-1")
        assert await run.result() == Outcome("o-1", "shipped", "sent to ada@example.com: TRK-1")


async def test_an_order_never_packed_is_refunded_after_two_days(
    fusee_engine: EngineFactory,
) -> None:
    async with fusee_engine(workflows=WORKFLOWS) as t:
        run = await t.start(process_order, "o-1", ORDER)
        await t.advance("2d")  # two virtual days pass in no time
        assert await run.result() == Outcome("o-1", "refunded", "re_ch_o-1")


async def send_packed(t: TestEngine, run: fusee.Run[Outcome]) -> None:
    # A dedup id: after a crash the signal is sent again, and counts once.
    await run.signal(packed, "TRK-1", dedup="packed-o-1")


async def test_a_crash_after_any_record_changes_nothing() -> None:
    # Runs the order once per record, crashing after it; each must end the
    # same, and no step whose result was on disk may run again.
    outcome = await crash_everywhere(process_order, ORDER, workflows=[notify], drive=send_packed)
    assert outcome == Outcome("o-1", "shipped", "sent to ada@example.com: TRK-1")
    assert await crash_everywhere(process_order, ORDER, workflows=[notify]) == Outcome(
        "o-1", "refunded", "re_ch_o-1"
    )
