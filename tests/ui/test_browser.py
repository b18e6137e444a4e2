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
from playwright.sync_api import Browser, Dialog, Page, ViewportSize, expect, sync_playwright

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
    add_bug_paused,
    add_greets,
    add_schedules,
    cancel_waiting,
    enqueue_mails,
    go,
    make_store,
    release,
    run_updated,
    start_racing,
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
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED) + 3)
    ids = row_ids(page)
    assert ids[:3] == ["boom-1", "flaky-1", "order-1"]
    assert set(ids[3:]) == set(GREETED)
    expect(page.locator('tr[data-id="flaky-1"] .badge')).to_have_text("paused")
    expect(page.locator("#live")).to_have_class("live on")
    page.screenshot(path=str(tmp_path / "runs.png"))
    assert (tmp_path / "runs.png").stat().st_size > 10_000


def test_child_runs_are_listed_once_asked_for_with_their_parent(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    # Top-level runs by default: order-1's child is on order-1's page.
    expect(page.locator('tr[data-id="order-1"]')).to_be_visible()
    expect(page.locator('tr[data-id="ship-o1"]')).to_have_count(0)
    expect(page.locator("#f-children")).not_to_be_checked()
    page.check("#f-children")
    expect(page.locator('tr[data-id="ship-o1"]')).to_be_visible()
    assert "children=1" in page.url
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED) + 4)
    assert row_ids(page)[:4] == ["boom-1", "flaky-1", "ship-o1", "order-1"]
    parent = page.locator('tr[data-id="ship-o1"] td:last-child a')
    expect(parent).to_have_text("order-1")
    # Filters keep the choice.
    page.select_option("#f-status", "completed")
    page.click("#f-apply")
    expect(page.locator('tr[data-id="ship-o1"]')).to_be_visible()
    page.uncheck("#f-children")
    expect(page.locator('tr[data-id="ship-o1"]')).to_have_count(0)
    expect(page.locator('tr[data-id="order-1"]')).to_be_visible()


