"""examples/saga.py: compensations run in reverse, exactly once, whatever the crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

from examples import saga
from fusee.testing import TestEngine, crash_everywhere

GOOD = saga.Order("o-1", "mug", 1290, "Paris")
NO_ADDRESS = saga.Order("o-2", "teapot", 3490, "")


@pytest.mark.asyncio
async def test_a_good_order_ships() -> None:
    outcome = await crash_everywhere(saga.checkout_saga, GOOD, id="o-1")
    assert outcome == saga.Outcome("shipped", "FR-o-1")


@pytest.mark.asyncio
async def test_a_failed_shipment_is_compensated_in_reverse_whatever_the_crash() -> None:
    outcome = await crash_everywhere(saga.checkout_saga, NO_ADDRESS, id="o-2")
    assert outcome.status == "compensated"
    assert "no shipping address" in outcome.detail


@pytest.mark.asyncio
async def test_cancelling_while_shipping_retries_compensates_once() -> None:
    done: list[str] = []

    def carrier_down() -> str:
        raise ConnectionError("carrier unreachable")  # retried, on the virtual clock

    async with TestEngine(workflows=[saga.checkout_saga]) as t:
        t.mock_step("saga", "ship", carrier_down)
        t.mock_step("saga", "refund", lambda: done.append("refund"))
        t.mock_step("saga", "release", lambda: done.append("release"))
        run = await t.start(saga.checkout_saga, "o-3", GOOD)
        await t.settle()
        await run.cancel("customer changed their mind")
        outcome = await run.result()
        await t.crash()
        assert await run.result() == outcome
    assert outcome == saga.Outcome("compensated", "customer changed their mind")
    assert done == ["refund", "release"]


def test_the_example_prints_both_orders(tmp_path: Path) -> None:
    out = run_example("saga", cwd=tmp_path)
    assert "=> shipped: FR-o-1" in out
    assert out.index("[o-2] refund") < out.index("[o-2] release")
    assert "=> compensated: step 'ship' failed: Failure: no shipping address" in out
