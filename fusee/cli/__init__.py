"""The ``fusee`` command: look into a store and operate its runs from a shell.

::

    fusee list [--status S] [--workflow W] [--attr K=V]   the runs of a store
    fusee show ID [--follow] [--full]                     a run and its journal, as a timeline
    fusee result ID [--wait]                              a run's result
    fusee event ID KEY [--wait]                           a run's latest value of an event
    fusee start MODULE:WORKFLOW ID [JSON] [--queue Q]     start a run
    fusee signal ID NAME [JSON] | cancel ID | resume ID   act on a run
    fusee cancel|resume --status S --workflow W [--dry-run]  act on every run that matches
    fusee prune --older-than 30d [--dry-run]              delete the runs that ended long ago
    fusee fork ID NEW_ID --at N [--input JSON]            a new run from a run's journal before N
    fusee schedules [list|create|update|delete|backfill|pause|resume|trigger NAME]
    fusee worker MODULE... [--store URL]                  serve a module's workflows
    fusee replay MODULE... [--all]                        replay unfinished runs against the code
    fusee check                                           what is damaged in a store
    fusee queues [--keys]                                 queued and running runs per queue
    fusee versions                                        unfinished runs and workers per version
    fusee ui [--port 8700] [--token T]                    a web page of the runs
    fusee disk-check [DIR]                                the flush latency of a disk

Reading commands (``list``, ``show``, ``result``, ``event``, ``replay``, ``check``,
``queues``) open the store read-only: they work while an engine writes it from another
process.

The rule: the commands never write a store as an engine does. So the commands that
change runs (``start``, ``signal``, ``cancel``, ``resume``, ``fork``, ``schedules``,
``prune``)
never open an engine: they
post a command to the store's inbox through a `fusee.Client` (a row of its
``commands`` table), and the engine serving the store (``fusee worker``, or
a program's own) applies it and answers. With no worker running, the
command waits in the inbox and the next worker applies it when it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, TextIO

from fusee.cli._bulk import add_filters, cancel_runs, resume_runs
from fusee.cli._check import check_command
from fusee.cli._commands import (
    fork_command,
    list_command,
    result_command,
    signal_command,
    start_command,
)
from fusee.cli._diskcheck import disk_check_command
from fusee.cli._event import event_command
from fusee.cli._inbox import writer_lock
from fusee.cli._output import CliError, Output
from fusee.cli._prune import prune_command
from fusee.cli._queues import queues_command
from fusee.cli._replay import replay_command
from fusee.cli._schedules import ACTIONS, schedule_arguments, schedules_command
from fusee.cli._show import show_command
from fusee.cli._ui import ui_command
from fusee.cli._versions import versions_command
from fusee.cli._worker import worker_command
from fusee.engine import IdPolicy
from fusee.errors import FuseeError
from fusee.store import RUN_STATUSES

__all__ = ["main", "writer_lock"]

_EPILOG: Final = """\
the store: --data DIR (default ./data) or --store URL; reading commands open it
read-only and work while an engine writes it.

