"""The SQLite store's high-water mark: the last LSN it made durable, in a file beside it.

SQLite opens a database whose write-ahead log lost its tail (a truncated or
corrupted WAL: frames whose checksums fail are dropped; a WAL deleted with
its -shm) without an error, and the records it acknowledged there are gone.
The store keeps its own account: ``fusee.db.hwm`` holds the store's identity
(a random number in its ``meta`` table) and the highest LSN a durable commit
holds, and an open that finds the database behind it refuses it
(`behind_error`), unless told to accept the loss.

The rule: the mark moves only after the commit holding its LSN is durable
(SQLite fsyncs the WAL in COMMIT), so it may lag after a power loss (it is
written without an fsync of its own: no false alarm), and never leads. Damage
while the process is gone (the WAL cut, bytes flipped, files deleted) finds
the mark intact: the page cache holds it even if the disk does not yet. A
store with ``durability="none"`` acknowledges nothing durable: it keeps no
mark.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import sqlite3
import struct
import time
import zlib
from pathlib import Path
from typing import Final

from fusee.errors import StoreError

__all__ = [
    "MARK_SUFFIX",
    "Mark",
    "behind_error",
    "mark_path",
    "read_mark",
    "read_store_id",
    "start_mark",
]

MARK_SUFFIX: Final = ".hwm"
# Magic, store identity, LSN, then a CRC-32 of those: a torn or foreign file reads as none.
_LAYOUT: Final = struct.Struct("<4sqQ")
_MAGIC: Final = b"FHW1"
_SIZE: Final = _LAYOUT.size + 4


def mark_path(db: Path) -> Path:
    """The mark file of database ``db``: ``fusee.db.hwm`` beside it.

    Example:
        >>> mark_path(Path("data/fusee.db")).as_posix()
        'data/fusee.db.hwm'
    """
    return db.with_name(db.name + MARK_SUFFIX)


def _pack(store_id: int, lsn: int) -> bytes:
    body = _LAYOUT.pack(_MAGIC, store_id, lsn)
    return body + struct.pack("<I", zlib.crc32(body))


def read_mark(db: Path) -> tuple[int, int] | None:
    """The mark beside database ``db``: (store identity, LSN), or None if none reads.

    Example:
        >>> read_mark(Path("no-such-dir/fusee.db")) is None
        True
    """
    try:
        data = mark_path(db).read_bytes()
    except OSError:
        return None
    if len(data) != _SIZE or struct.unpack("<I", data[-4:])[0] != zlib.crc32(data[:-4]):
        return None
    magic, store_id, lsn = _LAYOUT.unpack(data[:-4])
    if magic != _MAGIC:
        return None
    return store_id, lsn


def behind_error(db: Path, held: int, marked: int) -> StoreError:
    """The error of a store that holds records through LSN ``held`` and acknowledged ``marked``.

    Example:
        >>> "records 8 to 10" in str(behind_error(Path("d/fusee.db"), 7, 10))
        True
    """
    lost = marked - held
    return StoreError(
        f"{db} is behind its high-water mark: it acknowledged records through LSN {marked} "
        f"but holds them only through LSN {held}, so {lost} acknowledged record(s) are lost "
        f"(records {held + 1} to {marked}: the runs they belong to lost their latest steps, "
        f"signals or ends, or their start); its write-ahead log {db.name}-wal was cut, "
        "damaged or deleted after they were made durable. Restore the store from a backup "
        f"(and delete {mark_path(db).name}, the mark of the damaged store), or open it "
        "accepting the loss: fusee.Engine.open(..., accept_loss=True), which logs the loss "
        "and records it in the store"
    )


def read_store_id(conn: sqlite3.Connection) -> int | None:
    """The store's identity, from its ``meta`` table (None: a store that has none yet)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
    return None if row is None else int(row[0])


def start_mark(conn: sqlite3.Connection, db: Path, lsn: int, loss: tuple[int, int] | None) -> Mark:
    """Gives the store an identity if it has none, records an accepted ``loss``, opens its mark.

    Called by the writer's connection at open, with ``lsn`` the store's last.
    """
    store_id = read_store_id(conn)
    if store_id is None or loss is not None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if store_id is None:
                store_id = secrets.randbits(62)
                conn.execute("INSERT INTO meta VALUES ('store_id', ?)", (store_id,))
            if loss is not None:
                # The last loss accepted: what it held, what it had acknowledged, when.
                held, marked = loss
                for key, value in (
                    ("loss_accepted_held_lsn", held),
                    ("loss_accepted_marked_lsn", marked),
                    ("loss_accepted_ms", time.time_ns() // 1_000_000),
                ):
                    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        # Into the database file: an identity in the WAL alone would go with it.
        conn.execute("PRAGMA wal_checkpoint(FULL)")
    return Mark(db, store_id=store_id, lsn=lsn)


class Mark:
    """The open mark file of a store: `move` records a durable LSN in its shared mapping.

    A store to a shared mapping is the cheapest write there is (no system
    call), and it dirties no inode: a ``pwrite`` would change the file's
    mtime each time, which the next commit's fsync (of the WAL) must then
    journal on many file systems. The page cache holds the mark as soon as
    it is stored, for any process that reads the file.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     db = Path(d) / "fusee.db"
        ...     mark = Mark(db, store_id=7, lsn=3)
        ...     mark.move(5)
        ...     mark.close()
        ...     read_mark(db)
        (7, 5)
    """

    __slots__ = ("_map", "_store_id", "lsn")

    def __init__(self, db: Path, *, store_id: int, lsn: int) -> None:
        self._store_id = store_id
        self.lsn = lsn
        try:
            fd = os.open(mark_path(db), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, _SIZE)
                self._map: mmap.mmap | None = mmap.mmap(fd, _SIZE)
            finally:
                os.close(fd)
        except OSError as e:
            raise StoreError(
                f"cannot write {mark_path(db)}, the store's high-water mark: {e.strerror}; "
                "give the process write access to the store's directory"
            ) from e
        self._map[:] = _pack(store_id, lsn)

    def move(self, lsn: int) -> None:
        """Records that the store holds ``lsn`` durably (called after the commit's fsync)."""
        if lsn > self.lsn and self._map is not None:
            self.lsn = lsn
            # Within one page: it never tears in the page cache.
            self._map[:] = _pack(self._store_id, lsn)

    def close(self) -> None:
        """Unmaps the file (the mark stays)."""
        m, self._map = self._map, None
        if m is not None:
            m.close()
