"""The Postgres store's errors: driver and connection failures as `StoreError`s.

Each message says what happened and what to do.

`PostgresStore` inherits `_PostgresErrors` for the messages that name the
store and its server. The rule: no message, ``repr`` or log line shows the
DSN's password. Every text from the driver goes through `_scrub`, and the
DSN is shown only as `fusee.store._redact.redact_dsn` writes it.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from fusee.errors import StoreError


class _PostgresErrors:
    """The error translation of `PostgresStore` (whose ``__init__`` sets the attributes below)."""

    # The DSN as shown (its password redacted), and the password's spellings.
    _shown: str
    _secrets: tuple[str, ...]

    def _connect_error(self, e: Exception, driver: Any) -> StoreError:
        where = self._where()
        cause = self._scrub(f"{type(e).__name__}: {e}")
        if isinstance(e, driver.InvalidPasswordError):
            text = (
                f"the Postgres server at {where} refused the password ({cause}); "
                f"check the user and password in the DSN {self._shown}"
            )
        elif isinstance(e, driver.InvalidAuthorizationSpecificationError):
            text = (
                f"the Postgres server at {where} refused the connection ({cause}); "
                f"check the user in the DSN {self._shown} and the server's pg_hba.conf"
            )
        elif isinstance(e, driver.InvalidCatalogNameError):
            text = (
                f"the Postgres server at {where} has no such database ({cause}); "
                f"create it (createdb) or fix the database in the DSN {self._shown}"
            )
        elif isinstance(e, OSError | asyncio.TimeoutError | TimeoutError):
            text = (
                f"cannot reach the Postgres server at {where} ({cause}); check that it "
                f"runs and the host and port in the DSN {self._shown}"
            )
        elif isinstance(e, ValueError | driver.ClientConfigurationError | UnicodeError):
            text = (
                f"the DSN {self._shown} is not a valid Postgres URL ({cause}); write it as "
                "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
            )
        else:
            text = f"connecting to the Postgres server at {where} failed ({cause})"
        return StoreError(text)

    def _error(self, e: BaseException, doing: str) -> StoreError:
        if isinstance(e, StoreError):
            return e
        cause = self._scrub(f"{type(e).__name__}: {e}")
        code = getattr(e, "sqlstate", None) or ""
        if code == "23505" and "journal_pkey" in str(e):
            text = (
                f"{self} already holds an LSN being appended: another engine writes the "
                "same shards; only the holder of a shard's lease may write it"
            )
        elif code == "53100":
            text = f"the Postgres server of {self} is out of disk space ({cause}); free some"
        elif code == "25006":
            text = f"{self} cannot be written: the server is read-only ({cause})"
        elif _is_connection_lost(e):
            text = (
                f"{doing} {self} failed: the connection to the server at {self._where()} "
                f"was lost ({cause}); check that the server runs"
            )
        else:
            text = f"{doing} {self} failed ({cause})"
        return StoreError(text)

    def _where(self) -> str:
        parts = urlsplit(self._shown)
        try:
            port = parts.port
        except ValueError:
            port = None
        host = parts.hostname or "localhost"
        return f"{host}:{port or 5432}"

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _import_asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise StoreError(
            "Postgres stores need asyncpg, which is not installed; pip install 'fusee[postgres]'"
        ) from None
    return asyncpg


def _is_connection_lost(e: BaseException) -> bool:
    name = type(e).__name__
    if isinstance(e, OSError | ConnectionError):
        return True
    # asyncpg's: ConnectionDoesNotExistError, ConnectionFailureError,
    # InterfaceError "connection is closed", and the admin-shutdown codes.
    code = getattr(e, "sqlstate", None) or ""
    return (
        code.startswith("08")
        or code in ("57P01", "57P02", "57P03")
        or (name in ("ConnectionDoesNotExistError", "InterfaceError") and "closed" in str(e))
    )


def _fails_every_write(e: BaseException) -> bool:
    """Whether ``e`` comes from the server or the connection, not one write's values."""
    code = getattr(e, "sqlstate", None) or ""
    return _is_connection_lost(e) or code.startswith(("53", "25", "57", "58", "XX"))