changing runs: start, signal, cancel, resume and fork open no engine. They post a
command to the store's inbox (a row of its commands table); the engine serving
the store (`fusee worker`, or your program's) applies it and answers. Without a
worker the command stays queued until one starts. On SQLite one engine writes a
store: never run two workers, or a worker and your own program, on one directory.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusee",
        description="Inspect and operate fusee stores: durable execution for Python.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    store_args = argparse.ArgumentParser(add_help=False)
    where = store_args.add_argument_group("the store")
    where.add_argument(
        "--data", metavar="DIR", default=argparse.SUPPRESS, help="store directory (default ./data)"
    )
    where.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS, help="a store URL or directory"
    )
    where.add_argument(
        "--codecs",
        metavar="MODULE:ATTR",
        default=argparse.SUPPRESS,
        help="the payload codecs the workers use (a fusee.PayloadCodec, a list of them, or a "
        "function returning them), to read encrypted or compressed payloads",
    )
    where.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser.add_argument("--data", metavar="DIR", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", metavar="URL", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", default=False, help=argparse.SUPPRESS)
    parser.add_argument("--codecs", metavar="MODULE:ATTR", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"fusee {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=description or help,
            parents=[store_args],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    p = command("list", "list runs, newest first")
    p.add_argument("--status", help=f"one of {', '.join(sorted(RUN_STATUSES))}")
    p.add_argument("--workflow", metavar="W", help="a workflow name")
    p.add_argument(
        "--attr", metavar="K=V", action="append", default=[], help="a search attribute (repeat)"
    )
    p.add_argument("--limit", type=int, metavar="N", help="the N newest runs")
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="runs started at or after WHEN: an ISO date or time (local unless it says), "
        "or a duration ago (2h, 1d)",
    )
    p.add_argument("--until", metavar="WHEN", help="runs started at or before WHEN (as --since)")
    p.set_defaults(handler=list_command)

    p = command(
        "show",
        "a run and its journal, as a timeline",
        "Show a run and its journal as a timeline: log position (lsn), journal position "
        "(seq), kind, name, attempt, status, time (when it happened, or for a timer, a wait "
        "or a retry, when it is due) and payload (decoded).",
    )
    p.add_argument("id", help="the run's workflow id")
    p.add_argument("--run", type=int, help="an earlier run of that id (default: the latest)")
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print records as they land, until the run ends, with a bar for each running "
        "step's heartbeat progress",
    )
    p.add_argument(
        "--full", action="store_true", help="payloads whole, and a failed run's whole traceback"
    )
    p.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
    p.set_defaults(handler=show_command)

    p = command("result", "a run's result (exit status 1 if it failed or was cancelled)")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="wait for the run to finish")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds"
    )
    p.set_defaults(handler=result_command)

    p = command("event", "a run's latest value of an event (ctx.set_event)")
    p.add_argument("id")
    p.add_argument("key", help="the event's key")
    p.add_argument("--wait", action="store_true", help="wait until the run sets it")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds"
    )
    p.set_defaults(handler=event_command)

    def acting(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--no-wait", action="store_true", help="queue the command; do not wait for the worker"
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="S",
            help="how long to wait for the worker's answer (default 30)",
        )

    act = (
        "Posted to the store's inbox for the engine serving it, which applies it and "
        "answers; with no worker running it stays queued until one starts."
    )
    p = command("start", "start a run", f"Start a run. {act}")
    p.add_argument("workflow", metavar="MODULE:WORKFLOW", help="e.g. examples.checkout:checkout")
    p.add_argument("id", help="the run's workflow id")
    p.add_argument("input", nargs="?", metavar="JSON", help="the input (default null)")
    p.add_argument(
        "--id-policy",
        choices=[p.value for p in IdPolicy],
        default="reject",
        help="when the id is taken (default reject)",
    )
    p.add_argument("--queue", metavar="Q", help="start it through the worker's queue Q")
    p.add_argument("--key", help="with --queue: its key, for the queue's per-key limit")
    p.add_argument(
        "--priority", type=int, default=0, help="with --queue: lower is admitted first (0)"
    )
    acting(p)
    p.set_defaults(handler=start_command)

    p = command("signal", "send a signal to a run", f"Send a signal to a run. {act}")
    p.add_argument("id")
    p.add_argument("name", help="the signal's name")
    p.add_argument("payload", nargs="?", metavar="JSON", help="its payload (default null)")
    p.add_argument("--dedup", help="a dedup id: a second signal with it is ignored")
    acting(p)
    p.set_defaults(handler=signal_command)

    bulk = (
        "Instead of ID, filters (those of `fusee list`) name every run to act on, each "
        "once, in batches; --dry-run lists them and changes nothing."
    )
    p = command("cancel", "cancel a run, or every run that matches", f"Cancel a run. {act} {bulk}")
    p.add_argument("id", nargs="?", help="the run (or give filters)")
    p.add_argument("--reason", default="cancelled from the fusee command")
    add_filters(p, "cancel")
    acting(p)
    p.set_defaults(handler=cancel_runs)

    p = command(
        "resume",
        "resume a run's paused steps, or every matching run's",
        f"Resume a run's paused steps. {act} {bulk}",
    )
    p.add_argument("id", nargs="?", help="the run (or give filters)")
    add_filters(p, "resume")
    acting(p)
    p.set_defaults(handler=resume_runs)

    p = command(
        "prune",
        "delete the finished runs that ended long ago",
        "Delete the finished runs (completed, failed, cancelled) that ended longer ago than "
        "--older-than, whole: journal, row, events, streams. Their ids may start again. "
        f"{act} --dry-run counts them (read-only) and deletes nothing.",
    )
    p.add_argument(
        "--older-than", required=True, metavar="DURATION", help="e.g. 30d, 12h (required)"
    )
    p.add_argument("--dry-run", action="store_true", help="count them; delete nothing")
    acting(p)
    p.set_defaults(handler=prune_command)

    p = command(
        "fork",
        "start a new run from a run's journal before a position",
        "Start run NEW_ID from a copy of run ID's journal before position N (the seq "
        "column of `fusee show`; a step name stands for its first position): the steps "
        f"before N do not run again, the new run goes on live from N, and ID is unchanged. {act}",
    )
    p.add_argument("id", help="the run to fork")
    p.add_argument("new_id", metavar="NEW_ID", help="the new run's id (no run may have it)")
    p.add_argument("--at", required=True, metavar="N", help="a position (seq) or a step name")
    p.add_argument("--input", metavar="JSON", help="the new run's input (default: the run's)")
    acting(p)
    p.set_defaults(handler=fork_command)

    p = command(
        "schedules",
        "list a store's schedules; create, update, delete, backfill, pause, resume or trigger one",
        "List the store's schedules (read-only), or create, update or delete the schedule "
        "NAME at run time, start the runs of its past ticks (backfill --from TIME --to TIME), "
        f"pause, resume or trigger (start a run now) it. {act}",
    )
    p.add_argument("action", nargs="?", choices=ACTIONS, default="list", help="default list")
    p.add_argument("name", nargs="?", metavar="NAME", help="the schedule's name")
    schedule_arguments(p)
    acting(p)
    p.set_defaults(handler=schedules_command)

    p = command(
        "worker",
        "serve the workflows of modules",
        "Serve the workflows (every fusee.workflow) that MODULEs define, through their "
        "queues (fusee.Queue) and on their schedules (fusee.Schedule), until Ctrl-C: "
        "recover the store's unfinished runs, apply the commands posted to its inbox, and "
        "print runs as they finish. On a directory it holds DIR/worker.lock: one worker per "
        "SQLite store; `--store postgresql://...` serves a Postgres store.",
    )
    p.add_argument("modules", nargs="+", metavar="MODULE", help="dotted name or file path")
    p.add_argument("--durability", choices=["fsync", "none"], default="fsync", help="default fsync")
    p.add_argument(
        "--lease",
        default="10s",
        metavar="DURATION",
        help="Postgres: how long a shard lease lasts; a dead worker's runs move after it "
        "(default 10s)",
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        help="Postgres: this worker's name (default host/pid/random); restarted under the "
        "same name, it takes its shards back at once",
    )
    p.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="an async context manager function (e.g. examples.shop.services:connected) "
        "entered before the engine opens and left after it closes: it builds what the "
        "steps use (HTTP clients, connections)",
    )
    p.add_argument(
        "--version",
        metavar="V",
        help="this worker's version (Engine.open's version=: a release, a git commit): each "
        "run stays on the version it started on (default: derived from the workflows' code)",
    )
    p.add_argument(
        "--retention",
        metavar="DURATION",
        help="delete the finished runs that ended longer ago than this (Engine.open's "
        "retention=, e.g. 30d; default: keep them)",
    )
    p.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
    p.set_defaults(handler=worker_command)

    p = command(
        "replay",
        "replay the unfinished runs' journals against the current code",
        "Replay each unfinished run's journal against the workflows of MODULEs and list "
        "every divergence with its run, status, journal position and code line; exit "
        "status 1 if any. Run it before deploying changed workflow code. Finished runs "
        "never replay, so they are left out unless --all.",
    )
    p.add_argument("modules", nargs="+", metavar="MODULE", help="dotted name or file path")
    p.add_argument("--id", help="only this run (whatever its status)")
    p.add_argument(
        "--all", action="store_true", help="replay finished runs too (and count their problems)"
    )
    p.add_argument(
        "--version",
        metavar="V",
        help="the version the code deploys as (Engine.open's version=; default: derived from "
        "the workflows' source): unfinished runs pinned to another are skipped",
    )
    p.set_defaults(handler=replay_command)

    p = command(
        "check",
        "read every row and record of a store and report the damage",
        "Read every run's row and journal (read-only) and report, naming each run, what is "
        "damaged: a record that does not decode, a journal that does not start with its "
        "Start, records after a Done, a finished row whose journal has no Done, a row "
        "whose journal is missing, a row that cannot be read. Exit status 1 if anything "
        "is damaged.",
    )
    p.set_defaults(handler=check_command)

    p = command(
        "queues",
        "queued and running runs per queue",
        "Print, for each queue with runs in it, how many wait for admission (queued) and "
        "how many it admitted that have not ended (running, waiting included); --keys adds "
        "the same per key.",
    )
    p.add_argument("--keys", action="store_true", help="the figures per key too")
    p.set_defaults(handler=queues_command)

    p = command(
        "versions",
        "unfinished runs and workers per engine version",
        "Print, for each engine version (Engine.open's version=), its unfinished runs and "
        "the live workers that run it, and warn of a version with unfinished runs and no "
        "worker: its pinned runs wait until a worker of that version runs. On SQLite it "
        "asks the serving engine its version through the store's inbox.",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="how long to wait for the serving engine's answer (default 5)",
    )
    p.set_defaults(handler=versions_command)

    p = command(
        "ui",
        "serve the web page of a store's runs",
        "Serve the runs of a store (read-only) and their journals as a web page and a JSON "
        "API on 127.0.0.1 (the `ui` extra: pip install 'fusee[ui]'). Signals, cancels and "
        "resumes from the page go to the serving worker through a fusee.Client. Binding "
        "another address requires --token.",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8700, help="the port (default 8700)")
    p.add_argument("--token", help="a secret every request must carry (needed off loopback)")
    p.set_defaults(handler=ui_command)

    p = command(
        "disk-check",
        "measure the flush latency of a disk",
        "Write 4 KiB and fsync, COUNT times, in a temporary file under DIR (default: the "
        "store's directory, or the current one); print p50, p99 and max in microseconds.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR")
    p.add_argument("--count", type=int, default=300, help="flushes to time (default 300)")
    p.add_argument("--size", type=int, default=4096, help="bytes per write (default 4096)")
    p.set_defaults(handler=disk_check_command)
    return parser


