"""How ``fusee start/signal/cancel/resume`` reach the worker: the store's commands inbox.

Each posts a command through a `fusee.Client` (a row in the store's
``commands`` table) and waits for the serving engine's answer; the worker
checks signals against the ones its modules declare and prints each answer.
``DATA/worker.lock`` marks the one ``fusee worker`` of a directory.

The rule: the CLI changes runs only through commands; it never opens an
engine on a store another process serves.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from fusee._definitions import KnownSignals, SignalDef
from fusee.cli._output import CliError, Output
from fusee.cli._reading import store_shown, store_target
from fusee.client import Client
from fusee.errors import FuseeError, StoreError
from fusee.remote import answer_fields
from fusee.store import Command
from fusee.store.sqlite import is_served

LOCK_FILE: Final = "worker.lock"


@contextlib.contextmanager
def writer_lock(directory: str | os.PathLike[str], *, commands: bool = False) -> Iterator[None]:
    """Holds ``DIRECTORY/worker.lock``, the mark of the one process that writes a store.

    ``fusee worker`` holds it while it runs. A program that opens an engine
    on a directory may hold it too: then a second copy of the program, or a
    worker, is refused with a clear error instead of both writing the store.
    The lock is an flock: the kernel drops it when the process dies, even by
    ``kill -9``, so a stale file never blocks anyone.

    Args:
        directory: The store's directory (created if missing).
        commands: Whether this process is ``fusee worker`` (its lock file
            says so, for the messages of those refused).

    Raises:
        fusee.StoreError: Another process holds the lock.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with writer_lock(d):
        ...         print("this process writes", d == d)
        this process writes True
    """
    path = Path(directory) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+", encoding="utf-8")
    try:
        # A few tries: a `fusee` command probing the lock holds it for an instant.
        for attempt in range(20):
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 19:
                    raise StoreError(_held_by(_read_holder(path), path.parent)) from None
                time.sleep(0.05)
        f.seek(0)
        f.truncate()
        info = {"pid": os.getpid(), "argv": " ".join(sys.argv)[:200], "commands": commands}
        f.write(json.dumps(info))
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    finally:
        f.close()


def _held_by(holder: dict[str, Any] | None, data: Path) -> str:
    who = holder_text(holder)
    return (
        f"{who} already writes the store in {data}; one engine writes a store: stop it "
        "first, or send it commands with `fusee start/signal/cancel/resume`"
    )


def holder_text(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "another process"
    argv = holder.get("argv")
    return f"another process (pid {holder.get('pid', '?')}{f': {argv}' if argv else ''})"


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def worker_holder(data: Path) -> dict[str, Any] | None:
    """What the worker serving ``data`` wrote in its lock file, or None if none runs."""
    path = data / LOCK_FILE
    try:
        f = path.open("r", encoding="utf-8")
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or {"pid": "?", "commands": True}
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def _served(target: str) -> bool | None:
    """Whether an engine serves the store (None: cannot tell, as for a Postgres URL)."""
    if "://" in target:
        return None
    return is_served(target) or worker_holder(Path(target)) is not None


async def send_command(
    args: argparse.Namespace,
    out: Output,
    kind: str,
    run_id: str,
    fields: Mapping[str, Any],
    what: str,
    *,
    dedup: str | None = None,
) -> int:
    """Posts a command through a `fusee.Client` and reports the serving engine's answer."""
    target = store_target(args)
    shown = store_shown(args)
    # Asked before the client opens the store: probing opens (and closes) the
    # database file, which drops this process's SQLite locks on it.
    served = _served(target)
    async with await Client.connect(target) as client:
        command = await client.post(kind, run_id, fields, dedup=dedup)
        report: dict[str, Any] = {"command": kind, "id": run_id, "queued": command.id}
        if served is False or args.no_wait:
            if served is False:
                message = (
                    f"queued {what}: no worker is running on {shown}; "
                    f"`fusee worker MODULE --store {shown}` applies it when it starts"
                )
            else:
                message = f"queued {what} for the worker"
            _queued(out, report, message)
            return 0
        answer = await client.wait_answer(command.id, timeout_s=args.timeout)
    if answer is None:
        raise CliError(
            f"no worker on {shown} answered within {args.timeout:g}s; {what} stays queued "
            f"(command {command.id}) and is applied when a worker takes it"
        )
    try:
        answered = answer_fields(answer)
    except FuseeError as e:
        if out.json:
            out.emit({**report, "applied": True, "ok": False, "message": str(e)})
        else:
            out.error(str(e))
        return 1
    message = str(answered.get("message", ""))
    warning = answered.get("warning")
    if out.json:
        extra = {} if warning is None else {"warning": str(warning)}
        out.emit({**report, "applied": True, "ok": True, "message": message, **extra})
        return 0
    out.say(message)
    if warning is not None:
        out.warn(str(warning))
    return 0


def _queued(out: Output, report: dict[str, Any], message: str) -> None:
    if out.json:
        out.emit({**report, "applied": False, "ok": True, "message": message})
    else:
        out.say(message)


def _unknown_signal(name: str, known: KnownSignals) -> str:
    names = ", ".join(repr(n) for n in known.names()) or "none"
    return (
        f"no workflow of this worker declares a signal {name!r} (its modules define: {names}); "
        "it is delivered anyway, and the run keeps it until its code waits for that name: "
        "check the name"
    )


def signal_checker(
    signals: KnownSignals | Mapping[str, SignalDef[Any]],
) -> Callable[[str, str, bytes], str | None]:
    """The worker's check of a signal before its engine delivers it (`Inbox.check_signal`).

    ``signals`` are the signals the worker's modules define (or a mapping of
    names to definitions): a payload is checked against its signal's type,
    and a name not there is delivered with a warning in the answer.
    """
    known = signals if isinstance(signals, KnownSignals) else KnownSignals([signals])

    def check(run_id: str, name: str, payload: bytes) -> str | None:
        if name not in known:
            return _unknown_signal(name, known)
        known.check(run_id, name, payload)
        return None

    return check


def answer_printer(out: Output) -> Callable[[Command, bool, dict[str, Any]], None]:
    """Prints each command the worker's engine answered (`Inbox.on_answer`)."""

    def show(command: Command, ok: bool, fields: dict[str, Any]) -> None:
        mark = ("  > ", "cyan") if ok else ("  ! ", "red")
        text = str(fields.get("message", ""))
        if not ok:
            text = text or f"{command.kind} of run {command.run_id!r} failed"
        out.say(mark, text)
        if "warning" in fields:
            out.say(("  ? ", "yellow"), str(fields["warning"]))

    return show
