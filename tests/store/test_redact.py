"""No surface shows a password (fusee/store/_redact.py, and everything that names a store).

A Postgres store's URL carries its password. The test opens an engine, a
Client, the CLI and the UI on such a URL, with telemetry on and every log
record kept, makes them fail to connect too, and looks for the password in
everything they show: reprs, messages, logs, errors (with their causes),
span attributes, pages and API answers.
"""

from __future__ import annotations

import asyncio
import io
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from _postgres import USER, Cluster
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

import fusee
from fusee.cli import main
from fusee.store import open_store
from fusee.store._redact import redact_dsn, shown_target
from fusee.ui import create_app

go = fusee.signal("go", int)


@fusee.workflow("billing")
async def billing(ctx: fusee.Ctx, n: int) -> int:
    ctx.logger.info("billing %d", n)
    got = await ctx.wait_for(go) or 0
    return await ctx.step("charge", lambda: n + got)


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        pytest.param("postgresql://app:s3cret@db/x", "postgresql://app:***@db/x", id="url"),
        pytest.param(
            "postgres://app:p%40ss@db:5432/x?sslmode=require",
            "postgres://app:***@db:5432/x?sslmode=require",
            id="quoted-url",
        ),
        pytest.param(
            "postgresql://db/x?user=app&password=s3cret",
            "postgresql://db/x?user=app&password=***",
            id="parameter",
        ),
        pytest.param("postgresql://app@db/x", "postgresql://app@db/x", id="no-password"),
        pytest.param("./data", "./data", id="directory"),
        pytest.param("memory", "memory", id="memory"),
    ],
)
def test_a_target_is_shown_without_its_password(target: str, shown: str) -> None:
    assert shown_target(target) == shown
    assert redact_dsn(target) == shown


class _Kept(logging.Handler):
    """Every log record of every logger, formatted with its exception."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def kept_logs() -> Iterator[_Kept]:
    kept = _Kept()
    root = logging.getLogger()
    level = root.level
    root.addHandler(kept)
    root.setLevel(logging.DEBUG)
    try:
        yield kept
    finally:
        root.removeHandler(kept)
        root.setLevel(level)


def _error_text(error: BaseException) -> str:
    """An error as a traceback prints it: its message and every cause's."""
    return "".join(traceback.format_exception(error))


async def _engine_and_client_surfaces(dsn: str, wrong: str, unreachable: str) -> list[str]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    shown: list[str] = []
    async with await fusee.Engine.open(
        dsn, workflows=[billing], durability="none", tracer_provider=provider
    ) as engine:
        shown += [repr(engine), str(engine), repr(engine.store), str(engine.store)]
        run = await engine.start(billing, "b-1", 1)
        async with await fusee.Client.connect(dsn) as client:
            shown += [repr(client), str(client)]
            await client.get("b-1").signal(go, 2)
            shown.append(repr(await client.get("b-1").describe()))
        assert await run.result() == 3
        shown.append(repr(await run.describe()))
        shown += [repr(info) async for info in engine.list()]
    provider.shutdown()
    shown += [span.to_json() for span in spans.get_finished_spans()]
    assert spans.get_finished_spans()
    for target in (wrong, unreachable):
        with pytest.raises(fusee.StoreError) as caught:
            await asyncio.wait_for(fusee.Engine.open(target, workflows=[billing]), 60)
        shown.append(_error_text(caught.value))
        with pytest.raises(fusee.StoreError) as caught:
            await asyncio.wait_for(fusee.Client.connect(target), 60)
        shown.append(_error_text(caught.value))
    store = open_store(wrong)
    shown += [repr(store), str(store)]
    return shown


def test_no_surface_shows_the_password_of_a_postgres_store(
    postgres_cluster: Cluster, kept_logs: _Kept, tmp_path: Path
) -> None:
    secret = postgres_cluster.password
    wrong_secret = "Wr0ng-" + secret[::-1]
    dsn = postgres_cluster.dsn
    wrong = postgres_cluster.dsn_for("postgres", password=wrong_secret)
    unreachable = f"postgresql://{USER}:{quote(secret, safe='')}@127.0.0.1:1/postgres"
    shown = asyncio.run(_engine_and_client_surfaces(dsn, wrong, unreachable))

    # The CLI: what it prints, and its errors.
    for argv in (
        ["list"],
        ["list", "--json"],
        ["show", "b-1"],
        ["result", "b-1"],
        ["signal", "b-1", "go", "1"],
    ):
        for target in (dsn, wrong, unreachable):
            out, err = io.StringIO(), io.StringIO()
            main([*argv, "--store", target], stdout=out, stderr=err)
            shown += [out.getvalue(), err.getvalue()]

    # The UI: its pages and its API, on a store that answers and one that does not.
    with TestClient(create_app(dsn), base_url="http://127.0.0.1:8700") as ui:
        for path in ("/", "/api/info", "/api/runs", "/api/runs/b-1", "/api/queues"):
            answer = ui.get(path)
            assert answer.status_code == 200, (path, answer.text)
            shown.append(answer.text)
        assert ui.get("/api/info").json()["target"] == shown_target(dsn)
    with (
        pytest.raises(fusee.StoreError) as caught,
        TestClient(create_app(wrong), base_url="http://127.0.0.1:8700") as ui,
    ):
        ui.get("/api/info")
    shown.append(_error_text(caught.value))

    shown += kept_logs.lines
    assert any("b-1" in text for text in shown)
    for password in (secret, quote(secret, safe=""), wrong_secret):
        leaks = [text for text in shown if password in text]
        assert leaks == [], f"the password shows in {leaks}"
