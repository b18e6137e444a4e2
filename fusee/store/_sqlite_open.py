"""Opening an SQLite store's file: looking at it first, creating it whole, checking its format.

Also the translation of `sqlite3` errors into `StoreError`s that say what
to do, and the small connection helpers every part uses. The rule: a file
that may hold runs is never taken for a new store. An empty, foreign,
truncated or headless file is refused with a `StoreError`, changing
nothing, and a new store appears in one step (`_create`) or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Final

from fusee.errors import StoreError
from fusee.store._retention import sqlite_lsn_floor
from fusee.store._sqlite_schema import _MIGRATIONS, _SCHEMA, APPLICATION_ID, FORMAT, PAGE_SIZE

log = logging.getLogger("fusee")

# SQLite primary result codes (the low byte of an extended code).
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _CONSTRAINT, _NOTADB = (
    5, 6, 8, 10, 11, 13, 14, 19, 26,
)  # fmt: skip


def _bind_plainly() -> None:
    """Makes sqlite3 bind ``bytes`` and ``None`` parameters without looking for an adapter.

    sqlite3 binds an int, a float, a str or a bytearray as it is, and sends
    any other value (the journal's ``bytes``, a row's ``None``) through its
    adapter lookup: with no adapter registered for the type, that lookup
    fails on an attribute of a type object, whose error message is formatted
    and thrown away, which costs more than the insert (bench/NOTES.md has
    the figures). An adapter that returns the value as it is makes it one dict
    lookup. Registered for the process (sqlite3's registry is global), and
    only where the type has none: an adapter of the program's own stays.
    """
    if (bytes, sqlite3.PrepareProtocol) not in sqlite3.adapters:
        sqlite3.register_adapter(bytes, bytes)
    if (type(None), sqlite3.PrepareProtocol) not in sqlite3.adapters:
        sqlite3.register_adapter(type(None), _none)


def _none(value: None) -> None:
    return value


def _check_format(conn: sqlite3.Connection, path: Path, *, writer: bool, change: bool) -> bool:
    """Checks that ``conn`` holds a fusee store of this format, or one a writer makes so.

    With ``change``, a writer creates the schema in an empty database and
    upgrades an older format. Returns whether the store is ready: False when
    a writer must create or upgrade it first (only for a writer, without
    ``change``).
    """
    app, version = _header(conn)
    if app == 0 and version == 0:
        _check_empty(conn, path)
        if not writer:
            raise StoreError(
                f"{path} is not a fusee store (an empty database); start an engine "
                "there first or pass --data"
            )
        if not change:
            return False
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created it since we looked.
            app, version = _header(conn)
            if app == 0 and version == 0:
                _check_empty(conn, path)
                for statement in _SCHEMA:
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        app, version = _header(conn)
    if app != APPLICATION_ID:
        raise _foreign(path)
    if version > FORMAT:
        raise StoreError(
            f"store {path} has format {version}, newer than this fusee understands "
            f"({FORMAT}); upgrade fusee"
        )
    if version < FORMAT and not writer:
        raise StoreError(
            f"store {path} has format {version}, older than this fusee's ({FORMAT}); "
            "open it once with an engine (not read-only) to upgrade it"
        )
    if version < FORMAT and not change:
        return False
    while version < FORMAT:
        steps = _MIGRATIONS.get(version)
        if steps is None:
            raise StoreError(
                f"store {path} has format {version}, which this fusee cannot upgrade; "
                "the file may be damaged: restore it from a backup"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in steps:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        version += 1
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
    }
    required = ("journal", "runs", "meta", "commands", "queue_items")
    missing = [name for name in required if name not in tables]
    if missing:
        raise _damaged(
            path,
            f"its {' and '.join(missing)} table{'s are' if len(missing) > 1 else ' is'} missing",
        )
    return True


def _check_empty(conn: sqlite3.Connection, path: Path) -> None:
    """Refuses a database without fusee's marks that is not empty (another's, or damaged)."""
    if conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]:
        raise _foreign(path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    if pages - free > 1:
        # Pages in use that no table owns: not an empty database.
        raise _damaged(path, f"{pages - free - 1} of its pages belong to no table")


def _check_pages(conn: sqlite3.Connection, path: Path) -> None:
    """Reads every page (SQLite's quick_check): for a file shorter than its header says."""
    found = [text for (text,) in conn.execute("PRAGMA quick_check(3)")]
    if found != ["ok"]:
        # Its lines, without the heading SQLite gives them ("*** in database main ***").
        lines = [line for text in found for line in str(text).splitlines()]
        problems = "; ".join(line for line in lines if not line.startswith("***"))
        raise _damaged(path, f"it is shorter than its header says, and pages are lost ({problems})")


_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def _inspect(path: Path) -> bool | None:
    """Looks at the store's files before SQLite does; raises `StoreError` if they are damaged.

    SQLite takes an empty file for a new database (and deletes a WAL beside
    it), so every run would be gone without a word. What fusee leaves is
    either no file at all or a whole database: `_create` makes it in one
    step. So an empty file, one without SQLite's header, or a WAL without
    its database is damage, refused here before SQLite opens anything.

    Returns:
        None when there is no database file (a new store), else whether the
        file is shorter than its header says: after a crash during a
        checkpoint that is repaired from the WAL, so its pages are checked.
    """
    wal = path.with_name(path.name + "-wal")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if _size(wal):
            raise _damaged(
                path,
                f"the database file is missing, but its write-ahead log {wal.name} is there "
                f"({_size(wal):,} bytes of recent writes)",
            ) from None
        return None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}; check its permissions") from e
    if size == 0:
        beside = f", beside a write-ahead log of {_size(wal):,} bytes" if _size(wal) else ""
        raise _damaged(path, f"it is empty (0 bytes){beside}")
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}; check its permissions") from e
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise _not_a_database(path)
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise _damaged(path, f"its header gives a page size of {page_size}")
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count holds only when it was written with the change
    # counter (bytes 24-27 equal bytes 92-95); SQLite then relies on it.
    counted = header[24:28] == header[92:96] and pages > 0
    return size % page_size != 0 or (counted and size < pages * page_size)


