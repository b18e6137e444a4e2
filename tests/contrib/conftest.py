"""Fixtures of the contrib tests: the engine tests' `host`, on every store."""

from __future__ import annotations

from engine.conftest import host, store_kind, stores

__all__ = ["host", "store_kind", "stores"]
