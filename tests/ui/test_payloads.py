"""The UI over encrypted payloads: decoded with the workers' codecs, a placeholder without."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from payload_keys import CODECS
from starlette.testclient import TestClient

import fusee
from fusee.ui import create_app

CARD = "card-4242-4242-4242-4242"


@fusee.workflow("hush")
async def hush(ctx: fusee.Ctx, card: str) -> str:
    return await ctx.step("charge", lambda: f"charged {card}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("encrypted")

    async def fill() -> None:
        async with await fusee.Engine.open(
            directory, workflows=[hush], durability="none", codecs=CODECS
        ) as engine:
            await engine.execute(hush, "h-1", CARD)

    asyncio.run(fill())
    return directory


def _get_run(data: Path, **options: Any) -> dict[str, Any]:
    with TestClient(create_app(str(data), **options), base_url="http://127.0.0.1:8700") as c:
        answer = c.get("/api/runs/h-1")
        assert answer.status_code == 200
        shown: dict[str, Any] = answer.json()
        return shown


def test_with_the_workers_codecs_the_run_page_shows_its_payloads_decoded(data: Path) -> None:
    shown = _get_run(data, codecs=CODECS)
    assert shown["start"]["input"] == CARD
    assert shown["operations"][0]["result"] == f"charged {CARD}"
    assert shown["outcome"]["result"] == f"charged {CARD}"
    assert shown["journal_warning"] is None


def test_without_them_the_page_still_shows_the_journal_and_says_why_each_payload_is_hidden(
    data: Path,
) -> None:
    shown = _get_run(data)
    assert [op["name"] for op in shown["operations"]] == ["charge"]
    hidden = shown["start"]["input"]
    assert hidden.startswith("<unreadable payload: ")
    assert "run 'h-1' (run 1) at position 1 (Start, codec 'aes-gcm')" in hidden
    assert "--codecs MODULE:ATTR" in hidden
    assert CARD not in str(shown)


def test_a_wrong_key_names_the_key_the_payload_needs(data: Path) -> None:
    other = [fusee.codecs.Zstd(), fusee.codecs.Encrypt(keys={"k9": bytes(32)}, active="k9")]
    shown = _get_run(data, codecs=other)
    assert "encrypted with key k1; this process has k9" in shown["outcome"]["result"]


def test_a_run_past_warn_records_says_so_on_its_page(data: Path) -> None:
    shown = _get_run(data, codecs=CODECS, warn_records=2)
    assert "run 'h-1' (run 1) has 3 records, over warn_records=2" in shown["journal_warning"]
    assert "continue as new" in shown["journal_warning"]
