"""Takes the screenshots of docs/ui.md: `python docs/screenshots.py` (dev install).

It fills a store with the UI tests' runs and schedules, serves `fusee ui` on
it on a free port and photographs the runs page, a run's page, a waiting
run's actions and the schedules page in Debian's headless Chromium
(scripts/system-deps.sh installs it), as the browser tests do.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import fusee

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from fusee.ui import create_app  # noqa: E402
from fusee.ui._actions import ClientActions  # noqa: E402
from tests.ui.conftest import launch, served  # noqa: E402
from tests.ui.workflows import (  # noqa: E402
    SCHEDULES,
    WORKFLOWS,
    in_thread,
    make_store,
    start_waiting,
)

OUT = ROOT / "docs" / "img"
NAMES = ("ui-runs.png", "ui-run.png", "ui-actions.png", "ui-schedules.png")


async def _schedules(data: Path) -> None:
    """Stores the tests' schedules, one paused and one triggered once."""
    async with await fusee.Engine.open(
        data, workflows=WORKFLOWS, durability="none", schedules=SCHEDULES
    ) as engine:
        await engine.schedules.pause("nightly-greet")
        await (await engine.schedules.trigger("hourly-greet")).result()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_store(Path(tmp))
        start_waiting(data, "order-2")
        in_thread(_schedules, data)
        # The actions' client connects on first use: the page shows the forms
        # without a worker behind it.
        app = create_app(str(data), actions=ClientActions(str(data)))
        with served(app) as url, sync_playwright() as p:
            browser = launch(p)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(f"{url}/")
                page.wait_for_selector('#runs tbody tr[data-id="order-2"]')
                page.screenshot(path=str(OUT / "ui-runs.png"))
                page.goto(f"{url}/runs/order-1")
                page.click('.op-row[data-seq="1"]')
                page.wait_for_selector(".attempts .attempt-row")
                page.screenshot(path=str(OUT / "ui-run.png"), full_page=True)
                page.goto(f"{url}/runs/order-2")
                page.wait_for_selector("#signal-names option", state="attached")
                page.fill("#signal-name", "go")
                page.fill("#signal-payload", "true")
                page.fill("#cancel-reason", "out of stock")
                page.locator("#run-actions").scroll_into_view_if_needed()
                page.screenshot(path=str(OUT / "ui-actions.png"), full_page=True)
                page.goto(f"{url}/schedules")
                page.wait_for_selector('#schedules tr[data-name="hourly-greet"] a')
                page.screenshot(path=str(OUT / "ui-schedules.png"))
            finally:
                browser.close()
    print("wrote", ", ".join(str(OUT / n) for n in NAMES))


if __name__ == "__main__":
    main()
