"""The commands inbox: how ``fusee start/signal/cancel/resume`` reach the worker.

A command is a JSON file in ``DATA/inbox/`` (names sort in arrival order);
the one process holding ``DATA/worker.lock`` with ``commands`` set (``fusee
worker``) applies each with its engine, writes the answer to
``DATA/inbox/replies/`` and then drops the command.

The rule: the worker answers before it drops a command, and a command
applied twice (a worker that died in between) has the same effect as once
(a signal carries the command's name as its dedup id).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from fusee._definitions import SignalDef
from fusee._definitions import signal as signal_def
from fusee.cli._output import CliError, Output
from fusee.cli._reading import data_dir
from fusee.engine import Engine, IdPolicy
from fusee.errors import FuseeError, PayloadError, StoreError

LOCK_FILE: Final = "worker.lock"
INBOX: Final = "inbox"
REPLIES: Final = "replies"
# How long a finished command's answer stays in the inbox for its sender.
_REPLY_TTL_S: Final = 3600.0


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
        commands: Whether this process applies the commands that ``fusee
            start/signal/cancel/resume`` queue in ``DIRECTORY/inbox/`` (only
            ``fusee worker`` does); those commands refuse to queue for a
            holder that does not.

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
    hint = (
        "stop it first, or send it commands with `fusee start/signal/cancel/resume`"
        if holder is not None and holder.get("commands")
        else "stop it first"
    )
    return f"{who} already writes the store in {data}; one engine writes a store: {hint}"


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


def _write_atomically(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def post(data: Path, command: dict[str, Any]) -> str:
    """Queues ``command`` in ``data``'s inbox, durably; returns its name."""
    inbox = data / INBOX
    (inbox / REPLIES).mkdir(parents=True, exist_ok=True)
    # Names sort in arrival order: the worker applies commands oldest first.
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}.json"
    _write_atomically(inbox / name, command)
    return name


async def await_reply(data: Path, name: str, timeout_s: float) -> dict[str, Any] | None:
    """The worker's answer to command ``name``; None if no worker is left to answer."""
    path = data / INBOX / REPLIES / name
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    checked = loop.time()
    while True:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            pass
        else:
            with contextlib.suppress(OSError):
                path.unlink()
            reply: dict[str, Any] = json.loads(text)
            return reply
        now = loop.time()
        if now >= deadline:
            raise CliError(
                f"the worker on {data} did not answer within {timeout_s:g}s; the command "
                f"stays queued as {data / INBOX / name} and is applied when the worker gets to it"
            )
        if now - checked >= 1.0:
            checked = now
            # The worker answers before it drops the command: a command still
            # there with no worker left waits for the next one.
            if worker_holder(data) is None and (data / INBOX / name).exists():
                return None
        await asyncio.sleep(0.05)


async def send_command(
    args: argparse.Namespace, out: Output, command: dict[str, Any], what: str
) -> int:
    data = data_dir(args)
    holder = worker_holder(data)
    if holder is not None and not holder.get("commands"):
        raise CliError(
            f"{holder_text(holder)} writes the store in {data} and takes no commands; "
            f"act on the run from that program, or stop it and run `fusee worker MODULE "
            f"--data {data}`"
        )
    name = post(data, command)
    report: dict[str, Any] = {"command": command["op"], "id": command["id"], "queued": name}
    if holder is None or args.no_wait:
        if holder is None:
            message = (
                f"queued {what}: no worker is running on {data}; "
                f"`fusee worker MODULE --data {data}` applies it when it starts"
            )
        else:
            message = f"queued {what} for the worker (pid {holder.get('pid', '?')})"
        if out.json:
            out.emit({**report, "applied": False, "ok": True, "message": message})
        else:
            out.say(message)
        return 0
    reply = await await_reply(data, name, args.timeout)
    if reply is None:
        message = (
            f"the worker on {data} stopped before applying {what}; it stays queued for the next one"
        )
        if out.json:
            out.emit({**report, "applied": False, "ok": True, "message": message})
        else:
            out.say(message)
        return 0
    ok = bool(reply.get("ok"))
    message = str(reply.get("message", ""))
    warning = reply.get("warning")
    if out.json:
        extra = {} if warning is None else {"warning": str(warning)}
        out.emit({**report, "applied": True, "ok": ok, "message": message, **extra})
    elif ok:
        out.say(message)
    if warning is not None and not out.json:
        out.warn(str(warning))
    if not ok:
        if not out.json:
            out.error(message)
        return 1
    return 0


