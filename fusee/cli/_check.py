"""``fusee check``: read every row and every record of a store and report the damage.

It finds a store behind its high-water mark (an SQLite store whose
write-ahead log lost acknowledged records), a record that does not decode,
a journal that does not start with its Start, records after a run's Done,
a finished row whose journal has no Done, a row whose journal is missing, a
queued row no queue holds, and a row that cannot be read, each named by its
run. It uses only the `fusee.store.Store` protocol (and a store's
``behind``, where it keeps a mark) and `fusee.record.decode`, so it checks
any store the same way.

The rule: it only reads (the store opened read-only), and one damaged run
never stops the check of the others: each is read on its own, and the
error it raises becomes a finding.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any, Final

from fusee._jsonview import iso
from fusee._status import RunStatus
from fusee.cli._output import Output
from fusee.cli._reading import FINISHED, reading, store_shown
from fusee.errors import CorruptRecord, FuseeError, NotFound, PayloadError, StoreError
from fusee.record import Done, Start, decode
from fusee.store import RunRow, Store

# What reading a damaged row or journal may raise: the store's own errors,
# and the decoders' (msgpack's errors are ValueErrors) where a store lets
# them through.
# A payload the codecs or the blob store cannot give back (a missing blob) is damage too.
_UNREADABLE: Final = (StoreError, PayloadError, ValueError, TypeError)
# Rows are listed a page at a time, so a big store is never in memory at once.
_PAGE: Final = 1000
# Start times a row may hold: SQLite's 64-bit integers.
_EARLIEST_MS: Final = -(2**63)
_LATEST_MS: Final = 2**63 - 1
# Runs whose journal ends with a Done record.
_ENDED: Final = FINISHED | {"continued"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of damage: the run it is in (None when the row itself is unreadable)."""

    id: str | None
    run: int | None
    status: str | None
    problem: str
    lsn: int | None = None


class _SkippedRows(logging.Handler):
    """Collects the rows a store skipped while listing (it logs each, naming the run)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == _SKIPPED and isinstance(record.args, tuple) and record.args:
            self.problems.append(str(record.args[0]))


# How the stores log a damaged row they leave out of a listing.
_SKIPPED: Final = "skipped a damaged run row: %s"


async def _rows(store: Store) -> tuple[list[RunRow], list[Finding]]:
    """Every row the store can read, and a finding for each row or stretch it cannot."""
    skipped = _SkippedRows()
    logger = logging.getLogger("fusee")
    logger.addHandler(skipped)
    try:
        rows, findings = await _listed(store)
    finally:
        logger.removeHandler(skipped)
    for problem in dict.fromkeys(skipped.problems):
        findings.append(Finding(None, None, None, f"a run row cannot be read: {problem}"))
    return rows, findings


async def _listed(store: Store) -> tuple[list[RunRow], list[Finding]]:
    rows: list[RunRow] = []
    after: tuple[int, str] | None = None
    try:
        while True:
            page = await store.list(limit=_PAGE, after=after)
            rows.extend(page)
            if len(page) < _PAGE:
                return rows, []
            after = (page[-1].started_ms, page[-1].id)
    except _UNREADABLE as e:
        # A row that does not read fails the whole listing: find it by
        # halving the start-time range until the failing stretch is one
        # millisecond, and read everything around it.
        findings: list[Finding] = []
        rows = await _rows_between(store, _EARLIEST_MS, _LATEST_MS, findings)
        if not findings:
            # No stretch of start times fails alone: the damage is elsewhere
            # (a start time that is not a number, say).
            findings.append(Finding(None, None, None, f"the rows cannot be listed: {e}"))
        return rows, findings


async def _rows_between(
    store: Store, from_ms: int, to_ms: int, findings: list[Finding]
) -> list[RunRow]:
    try:
        return await store.list(started_from_ms=from_ms, started_to_ms=to_ms)
    except _UNREADABLE as e:
        if from_ms == to_ms:
            return await _rows_around(store, from_ms, e, findings)
    middle = (from_ms + to_ms) // 2
    return [
        *await _rows_between(store, from_ms, middle, findings),
        *await _rows_between(store, middle + 1, to_ms, findings),
    ]


async def _rows_around(
    store: Store, ms: int, error: Exception, findings: list[Finding]
) -> list[RunRow]:
    """The rows started at ``ms`` that read, one at a time from each end up to the damage."""
    ends: list[list[RunRow]] = []
    for newest_first in (False, True):
        rows: list[RunRow] = []
        while True:
            after = (ms, rows[-1].id) if rows else None
            try:
                page = await store.list(
                    started_from_ms=ms,
                    started_to_ms=ms,
                    limit=1,
                    newest_first=newest_first,
                    after=after,
                )
            except _UNREADABLE:
                break
            if not page:
                break
            rows.append(page[0])
        ends.append(rows)
    first, last = ends
    # Rows of one start time come by id: the damaged ones sort between the ends.
    where = [f"after {first[-1].id!r}"] if first else []
    where += [f"before {last[-1].id!r}"] if last else []
    ids = f" (its id sorts {' and '.join(where)})" if where else ""
    text = str(error) or type(error).__name__
    findings.append(
        Finding(None, None, None, f"a row started at {iso(ms)}{ids} cannot be read: {text}")
    )
    seen = {row.id for row in first}
    return [*first, *(row for row in reversed(last) if row.id not in seen)]


async def _check_run(store: Store, row: RunRow) -> tuple[int, list[Finding]]:
    """The number of records of ``row``'s run, and what is damaged in it."""

    def finding(problem: str, lsn: int | None = None) -> Finding:
        return Finding(row.id, row.run, row.status, problem, lsn)

    try:
        entries = await store.load(row.id, row.run)
    except NotFound:
        return 0, [finding("its row is there but its journal is missing (no records)")]
    except CorruptRecord as e:
        return 0, [finding(f"its journal is missing or damaged: {e}")]
    except _UNREADABLE as e:
        return 0, [finding(f"its journal cannot be read: {e}")]
    if not entries:
        return 0, [finding("its row is there but its journal is missing (no records)")]
    found: list[Finding] = []
    done_at: int | None = None
    after_done: list[int] = []
    for i, (lsn, data) in enumerate(entries):
        try:
            rec = decode(data)
        except FuseeError as e:
            found.append(finding(f"the record at LSN {lsn} does not decode: {e}", lsn))
            continue
        if i == 0 and not isinstance(rec, Start):
            found.append(
                finding(
                    f"its journal does not start with Start (LSN {lsn} is {type(rec).__name__})",
                    lsn,
                )
            )
        if done_at is not None:
            after_done.append(lsn)
        elif isinstance(rec, Done):
            done_at = lsn
    if after_done:
        found.append(
            finding(
                f"{len(after_done)} record(s) after its Done (LSN {done_at}): LSN "
                + ", ".join(str(lsn) for lsn in after_done[:10])
                + (", ..." if len(after_done) > 10 else ""),
                after_done[0],
            )
        )
    if row.status in _ENDED and done_at is None:
        found.append(finding(f"its row says {row.status} but its journal has no Done record"))
    return len(entries), found


