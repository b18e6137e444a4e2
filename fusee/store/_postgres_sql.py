"""The Postgres store's SQL: its format, the statements that create and upgrade it, every query.

The schema's name is spliced into the statements (`_Sql` builds them once
per store), so the rule: a schema name is only ever one `_SCHEMA_NAME`
matches (checked when the store is made), and every value goes in as a
``$n`` parameter, never into the text. A change to the schema is a new
`FORMAT` with its upgrade in `_MIGRATIONS`.

`shard_of` is here too: the shard column of a journal record, the engine's rule.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from fusee.store._base import UNFINISHED_STATUSES, RunRow, _unpack_attributes
from fusee.store._postgres_schedules import schedules_format_4_sql, schedules_sql

FORMAT: Final = 5
"""The schema format this fusee writes; an older one is upgraded on open."""

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


_ROW_COLUMNS: Final = (
    "id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent, version,"
    " error"
)


def shard_of(id: str, shards: int) -> int:
    """The shard of workflow ``id`` in a store of ``shards`` shards (the engine's rule).

    Example:
        >>> shard_of("order-1", 64)
        47
    """
    return zlib.crc32(id.encode()) % shards


def _channel(schema: str) -> str:
    """The ``LISTEN``/``NOTIFY`` channel of a store's commands (63 bytes at most)."""
    return f"fusee_commands_{schema}"[:63]


def _answers_channel(schema: str) -> str:
    """The ``LISTEN``/``NOTIFY`` channel of a store's answers (63 bytes at most)."""
    return f"fusee_answers_{schema}"[:63]


# The longest list of answered ids a notification carries (a payload is
# under 8,000 bytes); a longer one is sent empty: "look for all of yours".
_NOTIFY_IDS_MAX: Final = 7_500


def _schema_sql(s: str, shards: int) -> tuple[str, ...]:
    unfinished = ", ".join(f"'{status}'" for status in sorted(UNFINISHED_STATUSES))
    return (
        f"CREATE TABLE {s}.meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        f"CREATE TABLE {s}.journal (shard INT NOT NULL, lsn BIGINT NOT NULL,"
        ' id TEXT COLLATE "C" NOT NULL, run BIGINT NOT NULL, data BYTEA NOT NULL,'
        " PRIMARY KEY (shard, lsn))",
        f"CREATE INDEX journal_by_run ON {s}.journal (id, run, lsn)",
        f'CREATE TABLE {s}.runs (id TEXT COLLATE "C" PRIMARY KEY, shard INT NOT NULL,'
        " run BIGINT NOT NULL, workflow TEXT NOT NULL, status TEXT NOT NULL,"
        " started_ms BIGINT NOT NULL, finished_ms BIGINT, wake_ms BIGINT,"
        " attributes BYTEA, parent TEXT)",
        f"CREATE INDEX runs_by_start ON {s}.runs (started_ms, id)",
        f"CREATE INDEX runs_by_status ON {s}.runs (status, started_ms, id)",
        f"CREATE INDEX runs_by_workflow ON {s}.runs (workflow, started_ms, id)",
        f"CREATE INDEX runs_unfinished ON {s}.runs (shard) WHERE status IN ({unfinished})",
        f"CREATE TABLE {s}.shard_leases (shard INT PRIMARY KEY, owner TEXT,"
        " epoch BIGINT NOT NULL, lease_until TIMESTAMPTZ NOT NULL)",
        f"INSERT INTO {s}.shard_leases SELECT n, NULL, 0, '-infinity'"
        f" FROM generate_series(0, {shards - 1}) AS n",
        f"INSERT INTO {s}.meta VALUES ('format', {FORMAT}), ('shards', {shards}),"
        " ('run_reserved', 0)",
        *_commands_sql(s),
        *_workers_sql(s),
        *queues_sql(s),
        *schedules_sql(s),
        *schedules_format_4_sql(s),
        *_runs_format_4_sql(s),
        *_runs_format_5_sql(s),
        *_lanes_sql(s),
    )


def _commands_sql(s: str) -> tuple[str, ...]:
    return (
        f"CREATE TABLE {s}.commands (seq BIGSERIAL NOT NULL, id TEXT PRIMARY KEY,"
        " kind TEXT NOT NULL, run_id TEXT NOT NULL, payload BYTEA NOT NULL, dedup TEXT,"
        " created_ms BIGINT NOT NULL, attempts INT NOT NULL DEFAULT 0, answered_ms BIGINT,"
        " ok BOOLEAN, answer BYTEA)",
        f"CREATE INDEX commands_open ON {s}.commands (seq) WHERE answered_ms IS NULL",
        f"CREATE INDEX commands_answered ON {s}.commands (answered_ms)"
        " WHERE answered_ms IS NOT NULL",
    )


def _workers_sql(s: str) -> tuple[str, ...]:
    # A command's shard routes it to the worker holding that shard; commands
    # posted before format 3 have none, and any worker takes them.
    return (
        f"ALTER TABLE {s}.commands ADD COLUMN IF NOT EXISTS shard INT",
        f"CREATE TABLE IF NOT EXISTS {s}.workers (owner TEXT PRIMARY KEY,"
        " lease_until TIMESTAMPTZ NOT NULL)",
    )


def queues_sql(s: str) -> tuple[str, ...]:
    """The statements that add the queue tables to schema ``s`` (format 3; safe to repeat).

    Example:
        >>> queues_sql('"fusee"')[0].split("(")[0]
        'CREATE TABLE IF NOT EXISTS "fusee".queues '
    """
    return (
        f"CREATE TABLE IF NOT EXISTS {s}.queues (name TEXT PRIMARY KEY)",
        f"CREATE TABLE IF NOT EXISTS {s}.queue_items (seq BIGSERIAL PRIMARY KEY,"
        ' queue TEXT NOT NULL, id TEXT COLLATE "C" NOT NULL, run BIGINT NOT NULL,'
        " workflow TEXT NOT NULL, input BYTEA NOT NULL, key TEXT, priority INT NOT NULL,"
        " not_before_ms BIGINT NOT NULL, state TEXT NOT NULL, admitted_ms BIGINT,"
        " origin BYTEA NOT NULL, signals BYTEA[] NOT NULL DEFAULT '{}')",
        f"CREATE INDEX IF NOT EXISTS queue_items_by_queue ON {s}.queue_items"
        " (queue, state, priority, seq)",
        # One queued or admitted item per run id: a second enqueue of it conflicts.
        f"CREATE UNIQUE INDEX IF NOT EXISTS queue_items_active ON {s}.queue_items (id)"
        " WHERE state <> 'done'",
    )


# Statements that upgrade format N to N + 1, keyed by N (each takes the quoted
# schema): format 2 adds the commands inbox, format 3 the workers, each
# command's shard, the queue tables and the schedules, format 4 the schedules
# made at run time and their last tick, and the version of each run and worker,
# format 5 the error of a run paused by a bug and the lanes of versions.
def _format_3_sql(s: str) -> tuple[str, ...]:
    return (*_workers_sql(s), *queues_sql(s), *schedules_sql(s))


def _runs_format_4_sql(s: str) -> tuple[str, ...]:
    # The version of the engine each run started on; the version each worker runs.
    return (
        f"ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS version TEXT NOT NULL DEFAULT ''",
        f"ALTER TABLE {s}.workers ADD COLUMN IF NOT EXISTS version TEXT NOT NULL DEFAULT ''",
    )


def _format_4_sql(s: str) -> tuple[str, ...]:
    return (*schedules_format_4_sql(s), *_runs_format_4_sql(s))


def _runs_format_5_sql(s: str) -> tuple[str, ...]:
    # The error of a run paused by a bug in its code, for every process to show.
    return (f"ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS error TEXT",)


def _format_5_sql(s: str) -> tuple[str, ...]:
    return (*_runs_format_5_sql(s), *_lanes_sql(s))


def _lanes_sql(s: str) -> tuple[str, ...]:
    # Format 5: a lane per engine version given to a worker (lane 0: workers
    # that pin no version, and runs of versions no such worker gave). Lane k
    # leases its own copy of the shards, slots k * shards to k * shards +
    # shards - 1 of shard_leases, and writes its records under them.
    # `lane_for` says which lane a command goes to: ``wanted`` when >= 0;
    # with -1, the newest lane that has a live worker (a client's start);
    # with NULL, the lane serving run ``run_id``: its version's, while that
    # lane has a live worker, else the newest lane that has one.
    return (
        f"CREATE TABLE IF NOT EXISTS {s}.versions (version TEXT PRIMARY KEY,"
        " lane INT NOT NULL UNIQUE)",
        f"CREATE OR REPLACE FUNCTION {s}.lane_for(run_id TEXT, wanted INT) RETURNS INT"
        " LANGUAGE sql STABLE AS $$"
        " WITH live AS (SELECT DISTINCT coalesce(v.lane, 0) AS lane"
        f" FROM {s}.workers AS w LEFT JOIN {s}.versions AS v ON v.version = w.version"
        " WHERE w.lease_until >= now()),"
        f" own AS (SELECT coalesce((SELECT v.lane FROM {s}.runs AS r JOIN {s}.versions AS v"
        " ON v.version = r.version WHERE r.id = run_id), 0) AS lane)"
        " SELECT CASE WHEN wanted >= 0 THEN wanted"
        " WHEN wanted = -1 THEN coalesce((SELECT max(lane) FROM live), 0)"
        " WHEN own.lane IN (SELECT lane FROM live) THEN own.lane"
        " ELSE coalesce((SELECT max(lane) FROM live), own.lane) END FROM own $$",
    )


_MIGRATIONS: Final[Mapping[int, Callable[[str], tuple[str, ...]]]] = {
    1: _commands_sql,
    2: _format_3_sql,
    3: _format_4_sql,
    4: _format_5_sql,
}

_COMMAND_COLUMNS: Final = "id, kind, run_id, payload, dedup, created_ms, attempts"
_POSTED_COLUMNS: Final = f"{_COMMAND_COLUMNS}, shard"


class _Sql:
    """The store's statements, with its schema's name in them (built once per store)."""

    def __init__(self, q: str) -> None:
        unfinished = f"SELECT {_ROW_COLUMNS} FROM {q}.runs WHERE status = ANY($1::text[])"
        # Over every lane's slots, not only lane 0's.
        self.last_lsn = (
            f"SELECT coalesce(max(m), 0) FROM {q}.shard_leases AS s,"
            f" LATERAL (SELECT max(lsn) AS m FROM {q}.journal WHERE shard = s.shard) AS x"
        )
        self.insert_entries = (
            f"INSERT INTO {q}.journal (shard, lsn, id, run, data) SELECT * FROM"
            " unnest($1::int[], $2::bigint[], $3::text[], $4::bigint[], $5::bytea[])"
        )
        # A record counts as this write's only if it is the same record: on a
        # store several workers share, the next holder of a shard may have
        # used the same LSNs for records of its own.
        self.count_entries = (
            f"SELECT count(*) FROM {q}.journal AS j"
            " JOIN unnest($1::int[], $2::bigint[], $3::text[], $4::bytea[])"
            " AS k(shard, lsn, id, data)"
            " ON j.shard = k.shard AND j.lsn = k.lsn AND j.id = k.id AND j.data = k.data"
        )
        self.upsert_rows = (
            f"INSERT INTO {q}.runs (id, shard, run, workflow, status, started_ms, finished_ms,"
            " wake_ms, attributes, parent, version, error) SELECT * FROM unnest($1::text[],"
            " $2::int[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::bigint[],"
            " $8::bigint[], $9::bytea[], $10::text[], $11::text[], $12::text[])"
            " ON CONFLICT (id) DO UPDATE SET shard = EXCLUDED.shard, run = EXCLUDED.run,"
            " workflow = EXCLUDED.workflow, status = EXCLUDED.status,"
            " started_ms = EXCLUDED.started_ms, finished_ms = EXCLUDED.finished_ms,"
            " wake_ms = EXCLUDED.wake_ms, attributes = EXCLUDED.attributes,"
            " parent = EXCLUDED.parent, version = EXCLUDED.version, error = EXCLUDED.error"
        )
        # FOR SHARE, not an UPDATE: it holds off a takeover (which updates the
        # row) until this transaction ends, as an UPDATE would, without
        # writing a new version of every fenced lease row in every commit.
        self.fence = (
            f"SELECT l.shard, l.epoch FROM {q}.shard_leases AS l"
            " JOIN unnest($1::int[], $2::bigint[]) AS f(shard, epoch)"
            " ON l.shard = f.shard AND l.epoch = f.epoch"
            " ORDER BY l.shard FOR SHARE OF l"
        )
        self.reserve_runs = (
            f"UPDATE {q}.meta SET value = value + $1 WHERE key = 'run_reserved' RETURNING value"
        )
        self.acquire = (
            f"UPDATE {q}.shard_leases AS l SET owner = $1, epoch = l.epoch + 1,"
            " lease_until = now() + make_interval(secs => $3)"
            f" FROM (SELECT shard FROM {q}.shard_leases"
            " WHERE shard BETWEEN $5 AND $6"
            " AND (owner IS NULL OR lease_until < now() OR (owner = $1 AND $4))"
            " ORDER BY shard LIMIT $2 FOR UPDATE SKIP LOCKED) AS free"
            " WHERE l.shard = free.shard RETURNING l.shard, l.epoch"
        )
        self.renew = (
            f"UPDATE {q}.shard_leases SET lease_until = now() + make_interval(secs => $3)"
            " WHERE owner = $1 AND shard = ANY($2::int[]) RETURNING shard, epoch"
        )
        self.release = (
            f"UPDATE {q}.shard_leases SET owner = NULL, epoch = epoch + 1,"
            " lease_until = '-infinity' WHERE owner = $1 AND shard = ANY($2::int[])"
        )
        # A worker counts as live while its row's lease runs; it renews it
        # with its shards' leases, and deletes it when it stops.
        self.join = (
            f"WITH me AS (INSERT INTO {q}.workers (owner, lease_until, version)"
            " VALUES ($1, now() + make_interval(secs => $2), $3)"
            " ON CONFLICT (owner) DO UPDATE SET lease_until = EXCLUDED.lease_until,"
            " version = EXCLUDED.version)"
            f" SELECT count(*) + 1 FROM {q}.workers AS w WHERE owner <> $1 AND lease_until >= now()"
            f" AND coalesce((SELECT lane FROM {q}.versions AS v WHERE v.version = w.version), 0)"
            " = $4"
        )
        # Each version's lane, and the lanes with a live worker.
        self.lanes = f"SELECT version, lane FROM {q}.versions"
        self.live_lanes = (
            "SELECT DISTINCT coalesce(v.lane, 0)"
            f" FROM {q}.workers AS w LEFT JOIN {q}.versions AS v ON v.version = w.version"
            " WHERE w.lease_until >= now()"
        )
        self.lane_of = f"SELECT lane FROM {q}.versions WHERE version = $1"
        # Unanswered commands for runs whose lane lost its last worker (or
        # came back) move to the lane serving their run now; starts stay
        # with the lane they were sent to.
        self.reroute = (
            f"UPDATE {q}.commands SET shard = shard % $1 + $1 * {q}.lane_for(run_id, NULL)"
            " WHERE answered_ms IS NULL AND shard IS NOT NULL AND kind <> ALL($2::text[])"
            f" AND shard / $1 <> {q}.lane_for(run_id, NULL)"
        )
        self.new_lane = (
            f"INSERT INTO {q}.versions (version, lane) SELECT $1, coalesce(max(lane), 0) + 1"
            f" FROM {q}.versions RETURNING lane"
        )
        self.lane_leases = (
            f"INSERT INTO {q}.shard_leases SELECT n, NULL, 0, '-infinity'"
            " FROM generate_series($1::int, $2::int) AS n ON CONFLICT (shard) DO NOTHING"
        )
        self.leave = f"DELETE FROM {q}.workers WHERE owner = $1"
        self.live_workers = (
            f"SELECT owner, version FROM {q}.workers WHERE lease_until >= now() ORDER BY owner"
        )
        self.max_lsn = (
            "SELECT coalesce(max(m), 0) FROM unnest($1::int[]) AS s,"
            f" LATERAL (SELECT max(lsn) AS m FROM {q}.journal WHERE shard = s) AS x"
        )
        self.leases = (
            f"SELECT shard, owner, epoch, owner IS NOT NULL AND lease_until >= now()"
            f" FROM {q}.shard_leases ORDER BY shard"
        )
        self.load_run = (
            f"SELECT lsn, data FROM {q}.journal WHERE id = $1 AND run = $2 AND lsn > $3"
            " ORDER BY lsn"
        )
        self.load_latest = (
            f"SELECT lsn, data FROM {q}.journal WHERE id = $1 AND run = coalesce("
            f"(SELECT run FROM {q}.runs WHERE id = $1),"
            f" (SELECT max(run) FROM {q}.journal WHERE id = $1)) AND lsn > $2 ORDER BY lsn"
        )
        self.runs_of = (
            f"SELECT (SELECT run FROM {q}.runs WHERE id = $1),"
            f" (SELECT max(run) FROM {q}.journal WHERE id = $1),"
            f" (SELECT status FROM {q}.runs WHERE id = $1)"
        )
        self.has_run = f"SELECT 1 FROM {q}.journal WHERE id = $1 AND run = $2 LIMIT 1"
        self.get = f"SELECT {_ROW_COLUMNS} FROM {q}.runs WHERE id = $1"
        self.get_many = f"SELECT {_ROW_COLUMNS} FROM {q}.runs WHERE id = ANY($1::text[])"
        # Rows and, for those of runs that ended, their journal's last record.
        self.get_ended = (
            f"SELECT {_ROW_COLUMNS}, e.lsn, e.data FROM {q}.runs AS r LEFT JOIN LATERAL"
            f" (SELECT lsn, data FROM {q}.journal AS j WHERE r.status = ANY($2::text[])"
            " AND j.id = r.id AND j.run = r.run ORDER BY lsn DESC LIMIT 1) AS e ON true"
            " WHERE r.id = ANY($1::text[])"
        )
        # One statement: the row and its NOTIFY commit together (a NOTIFY is
        # sent at commit), and only a row really inserted announces itself.
        self.post_command = (
            f"WITH posted AS (INSERT INTO {q}.commands ({_POSTED_COLUMNS})"
            f" VALUES ($1, $2, $3, $4, $5, $6, 0, $8 + $9 * {q}.lane_for($3, $10))"
            " ON CONFLICT (id) DO NOTHING RETURNING id)"
            " SELECT pg_notify($7, '') FROM posted"
        )
        # Commands a group commit posts with the records that cause them
        # (a child's end for its parent on another shard): one NOTIFY.
        self.post_commands = (
            f"WITH posted AS (INSERT INTO {q}.commands ({_POSTED_COLUMNS})"
            f" SELECT i, k, r, p, d, c, 0, s + $9 * {q}.lane_for(r, l)"
            " FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[],"
            " $6::bigint[], $7::int[], $10::int[]) AS t(i, k, r, p, d, c, s, l)"
            " ON CONFLICT (id) DO NOTHING RETURNING id)"
            " SELECT pg_notify($8, '') WHERE EXISTS (SELECT FROM posted)"
        )
        self.take_commands = (
            f"UPDATE {q}.commands SET attempts = attempts + 1 WHERE id IN"
            f" (SELECT id FROM {q}.commands WHERE answered_ms IS NULL"
            " AND NOT (id = ANY($2::text[]))"
            " AND ($3::int[] IS NULL OR shard IS NULL OR shard = ANY($3::int[]))"
            " ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)"
            f" RETURNING seq, {_COMMAND_COLUMNS}"
        )
        self.answer_command = (
            f"UPDATE {q}.commands SET answered_ms = $2, ok = $3, answer = $4"
            " WHERE id = $1 AND answered_ms IS NULL"
        )
        self.get_answer = (
            f"SELECT ok, answer, answered_ms FROM {q}.commands"
            " WHERE id = $1 AND answered_ms IS NOT NULL"
        )
        # What many callers asked at once, in one statement (`Batched`).
        # One NOTIFY per batch, naming the ids answered (a JSON list), for
        # the posters waiting on them (`PostgresStore.wait_answer`).
        self.answer_commands = (
            f"WITH answered AS (UPDATE {q}.commands AS c"
            " SET answered_ms = $2, ok = t.ok, answer = t.answer"
            " FROM unnest($1::text[], $3::bool[], $4::bytea[]) AS t(id, ok, answer)"
            " WHERE c.id = t.id AND c.answered_ms IS NULL RETURNING c.id)"
            " SELECT pg_notify($5, CASE WHEN octet_length(ids) <= "
            f"{_NOTIFY_IDS_MAX} THEN ids ELSE '' END)"
            " FROM (SELECT json_agg(id)::text AS ids FROM answered) AS a WHERE ids IS NOT NULL"
        )
        self.get_answers = (
            f"SELECT id, ok, answer, answered_ms FROM {q}.commands"
            " WHERE id = ANY($1::text[]) AND answered_ms IS NOT NULL"
        )
        self.forget_commands = f"DELETE FROM {q}.commands WHERE answered_ms < $1"
        self.unfinished = f"{unfinished} ORDER BY started_ms, id"
        self.unfinished_in = f"{unfinished} AND shard = ANY($2::int[]) ORDER BY started_ms, id"


def _row(values: Any) -> RunRow:
    id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent = values[:9]
    version, error = values[9:]
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
