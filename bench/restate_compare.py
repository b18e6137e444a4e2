"""fusee against Restate, measured side by side (optional: ``make bench-restate``).

The workloads of bench/peers_compare.py (W1, W2 with W5's latencies, W3;
see bench/peers/compare.py) on fusee (SQLite fsync and memory, the
project's venv) and on Restate: the server from the npm package
@restatedev/restate-server, the Python SDK restate-sdk served by hypercorn,
both pinned below and installed here on first use, into bench/.restate-server
and bench/.venv-restate. The Restate side is bench/peers/restate_workloads.py.

As in peers_compare: every repetition of every workload on every system is
a fresh process on a fresh directory, repetitions interleaved, medians of 3
(1 in quick mode); a ratio is fusee fsync's median over Restate's. Each
Restate repetition runs in a network namespace of its own with only
loopback (``unshare -rn``): the server, the SDK's service and the client
inside it, since the server tries to reach the internet when it starts.

Not part of ``make bench`` (bench/run.py leaves it out unless named): it
needs npm and unprivileged user namespaces, and takes a few minutes.

    python bench/restate_compare.py [--quick] [--repeat N] [--workloads W1,W2,W3]
                                    [--systems fusee,restate] [--timeout S] [--keep] [-v]
    FUSEE_BENCH_QUICK=1 python bench/run.py restate_compare    # smoke test
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# bench/ is on sys.path when this file runs as a script, so the harness of
# bench/peers_compare.py is importable as `peers.compare`, as it is there.
from peers.compare import Config, Figure, Outcome, Peer, SetupError, ensure_venv, log, main

BENCH = Path(__file__).resolve().parent

# The newest on npm and PyPI when this was written.
SERVER_VERSION = "1.7.12"
SDK_VERSION = "1.3.0"
HYPERCORN_VERSION = "0.18.0"
SERVER_PACKAGE = f"@restatedev/restate-server@{SERVER_VERSION}"
REQUIREMENTS = {"restate-sdk": SDK_VERSION, "hypercorn": HYPERCORN_VERSION}

SERVER_PREFIX = BENCH / ".restate-server"
RESTATE_VENV = BENCH / ".venv-restate"
# Written here: the venv's python, started in a new network namespace.
NETNS_PYTHON = RESTATE_VENV / "bin" / "python-netns"

RESTATE = Config(
    "restate", "restate", "restate", f"Restate {SERVER_VERSION}, Python SDK {SDK_VERSION}"
)


def _run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kwargs)


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 8) -> str:
    return "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-lines:])


def server_binaries() -> list[Path]:
    # The package installs the binary of this platform only.
    pattern = "node_modules/@restatedev/restate-server-*/bin/restate-server"
    return sorted(SERVER_PREFIX.glob(pattern))


def _installed_server() -> str | None:
    for binary in server_binaries():
        out = _run([str(binary), "--version"])
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[-1]
    return None


def ensure_server() -> None:
    """Install the pinned restate-server from npm into bench/.restate-server.

    Raises:
        SetupError: npm is missing or cannot install it.
    """
    if _installed_server() == SERVER_VERSION:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SetupError(f"npm is needed to install {SERVER_PACKAGE}; install Node.js and npm")
    log(f"installing {SERVER_PACKAGE} into {SERVER_PREFIX} (from npm)")
    SERVER_PREFIX.mkdir(parents=True, exist_ok=True)
    # --ignore-scripts: the package's one install script is a usage report.
    env = {**os.environ, "SCARF_ANALYTICS": "false"}
    installed = _run(
        [
            npm,
            "install",
            "--prefix",
            str(SERVER_PREFIX),
            "--save-exact",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            SERVER_PACKAGE,
        ],
        env=env,
    )
    if installed.returncode != 0 or _installed_server() != SERVER_VERSION:
        raise SetupError(
            f"could not install {SERVER_PACKAGE} into {SERVER_PREFIX}; is the npm registry "
            f"reachable? Delete {SERVER_PREFIX} and run again. npm said:\n{_tail(installed)}"
        )


def ensure_netns_python(python: Path) -> Path:
    """Write `NETNS_PYTHON`: ``python`` in a new network namespace, loopback only.

    Raises:
        SetupError: ``unshare -rn`` (unprivileged user and network namespaces) or
            ``ip`` is not available here.
    """
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        raise SetupError("the Restate benchmark needs unshare (util-linux) and ip (iproute2)")
    probe = _run([unshare, "-rn", "sh", "-c", '"$0" link set lo up', ip])
    if probe.returncode != 0:
        raise SetupError(
            "`unshare -rn` cannot make a loopback-only network namespace here "
            f"(unprivileged user namespaces off?); the Restate server must not run "
            f"outside one. It said:\n{_tail(probe)}"
        )
    NETNS_PYTHON.write_text(
        "#!/bin/sh\n"
        "# Written by bench/restate_compare.py: this venv's python in a new user and\n"
        "# network namespace whose only interface is loopback, so that the Restate\n"
        "# server, the SDK's service and the client cannot leave the machine.\n"
        f'exec {shlex.quote(unshare)} -rn sh -c \'"$0" link set lo up && exec "$@"\' '
        f'{shlex.quote(ip)} {shlex.quote(str(python.absolute()))} "$@"\n'
    )
    NETNS_PYTHON.chmod(0o755)
    return NETNS_PYTHON


def ensure_restate() -> Path:
    """Install the server and the SDK (if need be); return the python to run the side with."""
    ensure_server()
    return ensure_netns_python(ensure_venv(RESTATE_VENV, REQUIREMENTS))


def _restate_version(meta: Mapping[str, Any]) -> str | None:
    ran = (meta.get("version"), meta.get("sdk"))
    pinned = (SERVER_VERSION, SDK_VERSION)
    return None if ran == pinned else f"ran restate {ran}, not {pinned}"


def _cpu_split(fig: Figure, outcome: Outcome) -> dict[str, Any]:
    # Restate's CPU per step is two processes': the split.
    if fig.metric != "steps_per_s":
        return {}
    parts = ("server_cpu_us_per_step", "sdk_cpu_us_per_step")
    return {p: round(statistics.median(f[p] for f in outcome.figures), 1) for p in parts}


RESTATE_PEER = Peer(
    config=RESTATE,
    name="Restate",
    script="bench/restate_compare.py",
    bench="restate_compare",
    describe=(
        f"restate-server {SERVER_VERSION}, restate-sdk {SDK_VERSION}, hypercorn {HYPERCORN_VERSION}"
    ),
    setup=ensure_restate,
    label=lambda meta: RESTATE.label,
    wrong_version=_restate_version,
    more=_cpu_split,
)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], RESTATE_PEER))