def _size(path: Path) -> int:
    """A file's size, 0 when it is missing."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _create(path: Path, *, fsync: bool) -> None:
    """Creates a store at ``path`` in one step: a whole database appears, or nothing.

    Built beside it under a temporary name, then linked into place, which
    fails if another process made one meanwhile (that one is used). A crash
    leaves no file, or a whole store: never an empty file, which `_inspect`
    takes for damage.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'OFF'}")
                # The default, stated: `_lock` on Windows relies on pages this large.
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
                # Kept in the file's header: every later connection uses the WAL.
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise _store_error(e, path, "creating") from e
        try:
            if fsync:
                with tmp.open("rb") as f:
                    os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return  # made by another process meanwhile: that one is the store
            if fsync and sys.platform != "win32":
                # The new name is durable once its directory is (POSIX).
                dir_fd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as e:
            raise StoreError(
                f"cannot create {path}: {e.strerror}; check the directory's permissions and "
                "that its file system supports hard links"
            ) from e
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _not_a_database(path: Path) -> StoreError:
    return StoreError(
        f"{path} is not an SQLite database (it does not start with SQLite's header): if it "
        "was a fusee store it is damaged; restore it from a backup, or move it aside to "
        "start an empty store there"
    )


def _header(conn: sqlite3.Connection) -> tuple[int, int]:
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return int(app), int(version)


def _foreign(path: Path) -> StoreError:
    return StoreError(
        f"{path} is an SQLite database but not a fusee store; move it away or pass "
        "another directory"
    )


def _counters(conn: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Returns the highest LSN stored and the reserved run-number count."""
    last_lsn = conn.execute("SELECT coalesce(max(lsn), 0) FROM journal").fetchone()[0]
    if type(last_lsn) is int:
        # Runs deleted (`Store.delete_runs`) may have held the highest LSNs.
        last_lsn = max(last_lsn, sqlite_lsn_floor(conn))
    found = conn.execute("SELECT value FROM meta WHERE key = 'run_reserved'").fetchone()
    if found is None or type(found[0]) is not int or type(last_lsn) is not int:
        what = (
            "its meta table has no 'run_reserved' row (the count of run numbers handed out)"
            if found is None or type(found[0]) is not int
            else f"its highest LSN reads as {last_lsn!r}"
        )
        raise _damaged(path, what)
    return last_lsn, found[0]


def _damaged(path: Path, what: str) -> StoreError:
    """The error for a store file that must not be used as it is: no run may be lost silently."""
    return StoreError(
        f"{path} is damaged: {what}; restore it (with any {path.name}-wal beside it) from a "
        "backup, or move them aside to start an empty store there"
    )


def _code(e: BaseException) -> int:
    """The SQLite primary result code of ``e``, 0 when it has none."""
    return (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF


def _fails_every_write(e: Exception) -> bool:
    """Whether ``e`` comes from the database's state, not from one write's values.

    Retrying such a transaction's writes one by one would only fail each again
    (and wait out a lock once per write).
    """
    return _code(e) in (_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB)


def _store_error(e: sqlite3.Error, path: Path, doing: str) -> StoreError:
    code = _code(e)
    if code in (_BUSY, _LOCKED):
        text = (
            f"another process holds the store {path} (it stayed locked past the busy "
            "timeout); stop that process, or give this one another directory"
        )
    elif code == _FULL:
        text = (
            f"the disk holding {path} is full: nothing of this write was stored; free some "
            "space (the store takes writes again as soon as there is room)"
        )
    elif code == _READONLY:
        text = f"{path} cannot be written (read-only file or file system); check its permissions"
    elif code == _NOTADB:
        return _not_a_database(path)
    elif code == _CORRUPT:
        text = f"{path} is damaged ({e}); restore it from a backup"
    elif code == _CONSTRAINT and "journal.lsn" in str(e):
        text = (
            f"{path} already holds an LSN being appended: another process writes this "
            "store; only one engine may write a store directory"
        )
    elif code in (_CANTOPEN, _IOERR):
        text = f"{doing} {path} failed ({e}); check the path, its permissions and the disk"
    else:
        text = f"{doing} {path} failed: {e}"
    return StoreError(text)


def _end_read(conn: sqlite3.Connection) -> None:
    """Ends a read's snapshot (a read changes nothing: rolling back is ending)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _roll_back(conn: sqlite3.Connection) -> None:
    """Rolls back a failed transaction; the error that got here is the one to report."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _close(conn: sqlite3.Connection, path: Path) -> None:
    """Closes a connection; a failure is logged, as nothing is left to tell."""
    try:
        conn.close()
    except sqlite3.Error as e:
        log.warning("closing %s failed: %s", path, e)
