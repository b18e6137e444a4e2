"""The UI's pages in a real headless Chromium (Debian's), driven by Playwright.

One browser for the module. Playwright's own browser download cannot work
here: it drives ``/usr/bin/chromium``, which ``scripts/system-deps.sh``
installs (``make pytest`` runs it first).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

import fusee
from fusee.cli._inbox import signal_checker
from fusee.ui import create_app
from fusee.ui._actions import ClientActions

from .conftest import launch, served
from .workflows import (
    FLAKY_OK,
    GREETED,
    SCHEDULES,
    WORKFLOWS,
    add_greets,
    add_schedules,
    enqueue_mails,
    go,
    make_store,
    release,
    start_waiting,
)

VIEWPORT: ViewportSize = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def url(data: Path) -> Iterator[str]:
    with served(create_app(str(data))) as base:
        yield base


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.set_default_timeout(10_000)
    try:
        yield p
    finally:
        context.close()
    assert errors == [], errors


def row_ids(page: Page) -> list[str]:
    ids: list[str] = page.eval_on_selector_all(
        "#runs tbody tr", "rows => rows.map(r => r.dataset.id)"
    )
    return ids


def test_the_runs_page_lists_the_runs(page: Page, url: str, tmp_path: Path) -> None:
    page.goto(f"{url}/")
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED) + 4)
    ids = row_ids(page)
    assert ids[:4] == ["boom-1", "flaky-1", "ship-o1", "order-1"]
    assert set(ids[4:]) == set(GREETED)
    expect(page.locator('tr[data-id="flaky-1"] .badge')).to_have_text("paused")
    expect(page.locator('tr[data-id="ship-o1"]')).to_contain_text("order-1")
    expect(page.locator("#live")).to_have_class("live on")
    page.screenshot(path=str(tmp_path / "runs.png"))
    assert (tmp_path / "runs.png").stat().st_size > 10_000


def test_a_filter_narrows_the_list(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED) + 4)
    page.select_option("#f-status", "paused")
    page.click("#f-apply")
    expect(page.locator("#runs tbody tr")).to_have_count(1)
    assert row_ids(page) == ["flaky-1"]
    assert "status=paused" in page.url
    page.goto(f"{url}/")
    page.fill("#f-workflow", "greet")
    page.fill("#f-attr", "customer=bo")
    page.click("#f-apply")
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED[1::2]))
    assert set(row_ids(page)) == set(GREETED[1::2])


def test_the_next_page_continues_the_list(page: Page, url: str) -> None:
    page.goto(f"{url}/?limit=10")
    expect(page.locator("#runs tbody tr")).to_have_count(10)
    first = row_ids(page)
    page.click("#next-page")
    expect(page.locator("#first-page")).to_be_visible()
    expect(page.locator("#runs tbody tr")).to_have_count(10)
    second = row_ids(page)
    assert not set(first) & set(second)
    assert first[-1] == "g-17"
    assert second[0] == "g-16"


def test_a_runs_page_shows_its_timeline(page: Page, url: str, tmp_path: Path) -> None:
    page.goto(f"{url}/runs/order-1")
    names = page.locator("#timeline .op-row .op-name")
    expect(names).to_have_text(["set_attributes", "charge", "cool-off", "go", "ship ship-o1"])
    # The retry's error is on the timeline without a click.
    expect(page.locator("#timeline .wf-note")).to_have_text(
        "attempt 1: ConnectionError: card network unreachable"
    )
    page.click('.op-row[data-seq="1"]')
    attempts = page.locator(".attempts .attempt-row")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(0)).to_contain_text("failed")
    expect(attempts.nth(0).locator(".attempt-error")).to_have_text(
        "ConnectionError: card network unreachable"
    )
    expect(page.locator(".op-row[data-seq='1'] .bar.attempt")).to_have_count(2)
    expect(page.locator("#outcome")).to_contain_text("shipped FR-o1")
    expect(page.locator("#signals")).to_contain_text("go")
    expect(page.locator("#streams")).to_contain_text("shipped FR-o1")
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    # The children's tree links to the child's page, which links back.
    page.click('#children a[href="/runs/ship-o1"]')
    expect(page.locator("h1 .run-id")).to_have_text("ship-o1")
    expect(page.locator(".facts")).to_contain_text("order-1")
    expect(page.locator("#timeline .op-name")).to_have_text(["label"])


def test_pages_update_live(browser: Browser, page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    start_waiting(data, "order-2")
    with served(create_app(str(data))) as base:
        page.goto(f"{base}/")
        expect(page.locator("#live")).to_have_class("live on")
        expect(page.locator('tr[data-id="order-2"]')).to_be_visible()
        add_greets(data, "g-live")
        expect(page.locator('tr[data-id="g-live"]')).to_be_visible()
        assert row_ids(page)[0] == "g-live"

        run_page = page.context.new_page()
        run_page.goto(f"{base}/runs/order-2")
        expect(run_page.locator('.op-row[data-seq="3"] .badge')).to_have_text("waiting")
        expect(run_page.locator("#live")).to_have_class("live on")
        release(data, "order-2")
        expect(run_page.locator("#outcome")).to_contain_text("shipped FR-order-2")
        expect(run_page.locator('.op-row[data-seq="3"] .badge')).to_have_text("signalled")
        expect(run_page.locator("#children")).to_contain_text("ship-order-2")
        # The list page, still open, saw order-2 finish.
        expect(page.locator('tr[data-id="order-2"] .badge')).to_have_text("completed")


@contextlib.contextmanager
def engine_serving(data: Path, *, schedules: bool = False) -> Iterator[None]:
    """An engine serving ``data`` in a thread of its own (it applies the page's commands).

    It checks signals as ``fusee worker`` does: a payload against the type of
    the signal `go`.
    """
    ready = threading.Event()
    stopping: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        stop = asyncio.Event()
        stopping.append((asyncio.get_running_loop(), stop))
        async with await fusee.Engine.open(
            data,
            workflows=WORKFLOWS,
            durability="none",
            schedules=SCHEDULES if schedules else (),
        ) as engine:
            engine.inbox.check_signal = signal_checker({go.name: go})
            ready.set()
            await stop.wait()

    def work() -> None:
        try:
            asyncio.run(serve())
        except BaseException as e:
            errors.append(e)
            ready.set()

    thread = threading.Thread(target=work, name="fusee-ui-test-engine")
    thread.start()
    assert ready.wait(30), "the engine did not open"
    assert not errors, errors
    try:
        yield
    finally:
        loop, stop = stopping[0]
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        assert not thread.is_alive()
        assert not errors, errors


def test_a_fork_from_the_run_page_opens_the_new_run(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    with (
        engine_serving(data),
        served(create_app(str(data), actions=ClientActions(str(data)))) as base,
    ):
        page.goto(f"{base}/runs/g-03")
        page.fill("#fork-new-id", "g-03-again")
        page.fill("#fork-at", "nope")
        page.click("#fork-submit")
        expect(page.locator("#fork-message")).to_contain_text("no operation named 'nope'")
        page.fill("#fork-at", "greet")
        page.fill("#fork-input", '"zoe"')
        page.click("#fork-submit")
        expect(page.locator("h1 .run-id")).to_have_text("g-03-again")
        assert page.url.endswith("/runs/g-03-again")
        expect(page.locator("#outcome")).to_contain_text("hello zoe")


@contextlib.contextmanager
def acting(data: Path, *, schedules: bool = False) -> Iterator[str]:
    """``data`` served by an engine and by the app, acting through a Client; the app's URL."""
    with (
        engine_serving(data, schedules=schedules),
        served(create_app(str(data), actions=ClientActions(str(data)))) as base,
    ):
        yield base


def test_a_signal_sent_from_the_run_page_reaches_the_run(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    start_waiting(data, "order-2")
    with acting(data) as base:
        page.goto(f"{base}/runs/order-2")
        expect(page.locator('.op-row[data-seq="3"] .badge')).to_have_text("waiting")
        # The run's wait names its signal: the form offers it.
        expect(page.locator("#signal-names option")).to_have_count(1)
        assert page.locator("#signal-names option").get_attribute("value") == "go"
        page.fill("#signal-name", "go")
        page.fill("#signal-payload", "{not json")
        page.click("#signal-submit")
        expect(page.locator("#signal-message")).to_contain_text("the payload is not JSON")
        # `go` takes a bool: the worker refuses a text, and the page says why.
        page.fill("#signal-payload", '"yes"')
        with page.expect_response(lambda r: r.url.endswith("/order-2/signal")) as refused:
            page.click("#signal-submit")
        assert refused.value.status == 422
        expect(page.locator("#signal-message")).to_contain_text("does not fit the signal's type")
        expect(page.locator("#signals")).to_have_count(0)
        page.fill("#signal-payload", "true")
        page.click("#signal-submit")
        expect(page.locator("#outcome")).to_contain_text("shipped FR-order-2")
        expect(page.locator("#signals")).to_contain_text("go")
        expect(page.locator("h1 .badge")).to_have_text("completed")
        # An ended run has no cancel to offer.
        expect(page.locator("#cancel")).to_be_hidden()
        page.screenshot(path=str(tmp_path / "signalled.png"), full_page=True)
    assert (tmp_path / "signalled.png").stat().st_size > 10_000


def test_cancel_from_the_run_page_cancels_the_run(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    start_waiting(data, "order-3")
    with acting(data) as base:
        page.goto(f"{base}/runs/order-3")
        expect(page.locator("#cancel")).to_be_visible()
        # Resume is for paused runs only.
        expect(page.locator("#resume")).to_be_hidden()
        page.fill("#cancel-reason", "out of stock")
        page.click("#cancel-submit")
        expect(page.locator("h1 .badge")).to_have_text("cancelled")
        expect(page.locator("#outcome")).to_contain_text("cancelled")
        expect(page.locator(".note-box")).to_contain_text("out of stock")
        expect(page.locator("#cancel")).to_be_hidden()
        page.screenshot(path=str(tmp_path / "cancelled.png"), full_page=True)
    assert (tmp_path / "cancelled.png").stat().st_size > 10_000


def test_resume_from_the_run_page_resumes_a_paused_run(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    with acting(data) as base:
        page.goto(f"{base}/runs/flaky-1")
        expect(page.locator("h1 .badge")).to_have_text("paused")
        expect(page.locator("#resume")).to_be_visible()
        FLAKY_OK["ok"] = True
        try:
            page.click("#resume-submit")
            expect(page.locator("#outcome")).to_contain_text("up")
            expect(page.locator("h1 .badge")).to_have_text("completed")
        finally:
            FLAKY_OK["ok"] = False
        expect(page.locator("#resume")).to_be_hidden()
        page.screenshot(path=str(tmp_path / "resumed.png"), full_page=True)
    assert (tmp_path / "resumed.png").stat().st_size > 10_000


def test_the_queues_view_lists_each_queue_and_key(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    enqueue_mails(data)
    with served(create_app(str(data))) as base:
        page.goto(f"{base}/")
        page.click("#nav-queues")
        assert page.url.endswith("/queues")
        rows = page.locator("#queues tbody tr")
        expect(rows).to_have_count(3)
        queue = page.locator('tr.queue-row[data-queue="emails"]')
        expect(queue.locator(".queued")).to_have_text("2")
        expect(queue.locator(".running")).to_have_text("1")
        expect(page.locator('tr[data-key="cust-7"] .queued')).to_have_text("1")
        expect(page.locator('tr[data-key="cust-7"] .running')).to_have_text("1")
        expect(page.locator('tr[data-key="cust-9"] .queued')).to_have_text("1")
        expect(page.locator("#nav-queues")).to_have_class("here")
        page.screenshot(path=str(tmp_path / "queues.png"))
    assert (tmp_path / "queues.png").stat().st_size > 10_000


def test_the_schedules_view_lists_pauses_and_triggers_schedules(page: Page, tmp_path: Path) -> None:
    data = make_store(tmp_path / "data")
    add_schedules(data)
    with acting(data, schedules=True) as base:
        page.goto(f"{base}/")
        page.click("#nav-schedules")
        assert page.url.endswith("/schedules")
        expect(page.locator("#schedules tbody tr")).to_have_count(2)
        nightly = page.locator('tr[data-name="nightly-greet"]')
        expect(nightly).to_contain_text("cron 0 2 * * * Europe/Paris")
        expect(nightly.locator(".badge")).to_have_text("active")
        nightly.locator("button.pause").click()
        expect(nightly.locator(".badge")).to_have_text("paused")
        nightly.locator("button.resume").click()
        expect(nightly.locator(".badge")).to_have_text("active")
        hourly = page.locator('tr[data-name="hourly-greet"]')
        hourly.locator("button.trigger").click()
        link = page.locator("#schedule-message a")
        expect(link).to_contain_text("hourly-greet")
        page.screenshot(path=str(tmp_path / "schedules.png"))
        link.click()
        expect(page.locator("h1 .run-id")).to_contain_text("hourly-greet")
        expect(page.locator("#outcome")).to_contain_text("hello bo")
    assert (tmp_path / "schedules.png").stat().st_size > 10_000
