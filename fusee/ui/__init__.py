"""``fusee ui``: the operator's web page over a store, and its JSON API.

The page lists a store's runs (filtered, newest first, paged in the store)
and shows a run's journal as a waterfall timeline, both updated live through
Server-Sent Events, with its queues and schedules on pages of their own. It
needs the ``ui`` extra (``pip install 'fusee[ui]'``: Starlette and uvicorn);
its HTML, JavaScript and CSS ship in the package.

The rule: the app reads its store read-only, as the ``fusee`` command does,
and binds 127.0.0.1 unless it is given a token that every request must carry.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fusee._payloads import DEFAULT_WARN_RECORDS, reader
from fusee.store import Store
from fusee.ui._app import Actions, build_app, open_readonly

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from fusee.codecs import PayloadCodec

__all__ = ["Actions", "create_app", "serve"]


def create_app(
    target: str,
    *,
    token: str | None = None,
    readonly_store: Callable[[str], Store] = open_readonly,
    actions: Actions | None = None,
    codecs: Iterable[PayloadCodec] = (),
    warn_records: int = DEFAULT_WARN_RECORDS,
) -> Starlette:
    """Makes the ASGI app that serves the page and the API for a store.

    The store is opened (read-only) when the app starts and closed when it
    stops (ASGI lifespan), so one app serves one event loop.

    Args:
        target: The store: a data directory (as ``Engine.open`` takes it).
        token: When given, every request must carry it (``Authorization:
            Bearer TOKEN``, or the cookie a page load with ``?token=TOKEN``
            sets); without one the app answers only to loopback host names.
        readonly_store: Makes the store from ``target``, not opened yet
            (default: `fusee.store.open_store` with ``readonly=True``).
        actions: What the page may do to runs (signal, cancel, resume, fork)
            and schedules (pause, resume, trigger); with None the app only
            reads.
        codecs: The payload codecs the workers use: payloads are shown
            decoded; one the page cannot decode shows why (a missing key)
            in its place.
        warn_records: A run's page says that its journal is long (and
            suggests continue-as-new) past this many records, as the
            engine's ``warn_records`` does in its log.

    Returns:
        A Starlette app (any ASGI server runs it; `serve` runs uvicorn).

    Example:
        >>> app = create_app("./data", token="s3cret")
        >>> sorted(r.path for r in app.routes)[:4]
        ['/', '/api/info', '/api/queues', '/api/runs']
    """
    chain = list(codecs)
    return build_app(
        target,
        token=token,
        readonly_store=lambda t: reader(readonly_store(t), t, chain),
        actions=actions,
        warn_records=warn_records,
    )


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost).

    Example:
        >>> [_is_loopback(h) for h in ("127.0.0.1", "localhost", "0.0.0.0", "::1")]
        [True, True, False, True]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    target: str,
    host: str = "127.0.0.1",
    port: int = 8700,
    token: str | None = None,
    *,
    actions: Actions | None = None,
    codecs: Iterable[PayloadCodec] = (),
) -> None:
    """Serves the page for ``target`` with uvicorn until Ctrl-C (``fusee ui``).

    Args:
        target: The store's data directory.
        host: The address to bind; anything but loopback needs ``token``.
        port: The port (default 8700).
        token: The secret every request must carry (see `create_app`).
        actions: What the page may do to runs (see `create_app`).
        codecs: The payload codecs the workers use (see `create_app`).

    Raises:
        ValueError: ``host`` is not a loopback address and no token is given.
        fusee.StoreError: There is no readable store at ``target``.

    Example:
        >>> serve("./data", host="0.0.0.0")
        Traceback (most recent call last):
        ValueError: fusee ui binds 127.0.0.1 ...
    """
    if not _is_loopback(host) and not token:
        raise ValueError(
            f"fusee ui binds 127.0.0.1 unless it has a token; to serve {host!r}, pass a "
            "token (fusee ui --host HOST --token TOKEN) that every request must then carry"
        )
    import uvicorn

    # The store is checked before the server starts, so a wrong target is one
    # clear error instead of a failed application startup in uvicorn's log.
    asyncio.run(_check(target))
    uvicorn.run(
        create_app(target, token=token, actions=actions, codecs=codecs),
        host=host,
        port=port,
        log_level="info",
        # Event streams never end by themselves: a stop closes them after this.
        timeout_graceful_shutdown=2,
    )


async def _check(target: str) -> None:
    store = open_readonly(target)
    await store.open()
    await store.close()
