"""examples/cart.py: updates change the cart, queries read it, replay applies them in order."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

import fusee
from examples import cart
from fusee.testing import TestEngine


@pytest.mark.asyncio
async def test_updates_and_queries_survive_a_crash() -> None:
    async with TestEngine(workflows=[cart.cart]) as t:
        run = await t.start(cart.cart, "cart-1", "ada")
        assert await run.update(cart.add_item, cart.Item("mug", 2)) == 2580
        assert await run.update(cart.add_item, cart.Item("tea", 1)) == 3680
        with pytest.raises(fusee.FuseeError, match="quantity must be positive"):
            await run.update(cart.add_item, cart.Item("mug", 0))
        with pytest.raises(fusee.FuseeError, match="no such product"):
            await run.update(cart.add_item, cart.Item("pony", 1))
        await t.crash()
        assert await run.query(cart.contents) == {"mug": 2, "tea": 1}
        assert await run.update(cart.remove_item, "tea") == 2580
        await t.crash()
        await run.signal(cart.checkout, True)
        assert await run.result() == {"mug": 2, "total_cents": 2580}
        priced = [key for _, key in t.step_log]
        assert len(priced) == len(set(priced)) == 2


def test_the_example_prints_each_update(tmp_path: Path) -> None:
    out = run_example("cart", cwd=tmp_path)
    assert "add 2 mugs   -> total 2580 cents" in out
    assert "add -1 mug   -> rejected" in out
    assert "query        -> {'mug': 2}" in out
    assert "checked out  -> {'mug': 2, 'total_cents': 2580}" in out
