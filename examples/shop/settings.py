"""The shop's engine settings, read from the environment: what every process of it shares.

Every process that reads or writes the shop's runs (the workers, the web
front, ``fusee show``) needs the same payload codecs: the journal's payloads
(orders with addresses, charges, invoices) are compressed, then encrypted.

- ``SHOP_KEY`` (64 hex digits, an AES-256 key) or ``SHOP_KEY_FILE`` (a file
  holding them, such as a mounted secret) is the encryption key, named
  ``SHOP_KEY_ID`` (default ``k1``). Without either, the shop uses `DEV_KEY`,
  a key everyone can read in this file: fine for the demo and the tests,
  refused when ``SHOP_ENV=production``.
- ``SHOP_RELEASE`` (a release name or git commit) is the engines' version:
  each order runs to its end on the release it started on (see
  docs/deploys.md). Unset, fusee derives one from the workflows' code.
- ``SHOP_BLOBS`` is the directory large payloads (invoices) go to, shared by
  every worker; by default ``DATA/blobs`` beside an SQLite store.
- Finished runs are deleted `RETENTION` after they end.

The command line takes the codecs from here: ``fusee worker
examples.shop.workflows --codecs examples.shop.settings:codecs``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import fusee
from fusee.blobs import Directory
from fusee.codecs import Encrypt, Zstd

__all__ = [
    "DEV_KEY",
    "OFFLOAD_OVER",
    "RETENTION",
    "blob_store",
    "codecs",
    "engine_options",
    "key",
    "release",
]

# DEVELOPMENT ONLY, NOT A SECRET: the key the demo and the tests encrypt
# with when no SHOP_KEY is set. A store written with it is readable by anyone
# who has this file; production sets SHOP_KEY or SHOP_KEY_FILE.
DEV_KEY = bytes.fromhex("5e11" * 16)

# Finished orders (and their children, their invoices) are deleted this long after they end.
RETENTION = "30d"

# A payload larger than this, once compressed and encrypted, goes to the blob
# store: an invoice PDF does, an order does not.
OFFLOAD_OVER = "256KiB"

log = logging.getLogger("examples.shop")
_warned: list[bool] = []  # once per process


def key() -> tuple[str, bytes]:
    """The encryption key's id and bytes, from ``SHOP_KEY`` or ``SHOP_KEY_FILE`` (else `DEV_KEY`).

    Raises:
        RuntimeError: No key is set and ``SHOP_ENV`` is ``production``, or
            the key is not 64 hex digits.

    Example:
        >>> id, secret = key()
        >>> len(secret)
        32
    """
    text = os.environ.get("SHOP_KEY")
    if text is None and (path := os.environ.get("SHOP_KEY_FILE")):
        text = Path(path).read_text()
    if text is None:
        if os.environ.get("SHOP_ENV") == "production":
            raise RuntimeError("SHOP_ENV=production: set SHOP_KEY or SHOP_KEY_FILE (64 hex digits)")
        if not _warned:
            _warned.append(True)
            log.warning("shop: payloads are encrypted with the development key (set SHOP_KEY)")
        return "dev", DEV_KEY
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) != 32:
        raise RuntimeError("SHOP_KEY (or SHOP_KEY_FILE's content) must be 64 hex digits")
    return os.environ.get("SHOP_KEY_ID", "k1"), secret


def codecs() -> list[fusee.PayloadCodec]:
    """The payload codecs of every shop process: Zstandard, then AES-GCM with `key`.

    Example:
        >>> [c.id for c in codecs()]
        ['zstd', 'aes-gcm']
    """
    id, secret = key()
    return [Zstd(level=3), Encrypt(keys={id: secret}, active=id)]


def release() -> str | None:
    """The engines' version: ``SHOP_RELEASE``, or None (derived from the code).

    Example:
        >>> release() == os.environ.get("SHOP_RELEASE")
        True
    """
    return os.environ.get("SHOP_RELEASE") or None


def blob_store(store: str | os.PathLike[str]) -> Directory | None:
    """Where large payloads go: ``SHOP_BLOBS``, else ``DATA/blobs`` beside an SQLite store.

    None for a Postgres store without ``SHOP_BLOBS``: its payloads stay in
    its journal (up to `fusee.Engine.open`'s ``max_payload``).

    Example:
        >>> isinstance(blob_store("./data"), Directory)
        True
    """
    where = os.environ.get("SHOP_BLOBS")
    if where is None and "://" not in str(store):
        where = str(Path(store) / "blobs")
    return Directory(where) if where is not None else None


def engine_options(store: str | os.PathLike[str]) -> dict[str, Any]:
    """`fusee.Engine.open`'s arguments for the shop's workers on ``store``.

    Example:
        >>> sorted(engine_options("./data"))
        ['blobs', 'codecs', 'offload_over', 'retention', 'version']
    """
    return {
        "codecs": codecs(),
        "blobs": blob_store(store),
        "offload_over": OFFLOAD_OVER,
        "retention": RETENTION,
        "version": release(),
    }
