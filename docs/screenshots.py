"""Takes the two screenshots of docs/ui.md: `python docs/screenshots.py` (dev install).

It fills a store with the UI tests' runs, serves `fusee ui` on it on a free
port and photographs the runs page and a run's page in Debian's headless
Chromium (scripts/system-deps.sh installs it), as the browser tests do.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from fusee.ui import create_app  # noqa: E402
from tests.ui.conftest import launch, served  # noqa: E402
from tests.ui.workflows import make_store, start_waiting  # noqa: E402

OUT = ROOT / "docs" / "img"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_store(Path(tmp))
        start_waiting(data, "order-2")
        with served(create_app(str(data))) as url, sync_playwright() as p:
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
            finally:
                browser.close()
    print(f"wrote {OUT / 'ui-runs.png'} and {OUT / 'ui-run.png'}")


if __name__ == "__main__":
    main()