_BEHIND: Final = "the store is behind its high-water mark"


def _behind_mark(store: Store) -> list[Finding]:
    """A finding if the store holds less than its high-water mark says it made durable."""
    # An SQLite store keeps the mark (`SqliteStore.behind`); the others rely
    # on their database's own log.
    behind: tuple[int, int] | None = getattr(store, "behind", None)
    if behind is None:
        return []
    held, marked = behind
    return [
        Finding(
            None,
            None,
            None,
            f"{_BEHIND}: it acknowledged records through LSN "
            f"{marked} but holds them only through LSN {held} ({marked - held} lost: its "
            "write-ahead log was cut, damaged or deleted); restore it from a backup, or open "
            "it accepting the loss (fusee.Engine.open(..., accept_loss=True))",
        )
    ]


async def check_command(args: argparse.Namespace, out: Output) -> int:
    where = store_shown(args)
    records = 0
    async with reading(args, strict=True) as store:
        rows, findings = await _rows(store)
        findings.extend(_behind_mark(store))
        queued = {i.id for i in await store.queue_items() if i.state == "queued"}
        for row in rows:
            if row.status == RunStatus.QUEUED:
                # No journal until its queue admits it: its queue item stands for it.
                if row.id not in queued:
                    findings.append(
                        Finding(
                            row.id, row.run, row.status, "its row says queued but no queue holds it"
                        )
                    )
                continue
            count, found = await _check_run(store, row)
            records += count
            findings.extend(found)
    damaged = len({(f.id, f.run) if f.id is not None else f.problem for f in findings})
    if out.json:
        report: dict[str, Any] = {
            "store": where,
            "runs": len(rows),
            "records": records,
            "damaged": damaged,
            "findings": [asdict(f) for f in findings],
        }
        out.emit(report)
        return 1 if findings else 0
    for f in findings:
        if f.id is not None:
            run = f"{f.id} (run {f.run}, {f.status})"
        else:
            run = "(the store)" if f.problem.startswith(_BEHIND) else "(unreadable row)"
        out.say(("  damaged  ", "bold red"), f"{run}: {f.problem}")
    if findings:
        out.say(
            (
                f"{where}: {damaged} damaged run(s) or row(s) among {len(rows)} run(s) "
                f"and {records} record(s) read",
                "bold red",
            )
        )
        return 1
    out.say((f"{where}: {len(rows)} run(s) and {records} record(s) read: no damage", "bold green"))
    return 0
