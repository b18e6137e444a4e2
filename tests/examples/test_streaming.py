"""examples/streaming.py: a client reads the tokens live, once each, across a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from example_runner import run_example

from examples import streaming
from fusee.testing import TestEngine, crash_everywhere

WORDS = streaming.ANSWER.split()


@pytest.mark.asyncio
async def test_the_answer_survives_a_crash_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "TOKEN_DELAY_S", 0)
    assert await crash_everywhere(streaming.chat, "hi", id="c-1") == streaming.ANSWER


@pytest.mark.asyncio
async def test_a_reader_gets_every_token_once() -> None:
    async with TestEngine(workflows=[streaming.chat]) as t:
        run = await t.start(streaming.chat, "c-2", "hi")
        tokens = [tok async for tok in run.stream("tokens")]
        assert await run.result() == streaming.ANSWER
        assert tokens == WORDS
        await t.crash()
        again = await asyncio.wait_for(_read(run), 10)
        assert again == WORDS


async def _read(run: object) -> list[str]:
    return [tok async for tok in run.stream("tokens")]  # type: ignore[attr-defined]


def test_the_example_prints_tokens_then_the_result(tmp_path: Path) -> None:
    out = run_example("streaming", cwd=tmp_path)
    assert f"tokens, as they land: {streaming.ANSWER}" in out
    assert f"result: {streaming.ANSWER}" in out