def test_a_filter_narrows_the_list(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    expect(page.locator("#runs tbody tr")).to_have_count(len(GREETED) + 3)
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
    assert first[-1] == "g-16"
    assert second[0] == "g-15"


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
    # The journal holds no time of an attempt's own: each is a point, not a bar.
    expect(page.locator(".op-row[data-seq='1'] .mark.point.attempt")).to_have_count(2)
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
def engine_serving(
    data: Path, *, schedules: bool = False, version: str | None = None
) -> Iterator[None]:
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
            version=version,
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
def acting(data: Path, *, schedules: bool = False, version: str | None = None) -> Iterator[str]:
    """``data`` served by an engine and by the app, acting through a Client; the app's URL."""
    with (
        engine_serving(data, schedules=schedules, version=version),
        served(create_app(str(data), actions=ClientActions(str(data)))) as base,
    ):
        yield base


def test_a_bulk_cancel_from_the_runs_list_cancels_what_the_filter_matches(
    page: Page, tmp_path: Path
) -> None:
    data = make_store(tmp_path / "data")
    for id in ("order-2", "order-3"):
        start_waiting(data, id)
    asked: list[str] = []

    def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        if len(asked) == 1:
            dialog.dismiss()
        else:
            dialog.accept()

    page.on("dialog", answer)
    with acting(data) as base:
        page.goto(f"{base}/?workflow=gated")
        expect(page.locator("#runs tbody tr")).to_have_count(3)
        # Counted first, then confirmed: a dismissed confirm changes nothing.
        page.click("#bulk-cancel")
        expect(page.locator("#bulk-message")).to_have_text("nothing cancelled")
        page.click("#bulk-cancel")
        expect(page.locator("#bulk-message")).to_have_text("cancelled 2 runs")
        assert asked == ["Cancel 2 runs this filter matches (child runs included)?"] * 2
        for id in ("order-2", "order-3"):
            expect(page.locator(f'#runs tr[data-id="{id}"] .badge')).to_have_text("cancelled")
        expect(page.locator('#runs tr[data-id="order-1"] .badge')).to_have_text("completed")
        # Nothing left to cancel: no confirm is asked.
        page.click("#bulk-cancel")
        expect(page.locator("#bulk-message")).to_have_text(
            "no run this filter matches can be cancelled"
        )
        assert len(asked) == 2
        page.goto(f"{base}/?status=paused")
        page.click("#bulk-resume")
        expect(page.locator("#bulk-message")).to_have_text("resumed 1 run")


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
        # An ended run has no signal nor cancel to offer.
        expect(page.locator("#cancel")).to_be_hidden()
        expect(page.locator("#signal")).to_be_hidden()
        expect(page.locator("#run-ended")).to_be_visible()
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
        expect(page.locator("#outcome")).to_contain_text("out of stock")
        expect(page.locator(".note-box")).to_have_count(0)
        expect(page.locator('.op-row[data-seq="3"] .badge')).to_have_text("cancelled")
        expect(page.locator("#cancel")).to_be_hidden()
        expect(page.locator("#signal")).to_be_hidden()
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
        # The spec's durations as written; no tick yet, so no last tick.
        expect(page.locator('tr[data-name="hourly-greet"] .spec')).to_have_text(
            "every 1h; overlap buffer_one; catch_up 0s"
        )
        expect(page.locator('tr[data-name="hourly-greet"] .last-tick')).to_have_text("")
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


def test_a_schedule_is_created_from_the_schedules_view_and_deleted(
    page: Page, tmp_path: Path
) -> None:
    data = make_store(tmp_path / "data")
    with acting(data) as base:
        page.goto(f"{base}/schedules")
        expect(page.locator("#schedules-count")).to_have_text("this store has no schedules")
        page.fill("#schedule-name", "often")
        page.fill("#schedule-workflow", "greet")
        page.fill("#schedule-cron", "every day")
        page.fill("#schedule-input", '"cy"')
        page.click("#schedule-submit")
        expect(page.locator("#schedule-message")).to_contain_text("is not a cron expression")
        page.fill("#schedule-cron", "")
        page.fill("#schedule-every", "1h")
        page.click("#schedule-submit")
        often = page.locator('tr[data-name="often"]')
        expect(often.locator(".spec")).to_have_text("every 1h; overlap skip; catch_up 0s")
        expect(page.locator("#schedule-name")).to_have_value("")
        often.locator("button.trigger").click()
        page.locator("#schedule-message a").click()
        expect(page.locator("#outcome")).to_contain_text("hello cy")
        page.go_back()
        page.locator('tr[data-name="often"] button.delete').click()
        expect(page.locator("#schedule-message")).to_have_text("schedule often: deleted")
        expect(page.locator("#schedules tbody tr")).to_have_count(0)


def test_a_schedule_made_at_run_time_is_changed_from_the_schedules_view(
    page: Page, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with acting(data) as base:
        page.goto(f"{base}/schedules")
        page.fill("#schedule-name", "often")
        page.fill("#schedule-workflow", "greet")
        page.fill("#schedule-every", "1h")
        page.fill("#schedule-input", '"cy"')
        page.click("#schedule-submit")
        often = page.locator('tr[data-name="often"]')
        expect(often.locator(".spec")).to_have_text("every 1h; overlap skip; catch_up 0s")
        often.locator("button.edit").click()
        edit = page.locator("#schedule-edit-section")
        expect(edit).to_contain_text("Change schedule often")
        expect(edit).to_contain_text("Now: every 1h; overlap skip; catch_up 0s")
        page.fill("#edit-every", "soon")
        page.click("#schedule-update-submit")
        expect(page.locator("#schedule-message")).to_contain_text("soon")
        # Only the fields filled in change; a cron expression replaces the interval.
        page.fill("#edit-every", "")
        page.fill("#edit-cron", "0 3 * * *")
        page.fill("#edit-input", '"dee"')
        page.select_option("#edit-overlap", "buffer_one")
        page.click("#schedule-update-submit")
        expect(page.locator("#schedule-message")).to_have_text("schedule often: updated")
        expect(often.locator(".spec")).to_contain_text("cron 0 3 * * *")
        expect(often.locator(".spec")).to_contain_text("overlap buffer_one")
        expect(edit).to_have_count(0)
        expect(often.locator(".badge")).to_have_text("active")
        often.locator("button.trigger").click()
        page.locator("#schedule-message a").click()
        expect(page.locator("#outcome")).to_contain_text("hello dee")


def test_a_run_a_bug_paused_shows_what_its_code_raised_on_its_page(
    page: Page, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    add_bug_paused(data, "bug-1")
    with served(create_app(str(data))) as base:
        page.goto(f"{base}/runs/bug-1")
        expect(page.locator("h1 .badge")).to_have_text("paused")
        bug = page.locator("#bug")
        expect(bug).to_contain_text("Paused by a bug in its code. KeyError: 'sku'")
        expect(bug.locator("pre.traceback")).to_contain_text("Traceback (most recent call last):")
        expect(bug.locator("pre.traceback")).to_contain_text('raise KeyError("sku")')


@pytest.fixture(scope="module")
def field(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of runs that ended or stopped midway: cancelled, updated, one step in flight."""
    data = tmp_path_factory.mktemp("field")
    cancel_waiting(data, "order-9", "out of stock")
    run_updated(data, "tally-1")
    start_racing(data, "race-1")
    return data


@pytest.fixture(scope="module")
def field_url(field: Path) -> Iterator[str]:
    with served(create_app(str(field))) as base:
        yield base


def test_a_cancelled_run_shows_one_banner_and_its_wait_cancelled(
    page: Page, field_url: str, tmp_path: Path
) -> None:
    page.goto(f"{field_url}/runs/order-9")
    expect(page.locator("h1 .badge")).to_have_text("cancelled")
    expect(page.locator(".error-box, .note-box, .outcome")).to_have_count(1)
    expect(page.locator("#outcome")).to_contain_text("out of stock")
    wait = page.locator('.op-row[data-seq="3"]')
    expect(wait.locator(".op-name")).to_have_text("go")
    expect(wait.locator(".badge")).to_have_text("cancelled")
    wait.click()
    expect(page.locator(".op-details")).to_contain_text("with the run: the journal records no end")
    page.screenshot(path=str(tmp_path / "cancelled.png"), full_page=True)


def test_an_updates_position_has_its_row_on_the_timeline(page: Page, field_url: str) -> None:
    page.goto(f"{field_url}/runs/tally-1")
    rows = page.locator("#timeline .op-row")
    expect(rows).to_have_count(5)
    seqs = [rows.nth(i).get_attribute("data-seq") for i in range(5)]
    assert seqs == ["0", "1", "2", "3", "4"]
    update = page.locator('.op-row.kind-update[data-seq="3"]')
    expect(update.locator(".op-name")).to_have_text("bump")
    expect(update.locator(".badge")).to_have_text("ok")
    expect(update.locator(".bar.update")).to_have_count(1)
    expect(page.locator("#updates")).to_contain_text("bump")


def test_a_position_without_a_record_shows_a_row_saying_so(page: Page, field_url: str) -> None:
    page.goto(f"{field_url}/runs/race-1")
    expect(page.locator("#timeline .wf-row[data-seq]")).to_have_count(2)
    gap = page.locator('.gap-row[data-seq="0"]')
    expect(gap).to_contain_text("no record yet: in flight")
    expect(page.locator('.op-row[data-seq="1"] .op-name')).to_have_text("nap")


def test_a_step_without_its_own_time_is_a_point_not_a_bar(page: Page, url: str) -> None:
    page.goto(f"{url}/runs/g-03")
    step = page.locator('.op-row[data-seq="1"]')
    expect(step.locator(".op-name")).to_have_text("greet")
    expect(step.locator(".mark.point.attempt.ok")).to_have_count(1)
    expect(step.locator(".bar")).to_have_count(0)


def test_a_finished_run_offers_no_signal_form(page: Page, field: Path) -> None:
    with acting(field) as base:
        for id in ("order-9", "tally-1"):
            page.goto(f"{base}/runs/{id}")
            expect(page.locator("#run-actions")).to_be_visible()
            expect(page.locator("#run-ended")).to_be_visible()
            expect(page.locator("#signal")).to_be_hidden()
            expect(page.locator("#cancel")).to_be_hidden()
            expect(page.locator("#fork-section")).to_be_visible()


def test_the_run_page_shows_a_long_journal_warning_and_hidden_payloads(
    page: Page, tmp_path: Path
) -> None:
    from payload_keys import CODECS

    @fusee.workflow("hush-browser")
    async def hush(ctx: fusee.Ctx, card: str) -> str:
        return await ctx.step("charge", lambda: f"charged {card}")

    async def fill() -> None:
        async with await fusee.Engine.open(
            tmp_path, workflows=[hush], durability="none", codecs=CODECS
        ) as engine:
            await engine.execute(hush, "h-1", "4242")

    # Playwright's sync API runs a loop in this thread: the engine runs in another.
    filler = threading.Thread(target=lambda: asyncio.run(fill()))
    filler.start()
    filler.join()
    with served(create_app(str(tmp_path), codecs=CODECS, warn_records=2)) as base:
        page.goto(f"{base}/runs/h-1")
        expect(page.locator("#journal-warning")).to_contain_text("continue as new")
        expect(page.locator("#outcome")).to_contain_text("charged 4242")
    with served(create_app(str(tmp_path))) as base:
        page.goto(f"{base}/runs/h-1")
        expect(page.locator("#timeline .op-name")).to_have_text(["charge"])
        expect(page.locator("body")).to_contain_text("unreadable payload")
        expect(page.locator("#journal-warning")).to_have_count(0)


def test_the_runs_page_warns_of_a_version_with_runs_and_no_worker(
    page: Page, tmp_path: Path
) -> None:
    data = make_store(tmp_path / "data")
    start_waiting(data, "order-old", version="v-old")
    # The serving engine is given its version: it pins (a derived one would
    # take the old run over).
    with acting(data, version="v-new") as base:
        page.goto(f"{base}/")
        old = page.locator("#version-warnings .version-warning", has_text="version v-old")
        expect(old).to_have_text(
            "version v-old: 1 unfinished run(s) started on version 'v-old' and no worker runs "
            "it: its pinned runs wait until a worker of that version runs"
        )
