"""What the two sides of the peer benchmark share: arguments, clocks, output.

Imported by `fusee_workloads.py` (the project's venv) and `dbos_workloads.py`
(bench/.venv-dbos), so it must stay standard library only: importing fusee or
dbos here would make one side depend on the other's virtualenv.

A side runs one workload per process and prints exactly one result line,
a JSON object carrying `RESULT_TAG`; the harness ignores everything else on
stdout, so a library that prints cannot corrupt the figures.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

RESULT_TAG = "peers_result"

# A side exits with this when the system it measures is not there at all
# (fusee before its engine lands): the harness reports "not available" and
# goes on, where any other non-zero exit is a failure it reports as one.
EXIT_MISSING = 3

# The same small workflows, under ids no timed run uses, before the clock
# starts: first-call costs (lazy imports, SQL statement caches, the first
# thread of a pool) belong to neither system's steady state.
WARMUP_PREFIX = "warm-"
WARMUP_STEPS = 10
WARMUP_WORKFLOWS = 2


@dataclass(frozen=True, slots=True)
class Args:
    """One child process's orders: which workload, on which store, how big."""

    workload: str
    store: str
    directory: str
    steps: int
    workflows: int
    url: str = ""  # the database, for --store postgres


def parse_args(argv: Sequence[str], *, workloads: Sequence[str], stores: Sequence[str]) -> Args:
    """Parse a side's command line (the harness builds it; see compare.py).

    Args:
        argv: the arguments, without the program name.
        workloads: the workload names this side implements.
        stores: the stores this side can run on.

    Returns:
        The parsed orders.
    """
    p = argparse.ArgumentParser(description="Run one peer-benchmark workload once.")
    p.add_argument("workload", choices=list(workloads))
    p.add_argument("--store", choices=list(stores), required=True)
    p.add_argument("--dir", required=True, help="a fresh, empty directory for the database")
    p.add_argument("--steps", type=int, required=True, help="steps per workflow (W3: gathered)")
    p.add_argument("--workflows", type=int, default=1, help="workflows started at once (W2)")
    p.add_argument("--url", default="", help="the database's postgresql:// URL (--store postgres)")
    ns = p.parse_args(list(argv))
    if ns.steps < 1 or ns.workflows < 1:
        p.error("--steps and --workflows must be at least 1")
    if (ns.store == "postgres") != bool(ns.url):
        p.error("--url goes with --store postgres, and --store postgres needs it")
    return Args(ns.workload, ns.store, ns.dir, ns.steps, ns.workflows, ns.url)


class StepClock:
    """Counts step-function calls and, for W5, when each one started.

    W5's latency is the time from the start of one step function to the
    start of the next in the same workflow. It is measured the same way on
    both systems, inside the step function, so it covers everything the
    system does between two steps of a workflow: recording the result
    durably, resuming the workflow, and starting the next step (for fusee,
    waiting for its gate).
    """

    __slots__ = ("calls", "starts")

    def __init__(self) -> None:
        self.calls = 0
        self.starts: dict[int, list[float]] = {}

    def tick(self) -> None:
        """Count one step-function call."""
        self.calls += 1

    def mark(self, workflow: int) -> None:
        """Count one call and note when it started, for workflow number ``workflow``."""
        self.calls += 1
        self.starts.setdefault(workflow, []).append(time.perf_counter())

    def gaps_ms(self, workflows: int, steps: int) -> list[float]:
        """Start-to-start gaps of consecutive steps, in ms, over every workflow.

        Raises:
            RuntimeError: a workflow's steps did not each run exactly once.
        """
        gaps: list[float] = []
        for k in range(workflows):
            starts = self.starts.get(k, [])
            if len(starts) != steps:
                raise RuntimeError(
                    f"workflow {k} ran {len(starts)} step functions, expected {steps}: "
                    "a step ran twice or not at all, so the figures would be wrong"
                )
            gaps.extend((b - a) * 1e3 for a, b in itertools.pairwise(starts))
        return gaps


def latency_figures(gaps_ms: Sequence[float]) -> dict[str, float]:
    """p50, p90 and p99 of the gaps (inclusive quantiles), and p99 / p50."""
    if len(gaps_ms) < 2:
        raise RuntimeError("W5 needs at least 2 step gaps: run W2 with 2 or more steps")
    cuts = statistics.quantiles(gaps_ms, n=100, method="inclusive")
    p50, p90, p99 = cuts[49], cuts[89], cuts[98]
    return {
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "p99_over_p50": p99 / p50 if p50 > 0 else float("inf"),
        "latency_samples": float(len(gaps_ms)),
    }


def check_calls(clock: StepClock, expected: int) -> None:
    """Fail the run unless every timed step function ran exactly once."""
    if clock.calls != expected:
        raise RuntimeError(
            f"{clock.calls} step functions ran, expected {expected}: "
            "a step ran twice or not at all, so the figures would be wrong"
        )


def emit(
    args: Args,
    seconds: float,
    cpu_seconds: float,
    steps: int,
    extra: dict[str, float],
    meta: dict[str, Any],
) -> None:
    """Print the one result line: steps/s over the timed region, and ``extra`` figures.

    ``cpu_seconds`` (the process's CPU time over the same region, all threads)
    goes along because on a busy machine it moves much less than wall time.
    """
    figures = {
        "seconds": seconds,
        "steps": float(steps),
        "steps_per_s": steps / seconds,
        "cpu_us_per_step": cpu_seconds / steps * 1e6,
        **extra,
    }
    line = {
        RESULT_TAG: 1,
        "ok": True,
        "workload": args.workload,
        "store": args.store,
        "size": {"steps": args.steps, "workflows": args.workflows},
        "figures": figures,
        "meta": meta,
    }
    print(json.dumps(line), flush=True)


def emit_missing(detail: str) -> NoReturn:
    """Report that the system is not there at all, and exit with `EXIT_MISSING`."""
    print(json.dumps({RESULT_TAG: 1, "ok": False, "missing": detail}), flush=True)
    sys.exit(EXIT_MISSING)


def _is_loopback(host: object) -> bool:
    if host is None:
        return True  # getaddrinfo(None, ...) names the local host
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _guard(event: str, args: tuple[Any, ...]) -> None:
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        target = args[1] if len(args) > 1 else None
        # AF_UNIX addresses are paths, and the sendmsg/sendto forms of an
        # already connected socket carry none: neither leaves the machine.
        if target is None or isinstance(target, (str, bytes)):
            return
        if isinstance(target, tuple) and target and _is_loopback(target[0]):
            return
    elif event == "socket.getaddrinfo":
        target = args[0]
        if _is_loopback(target):
            return
    else:
        return
    raise PermissionError(
        f"peer benchmark: {event} to {target!r} refused: this benchmark must not "
        "reach the network (only loopback); find what in the measured library dialed out "
        "and switch it off in its configuration"
    )


def install_network_guard() -> None:
    """Refuse, for the rest of the process, any socket use that leaves the machine.

    An audit hook, so it holds for every library in the process and cannot be
    removed; both sides install it, so its (tiny) cost falls on both alike.
    """
    sys.addaudithook(_guard)
