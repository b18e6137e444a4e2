"""examples/callback.py: the token survives a crash and completes the wait."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
from example_runner import run_example

from examples import callback
from fusee.testing import TestEngine


@pytest.mark.asyncio
async def test_the_token_completes_the_signup_after_a_crash() -> None:
    async with TestEngine(workflows=[callback.signup]) as t:
        run = await t.start(callback.signup, "s-1", "ada@example.com")
        await t.settle()
        email, token = callback.outbox.get_nowait()
        assert email == "ada@example.com"
        await t.crash()
        await t.complete(token, {"confirmed": True})
        assert await run.result() == "acct-ada"
    with pytest.raises(queue.Empty):
        callback.outbox.get_nowait()  # the email step did not run again


@pytest.mark.asyncio
async def test_a_declined_link_creates_no_account() -> None:
    async with TestEngine(workflows=[callback.signup]) as t:
        run = await t.start(callback.signup, "s-2", "bo@example.com")
        await t.settle()
        _, token = callback.outbox.get_nowait()
        await t.complete(token, {"confirmed": False})
        assert await run.result() == "declined"


def test_the_example_creates_the_account(tmp_path: Path) -> None:
    out = run_example("callback", cwd=tmp_path)
    assert "sent a confirmation link to ada@example.com" in out
    assert "signup-ada: acct-ada" in out
