"""Reading an SQLite store's rows: journal records, ``runs`` rows, and the checks for damage.

The rule: a damaged record is the one run's problem. Reading it raises
`CorruptRecord` naming that run; a listing skips it (logged on the
``fusee`` logger) and `fusee check` reports it, so one damaged row never
hides the others.
"""

from __future__ import annotations

import builtins
import functools
import logging
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

import msgpack

from fusee._status import RunStatus
from fusee.errors import CorruptRecord, FuseeError
from fusee.store._base import (
    RUN_STATUSES,
    UNFINISHED_STATUSES,
    RunRow,
    _matches,
    _not_found,
    _queued,
    _unpack_attributes,
)
from fusee.store._sqlite_open import _store_error
from fusee.store._sqlite_schema import _ROW_COLUMNS

log = logging.getLogger("fusee")

_SqlRow: TypeAlias = tuple[Any, ...]
_Loaded: TypeAlias = builtins.list[tuple[int, bytes]]

# Rows per multi-row INSERT: 4, 9 or 13 parameters each, under SQLite's limit
# of 32,766 parameters per statement.
_ROWS_PER_INSERT: Final = 2048


def _insert_all(
    conn: sqlite3.Connection, insert: str, rows: Sequence[_SqlRow], tail: str = ""
) -> None:
    """Inserts ``rows`` with ``insert`` (a statement up to its VALUES), a few statements in all.

    ``tail`` ends each statement (an upsert's ``ON CONFLICT`` clause).

    Why not executemany: the writer thread takes the GIL back after every
    row's statement, and while the event loop's thread runs workflow code it
    gets it only after waiting out the switch interval: a batch of 200 rows
    took milliseconds and slowed the loop down. One statement per 2,048 rows
    takes it back once.
    """
    if not rows:
        return
    if len(rows) == 1:  # a sequential step's lone record
        conn.execute(_statement(insert, 1, len(rows[0]), tail), rows[0])
        return
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        conn.execute(
            _statement(insert, len(chunk), len(chunk[0]), tail), [v for r in chunk for v in r]
        )


# As many as sqlite3's own cache of prepared statements, which keys them by
# these very strings.
@functools.lru_cache(maxsize=128)
def _statement(insert: str, count: int, width: int, tail: str) -> str:
    """``insert`` completed for ``count`` rows of ``width`` values: built once per shape."""
    values = f"({', '.join('?' * width)})"
    return f"{insert} {', '.join([values] * count)}{tail}"


def _no_journal(id: str, run: int, path: Path) -> CorruptRecord:
    return CorruptRecord(
        f"run {id!r} (run {run}) has a row in {path} but no journal records: its journal is "
        "lost or damaged; the other runs are not affected (`fusee check` lists every damaged "
        f"run): restore {path} from a backup to read this one again"
    )


def _read_many(
    conn: sqlite3.Connection, fns: builtins.list[Callable[[sqlite3.Connection], Any]], path: Path
) -> builtins.list[Any]:
    """Each read's result, or the error it raised: one read's damage is its own."""
    conn.execute("BEGIN")  # one snapshot for every query below
    results: builtins.list[Any] = []
    for fn in fns:
        try:
            results.append(fn(conn))
        except FuseeError as e:  # NotFound, CorruptRecord
            results.append(e)
        except sqlite3.Error as e:
            error = _store_error(e, path, "reading")
            error.__cause__ = e
            results.append(error)
    return results


def _load(
    conn: sqlite3.Connection, id: str, run: int | None, after_lsn: int, path: Path
) -> _Loaded:
    found = conn.execute("SELECT run, status FROM runs WHERE id = ?", (id,)).fetchone()
    row_run: int | None = found[0] if found is not None else None
    if run is None:
        run = row_run
        if run is None:
            run = conn.execute("SELECT max(run) FROM journal WHERE id = ?", (id,)).fetchone()[0]
            if run is None:
                raise _not_found(id)
    records: builtins.list[tuple[int, bytes]] = conn.execute(
        "SELECT lsn, data FROM journal WHERE id = ? AND run = ? AND lsn > ? ORDER BY lsn",
        (id, run, after_lsn),
    ).fetchall()
    if not records:
        # Nothing after ``after_lsn`` is an answer; nothing at all is not.
        has_run = (
            after_lsn > 0
            and conn.execute(
                "SELECT 1 FROM journal WHERE id = ? AND run = ? LIMIT 1", (id, run)
            ).fetchone()
        )
        if not has_run:
            if run == row_run and found[1] == RunStatus.QUEUED:
                raise _queued(id)
            if run == row_run:
                raise _no_journal(id, run, path)
            known = (
                row_run is not None
                or conn.execute("SELECT 1 FROM journal WHERE id = ? LIMIT 1", (id,)).fetchone()
            )
            raise _not_found(id, run if known else None)
    for lsn, data in records:
        if type(data) is not bytes:
            raise CorruptRecord(
                f"the journal of run {id!r} (run {run}) in {path} has a damaged record at LSN "
                f"{lsn}: it holds {type(data).__name__}, not bytes; the other runs are not "
                f"affected (`fusee check` lists every damaged run): restore {path} from a "
                "backup to read this one again"
            )
    return records


