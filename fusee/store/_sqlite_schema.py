"""The SQLite store's schema: its format number, the statements that create it, and the migrations.

`fusee.store.sqlite` documents the tables. The rule: a change to the schema
is a new `FORMAT` with its upgrade in `_MIGRATIONS` (statements that take
format N to N + 1), so a store written by an older fusee opens and upgrades;
`_SCHEMA` always creates the newest format whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from fusee.store._sqlite_schedules import SCHEDULES_FORMAT_4, SCHEDULES_SCHEMA

FILENAME: Final = "fusee.db"
"""The store's file in its directory (SQLite adds ``-wal`` and ``-shm`` beside it)."""

FORMAT: Final = 5
"""The schema format this fusee writes; an older one is upgraded on open."""

APPLICATION_ID: Final = 0x66757365
"""``PRAGMA application_id`` of a fusee store ("fuse"): tells it from other databases."""

PAGE_SIZE: Final = 4096
"""The page size of the stores fusee creates."""

_COMMANDS_SCHEMA: Final = (
    "CREATE TABLE commands (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " kind TEXT NOT NULL, run_id TEXT NOT NULL, payload BLOB NOT NULL, dedup TEXT,"
    " created_ms INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, answered_ms INTEGER,"
    " ok INTEGER, answer BLOB)",
    "CREATE INDEX commands_open ON commands (seq) WHERE answered_ms IS NULL",
    "CREATE INDEX commands_answered ON commands (answered_ms) WHERE answered_ms IS NOT NULL",
)

_QUEUES_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS queue_items (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " queue TEXT NOT NULL, id TEXT NOT NULL, run INTEGER NOT NULL, workflow TEXT NOT NULL,"
    " input BLOB NOT NULL, key TEXT, priority INTEGER NOT NULL, not_before_ms INTEGER NOT NULL,"
    " state TEXT NOT NULL, admitted_ms INTEGER, origin BLOB NOT NULL, signals BLOB)",
    "CREATE INDEX IF NOT EXISTS queue_items_by_queue ON queue_items (queue, state)",
    # One queued or admitted item per run id: a second enqueue of it fails.
    "CREATE UNIQUE INDEX IF NOT EXISTS queue_items_active ON queue_items (id)"
    " WHERE state != 'done'",
)

# Format 4: the version of the engine each run started on.
_RUNS_FORMAT_4: Final = ("ALTER TABLE runs ADD COLUMN version TEXT NOT NULL DEFAULT ''",)

# Format 5: the error of a run paused by a bug in its code, for every process to show.
_RUNS_FORMAT_5: Final = ("ALTER TABLE runs ADD COLUMN error TEXT",)

_SCHEMA: Final = (
    "CREATE TABLE journal (lsn INTEGER PRIMARY KEY, id TEXT NOT NULL,"
    " run INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX journal_by_run ON journal (id, run, lsn)",
    "CREATE TABLE runs (id TEXT PRIMARY KEY, run INTEGER NOT NULL, workflow TEXT NOT NULL,"
    " status TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER,"
    " wake_ms INTEGER, attributes BLOB, parent TEXT)",
    "CREATE INDEX runs_by_start ON runs (started_ms, id)",
    "CREATE INDEX runs_by_status ON runs (status, started_ms, id)",
    "CREATE INDEX runs_by_workflow ON runs (workflow, started_ms, id)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO meta VALUES ('run_reserved', 0)",
    *_COMMANDS_SCHEMA,
    *_QUEUES_SCHEMA,
    *SCHEDULES_SCHEMA,
    *SCHEDULES_FORMAT_4,
    *_RUNS_FORMAT_4,
    *_RUNS_FORMAT_5,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {FORMAT}",
)

# Statements that upgrade format N to N + 1, keyed by N: format 2 adds the
# commands inbox, format 3 the queue items and the schedules, format 4 the
# schedules made at run time and their last tick, and each run's version,
# format 5 the error of a run paused by a bug.
_MIGRATIONS: Final[Mapping[int, tuple[str, ...]]] = {
    1: _COMMANDS_SCHEMA,
    2: (*_QUEUES_SCHEMA, *SCHEDULES_SCHEMA),
    3: (*SCHEDULES_FORMAT_4, *_RUNS_FORMAT_4),
    4: _RUNS_FORMAT_5,
}

_COMMAND_COLUMNS: Final = "id, kind, run_id, payload, dedup, created_ms, attempts"
_INSERT_COMMAND: Final = (
    f"INSERT OR IGNORE INTO commands ({_COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0)"
)

_ROW_COLUMNS: Final = (
    "id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent, version,"
    " error"
)
# Statements `_insert_all` completes with one "(?, ...)" per row.
_INSERT_ENTRIES: Final = "INSERT INTO journal (lsn, id, run, data) VALUES"
_UPSERT_ROWS: Final = f"INSERT OR REPLACE INTO runs ({_ROW_COLUMNS}) VALUES"
_SET_RESERVED: Final = "UPDATE meta SET value = ? WHERE key = 'run_reserved'"