def _version() -> str:
    from fusee._version import __version__

    return __version__


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs the ``fusee`` command; returns its exit status.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        stdout: Where output goes (default: ``sys.stdout``).
        stderr: Where errors go, one line each (default: ``sys.stderr``).

    Returns:
        0 on success; 1 on an error, a failed or cancelled run (``result``) or
        a divergence (``replay``); 2 on a usage error; 130 on Ctrl-C.

    Example:
        >>> import sys
        >>> main(["list", "--data", "/nonexistent/store"], stderr=sys.stdout)  # doctest: +ELLIPSIS
        fusee: error: no fusee store in /nonexistent/store...
        1
    """
    out_stream = stdout if stdout is not None else sys.stdout
    err_stream = stderr if stderr is not None else sys.stderr
    parser = _parser()
    try:
        with contextlib.redirect_stdout(out_stream), contextlib.redirect_stderr(err_stream):
            args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    out = Output(out_stream, err_stream, bool(args.json))
    handler: Callable[[argparse.Namespace, Output], Coroutine[Any, Any, int] | int]
    handler = args.handler
    try:
        result = handler(args, out)
        if asyncio.iscoroutine(result):
            return asyncio.run(result)
        assert isinstance(result, int)
        return result
    except CliError as e:
        out.error(str(e))
        return 1
    except FuseeError as e:
        out.error(str(e))
        return 1
    except OSError as e:
        out.error(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
        return 1
    except ValueError as e:
        out.error(str(e))
        return 1
    except KeyboardInterrupt:
        # Ctrl-C is how a worker and `show --follow` are meant to end.
        return 0 if args.command in ("worker", "show") else 130
    except Exception as e:
        if os.environ.get("FUSEE_DEBUG"):
            raise
        out.error(f"unexpected {type(e).__name__}: {e} (set FUSEE_DEBUG=1 for the traceback)")
        return 1