def _row(values: _SqlRow, path: Path) -> RunRow:
    """The `RunRow` of a ``runs`` row; raises `CorruptRecord` naming the run if it is damaged."""
    id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent = values[:9]
    version, error = values[9:]
    problem = _row_problem(values)
    if problem is None:
        try:
            return RunRow(
                id,
                run,
                workflow,
                status,
                started_ms,
                finished_ms,
                wake_ms,
                _unpack_attributes(attributes),
                parent,
                version,
                error,
            )
        except (msgpack.UnpackException, ValueError, TypeError) as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            problem = f"its search attributes do not decode ({why})"
    raise CorruptRecord(
        f"the row of run {id!r} (run {run!r}) in {path} is damaged: {problem}; the other runs "
        f"are not affected (`fusee check` lists every damaged run): restore {path} from a "
        "backup to read this one again"
    )


# What each column of a `runs` row holds, in `_ROW_COLUMNS` order (None: may be NULL).
_COLUMN_TYPES: Final = (
    ("id", str, False),
    ("run", int, False),
    ("workflow", str, False),
    ("status", str, False),
    ("started_ms", int, False),
    ("finished_ms", int, True),
    ("wake_ms", int, True),
    ("attributes", bytes, True),
    ("parent", str, True),
    ("version", str, False),
    ("error", str, True),
)


def _row_problem(values: _SqlRow) -> str | None:
    for (name, kind, nullable), value in zip(_COLUMN_TYPES, values, strict=True):
        if type(value) is not kind and not (nullable and value is None):
            return f"its {name} is {value!r}, which fusee never writes there"
    status = values[3]
    if status not in RUN_STATUSES:
        return f"its status {status!r} is not one of {', '.join(sorted(RUN_STATUSES))}"
    return None


def _rows(
    conn: sqlite3.Connection, sql: str, params: Sequence[object], path: Path
) -> Iterator[RunRow]:
    """The rows ``sql`` selects, without the damaged ones: a listing must not die of one row.

    Each damaged row skipped is logged (a warning on the ``fusee`` logger,
    naming the run); `fusee check` reports them all.
    """
    for values in conn.execute(sql, params):
        try:
            yield _row(values, path)
        except CorruptRecord as e:
            log.warning("skipped a damaged run row: %s", e)


def _get(conn: sqlite3.Connection, id: str, path: Path) -> RunRow | None:
    found = conn.execute(f"SELECT {_ROW_COLUMNS} FROM runs WHERE id = ?", (id,)).fetchone()
    return None if found is None else _row(found, path)


def _list(
    conn: sqlite3.Connection,
    status: str | None,
    workflow: str | None,
    attributes: Mapping[str, Any] | None,
    limit: int | None,
    page: _Page,
    path: Path,
) -> builtins.list[RunRow]:
    where: builtins.list[str] = []
    params: builtins.list[object] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if workflow is not None:
        where.append("workflow = ?")
        params.append(workflow)
    if page.after is not None:
        where.append(f"(started_ms, id) {'<' if page.newest_first else '>'} (?, ?)")
        params.extend(page.after)
    if page.started_from_ms is not None:
        where.append("started_ms >= ?")
        params.append(page.started_from_ms)
    if page.started_to_ms is not None:
        where.append("started_ms <= ?")
        params.append(page.started_to_ms)
    sql = f"SELECT {_ROW_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY started_ms DESC, id DESC" if page.newest_first else " ORDER BY started_ms, id"
    rows: builtins.list[RunRow] = []
    if limit == 0:
        return rows
    # No LIMIT in the SQL: a damaged row skipped, or one the attributes (msgpack
    # blobs SQLite cannot look into) do not match, does not count. The rows are
    # stepped through lazily, so no more are read than the page needs.
    for row in _rows(conn, sql, params, path):
        if attributes is None or _matches(row, attributes):
            rows.append(row)
            if len(rows) == limit:
                break
    return rows


@dataclass(frozen=True, slots=True)
class _Page:
    """A listing's order, cursor and start-time bounds (`SqliteStore.list`)."""

    newest_first: bool
    after: tuple[int, str] | None
    started_from_ms: int | None
    started_to_ms: int | None


def _unfinished(conn: sqlite3.Connection, path: Path) -> builtins.list[RunRow]:
    marks = ", ".join("?" * len(UNFINISHED_STATUSES))
    sql = f"SELECT {_ROW_COLUMNS} FROM runs WHERE status IN ({marks}) ORDER BY started_ms, id"
    return builtins.list(_rows(conn, sql, sorted(UNFINISHED_STATUSES), path))
