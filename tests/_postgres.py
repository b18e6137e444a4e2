"""A throwaway PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl`` in a temp dir.

`Cluster.start()` finds the server's programs (on PATH, in Debian's
``/usr/lib/postgresql/*/bin``, or in the ``pgserver`` wheel), creates a cluster in a new temporary
directory, and starts it on 127.0.0.1 only, on a free port, with its unix
socket in that directory and ``fsync`` on (the durability the store
promises is the one tested). `Cluster.stop()` stops it and removes the
directory. Postgres refuses to run as root; as root (CI), the cluster runs
as the ``postgres`` user Debian's package creates, owning the directory.

The rule: a cluster is stopped by whoever started it, even when a test
fails (the session fixture's ``finally``); nothing is left running.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import asyncpg

from fusee.store.postgres import PostgresStore

__all__ = ["Cluster", "fail_next_append", "find_bin_dir", "flip_a_byte"]

_PROGRAMS: Final = ("initdb", "pg_ctl", "postgres")
# The superuser the tests connect as; its password is made per cluster so
# that the wrong-password test meets real password authentication.
USER: Final = "fusee"
# How long pg_ctl waits for the server to start or stop.
_WAIT_S: Final = 60


def find_bin_dir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    PATH first, then the newest ``/usr/lib/postgresql/*/bin`` (Debian keeps
    the server's programs there, off PATH), then the binaries the
    ``pgserver`` wheel ships (for a machine without root or without the
    package: ``pip install pgserver``; found without importing it).

    Raises:
        RuntimeError: No PostgreSQL server is installed; says how to get one.
    """
    found = shutil.which("initdb")
    if found is not None:
        directory = Path(found).resolve().parent
        if all((directory / p).exists() for p in _PROGRAMS):
            return directory
    candidates = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda d: _major(d.parent.name),
    )[::-1]
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    for directory in candidates:
        if all((directory / p).exists() for p in _PROGRAMS):
            return directory
    raise RuntimeError(
        "no PostgreSQL server found (initdb on PATH, in /usr/lib/postgresql/*/bin or from "
        "the pgserver wheel); run scripts/system-deps.sh (Debian: apt-get install postgresql) "
        "or, without root, pip install pgserver"
    )


def _major(name: str) -> int:
    return int(name) if name.isdigit() else 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """One PostgreSQL server in a temporary directory, for one test session.

    Attributes:
        directory: The temporary directory (data, socket, log).
        port: The TCP port on 127.0.0.1.
        password: The superuser's password (user `USER`).
    """

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir if bin_dir is not None else find_bin_dir()
        self.directory = Path(tempfile.mkdtemp(prefix="fusee-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.port = 0
        self.password = secrets.token_urlsafe(16)
        self._run_as = _server_user()
        self._names = itertools.count(1)
        self.running = False

    @property
    def dsn(self) -> str:
        """The DSN of the ``postgres`` database, as the superuser, over TCP."""
        return self.dsn_for("postgres")

    def dsn_for(self, database: str, *, password: str | None = None) -> str:
        """The DSN of ``database``, with ``password`` (the real one by default)."""
        secret = quote(self.password if password is None else password, safe="")
        return f"postgresql://{USER}:{secret}@127.0.0.1:{self.port}/{database}"

    def new_name(self, prefix: str = "t") -> str:
        """A name (schema, database) not handed out before by this cluster."""
        return f"{prefix}{next(self._names)}"

    def new_store(self, **kw: Any) -> PostgresStore:
        """A fresh, empty store (not opened yet): a schema of its own in ``postgres``.

        A new schema costs its tables' creation at ``open`` (a few
        milliseconds); a new database from ``template0`` costs ~40 ms more.
        ``durability="none"`` unless given, as the tests' SQLite stores.
        """
        kw.setdefault("durability", "none")
        return PostgresStore(self.dsn, schema=self.new_name("store_"), **kw)

    def start(self) -> Cluster:
        """Creates the cluster and starts the server; waits until it accepts connections."""
        try:
            self._chown(self.directory)
            pwfile = self.directory / "pwfile"
            pwfile.write_text(self.password + "\n")
            self._chown(pwfile)
            self._run(
                "initdb",
                "-D", str(self.data),
                "-U", USER,
                f"--pwfile={pwfile}",
                # Passwords over TCP (the tests connect there); the unix
                # socket, in a directory only the server's user can enter, trusts.
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E", "UTF8",
                "--locale=C",
                "--no-instructions",
            )  # fmt: skip
            pwfile.unlink()
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self) -> None:
        # A free port may be taken between looking and binding: try a few.
        for _ in range(5):
            self.port = _free_port()
            options = " ".join(
                [
                    "-c listen_addresses=127.0.0.1",
                    f"-c port={self.port}",
                    f"-c unix_socket_directories={self.directory}",
                    "-c fsync=on",
                    # Many stores (one schema each) per test session.
                    "-c max_connections=200",
                    "-c log_min_messages=warning",
                ]
            )
            result = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                "-t", str(_WAIT_S), "-o", options, "start", check=False,
            )  # fmt: skip
            if result.returncode == 0:
                self.running = True
                return
        raise RuntimeError(f"PostgreSQL did not start: {self.log_tail()}")

    def restart(self) -> None:
        """Stops the server (fast: connections are cut) and starts it on the same port."""
        # With its log file, as `start` has: a server writing to pg_ctl's own
        # output would hold the pipe open, and this would wait forever.
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", str(_WAIT_S), "-m", "fast", "restart",
        )  # fmt: skip

    def stop(self) -> None:
        """Stops the server (if running) and removes the directory; safe to call twice."""
        try:
            if self.running:
                self._run(
                    "pg_ctl", "-D", str(self.data), "-w", "-t", str(_WAIT_S),
                    "-m", "immediate", "stop", check=False,
                )  # fmt: skip
                self.running = False
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log (for a failure's message)."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no server log)"

    def _chown(self, path: Path) -> None:
        if self._run_as is not None:
            os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command: Sequence[str] = [str(self.bin_dir / program), *args]
        if self._run_as is not None:
            command = ["runuser", "-u", self._run_as.pw_name, "--", *command]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            check=False,
            # The server must not inherit a locale or a PG* setting of the caller's.
            env={**_clean_env(), "LC_ALL": "C"},
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n"
                f"{self.log_tail()}"
            )
        return result

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def flip_a_byte(store: PostgresStore, lsn: int) -> None:
    """Damages the last byte of the record at ``lsn``, as a bad disk would (for engine tests)."""
    conn = await asyncpg.connect(store._dsn)
    try:
        table = f'"{store.schema}".journal'
        data: bytes = await conn.fetchval(f"SELECT data FROM {table} WHERE lsn = $1", lsn)
        damaged = data[:-1] + bytes([data[-1] ^ 0x40])
        await conn.execute(f"UPDATE {table} SET data = $1 WHERE lsn = $2", damaged, lsn)
    finally:
        await conn.close()


def fail_next_append(store: PostgresStore) -> None:
    """The store's next append fails inside its transaction, as a full disk would."""
    store.fail_next_append(asyncpg.DiskFullError("injected: disk full"))


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "LANG"))}


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: None for the current user; ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "PostgreSQL refuses to run as root, and there is no 'postgres' user to run it "
            "as; install Debian's postgresql package (scripts/system-deps.sh), which creates it"
        ) from None
