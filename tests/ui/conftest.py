"""Fixtures of the UI's tests: a store full of runs, and the app served on a free port."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Playwright
from starlette.types import ASGIApp

from .workflows import make_store

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Playwright) -> Browser:
    """Debian's Chromium, headless; a clear failure where it is missing."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"the UI's browser tests need Chromium at {CHROMIUM}; run scripts/system-deps.sh "
            "(as root: it installs Debian's chromium package)",
            pytrace=False,
        )
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store directory with the runs `make_store` makes (shared by a module's tests)."""
    return make_store(tmp_path_factory.mktemp("data"))


@contextlib.contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """Serves ``app`` with uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1, ws="none"
    )
    server = uvicorn.Server(config)
    pause = threading.Event()

    def run() -> None:
        # uvicorn sets `started` once it listens; the thread ends when it stops.
        server.run(sockets=[sock])

    thread = threading.Thread(target=run, name="fusee-ui-test-server", daemon=True)
    thread.start()
    for _ in range(500):
        if server.started or not thread.is_alive():
            break
        pause.wait(0.01)
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"