def _unknown_signal(name: str, signals: Mapping[str, SignalDef[Any] | None]) -> str:
    known = ", ".join(repr(n) for n in sorted(signals)) or "none"
    return (
        f"no workflow of this worker declares a signal {name!r} (its modules define: {known}); "
        "it is delivered anyway, and the run keeps it until its code waits for that name: "
        "check the name"
    )


async def apply_command(
    engine: Engine,
    command: dict[str, Any],
    name: str,
    signals: Mapping[str, SignalDef[Any] | None],
) -> dict[str, Any]:
    """Applies one inbox command with the worker's engine; returns the answer.

    ``signals`` maps the signal names the worker's modules define to their
    definition (None where two definitions of one name disagree): a
    payload is checked against its signal's type before it is delivered,
    and a name not there is delivered with a warning in the answer.
    """
    op = command.get("op")
    id = str(command.get("id", ""))
    try:
        if op == "start":
            policy = IdPolicy(command.get("id_policy") or "reject")
            await engine.start(command["workflow"], id, command.get("input"), id_policy=policy)
            return {"ok": True, "message": f"started run {id!r} ({command['workflow']})"}
        if op == "signal":
            # Without a dedup id of its own, the command's name is one: a
            # command applied again after a worker crash signals once.
            dedup = command.get("dedup") or f"inbox/{name}"
            signal_name = str(command["name"])
            payload = command.get("payload")
            declared = signals.get(signal_name)
            if declared is not None:
                try:
                    declared.decode(declared.encode(payload))
                except PayloadError as e:
                    return {
                        "ok": False,
                        "message": f"signal {signal_name!r} to run {id!r} was not sent: its "
                        f"payload does not fit the signal's type: {e}",
                    }
            sent = declared if declared is not None else signal_def(signal_name)
            await engine.get(id).signal(sent, payload, dedup=dedup)
            reply: dict[str, Any] = {
                "ok": True,
                "message": f"signal {signal_name!r} delivered to run {id!r}",
            }
            if signal_name not in signals:
                reply["warning"] = _unknown_signal(signal_name, signals)
            return reply
        if op == "cancel":
            await engine.get(id).cancel(command.get("reason") or "cancelled from the fusee command")
            return {"ok": True, "message": f"run {id!r} cancelled"}
        if op == "resume":
            await engine.get(id).resume()
            return {"ok": True, "message": f"run {id!r} resumed"}
        if op == "stop":
            return {"ok": True, "message": "worker stopping", "stop": True}
        return {"ok": False, "message": f"unknown command {op!r}"}
    except (FuseeError, ValueError, KeyError, TypeError) as e:
        return {"ok": False, "message": f"{op} of run {id!r} failed: {e}"}


async def drain_inbox(
    engine: Engine, data: Path, out: Output, signals: Mapping[str, SignalDef[Any] | None]
) -> bool:
    """Applies the queued commands, oldest first; True when one asked the worker to stop."""
    inbox = data / INBOX
    stop = False
    for path in sorted(inbox.glob("*.json")):
        try:
            command = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(command, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            reply: dict[str, Any] = {"ok": False, "message": f"unreadable command: {e}"}
        else:
            reply = await apply_command(engine, command, path.name, signals)
        stop = stop or bool(reply.get("stop"))
        _write_atomically(inbox / REPLIES / path.name, reply)
        path.unlink(missing_ok=True)
        mark = ("  > ", "cyan") if reply["ok"] else ("  ! ", "red")
        out.say(mark, str(reply["message"]))
        if "warning" in reply:
            out.say(("  ? ", "yellow"), str(reply["warning"]))
    return stop


def prune_replies(data: Path) -> None:
    cutoff = time.time() - _REPLY_TTL_S
    for path in (data / INBOX / REPLIES).glob("*.json"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
