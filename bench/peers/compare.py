"""The peer-benchmark harness: fusee and DBOS Transact, side by side.

Issue "Performance: ten times the peers, measured side by side". Workloads,
each step an async function returning ``i + 1``:

- W1: one workflow, 1,000 sequential steps (steps/s).
- W2: 200 workflows started at once, 10 sequential steps each (steps/s).
- W3: one workflow gathering 500 concurrent steps (steps/s).
- W5: step latency p50/p90/p99 under W2's load, taken from the W2 runs:
  the time from the start of one step function to the start of the next in
  the same workflow (see `_common.StepClock`).

Systems: fusee on SQLite with ``durability="fsync"`` and on the memory
store; DBOS Transact (pinned below) on its SQLite system database, in its
own virtualenv bench/.venv-dbos, created here on first use.

Every repetition of every workload on every system is a fresh process on a
fresh database in a new temporary directory; repetitions are interleaved
(W1 on each system, then W2 ..., then the next repetition) so that a noisy
spell of the machine does not land on one system only. Each process times
its workload from the first start to the last result, after a small
warm-up and excluding open and close; figures are medians over the
repetitions, and a ratio is the median of fusee's over the median of DBOS's.

The one rule: the harness imports neither fusee nor dbos, it only starts
processes, so a missing engine costs fusee's figures and nothing else.

    python bench/peers_compare.py [--quick] [--repeat N] [--workloads W1,W2,W3]
                                  [--systems fusee,dbos] [--timeout S] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from peers._common import EXIT_MISSING, RESULT_TAG

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent

DBOS_VERSION = "3.4.0"  # the newest 3.4.x on PyPI when this was written
DBOS_VENV = BENCH / ".venv-dbos"

QUICK_ENV = "FUSEE_BENCH_QUICK"
TMPDIR_ENV = "FUSEE_BENCH_TMPDIR"
FULL_REPEAT = 3

# Stripped from the children's environment: DBOS* would point DBOS at
# DBOS Cloud, Conductor or an OTLP endpoint; FUSEE_* could switch fusee to
# its dev profile (strict replay); PYTHON* could turn on dev mode, asyncio
# debug or tracemalloc. Either would measure something else.
STRIPPED_ENV_PREFIXES = ("DBOS", "FUSEE_", "PYTHON")


@dataclass(frozen=True, slots=True)
class Config:
    """One system under test on one store."""

    key: str
    system: str  # "fusee" or "dbos": which side's module runs it
    store: str  # the side's --store
    label: str  # as it appears in figure names


FUSEE_FSYNC = Config("fusee-fsync", "fusee", "sqlite-fsync", "fusee sqlite fsync")
FUSEE_MEMORY = Config("fusee-memory", "fusee", "memory", "fusee memory")
DBOS_SQLITE = Config("dbos", "dbos", "sqlite", "DBOS sqlite")
ALL_CONFIGS = (FUSEE_FSYNC, FUSEE_MEMORY, DBOS_SQLITE)
FUSEE_ONLY = (FUSEE_FSYNC, FUSEE_MEMORY)


@dataclass(frozen=True, slots=True)
class Figure:
    """A figure one workload's runs produce, for each config that runs it."""

    metric: str  # the key in the side's "figures"
    title: str
    digits: int
    goals: Mapping[str, str] = field(default_factory=dict)  # config key -> goal
    # Set where the issue compares fusee with the peer: the figure
    # "<workload> ratio fusee fsync / DBOS" (fusee's median over DBOS's).
    ratio_goal: str | None = None


@dataclass(frozen=True, slots=True)
class Size:
    steps: int
    workflows: int = 1


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload, its sizes, the configs that run it and what it yields.

    A fusee-only workload (W4 parking, W6 replay) lists `FUSEE_ONLY` as its
    configs; it then has no ratio.
    """

    name: str
    full: Size
    quick: Size
    figures: tuple[Figure, ...]
    configs: tuple[Config, ...] = ALL_CONFIGS


def _fusee_goal(goal: str) -> dict[str, str]:
    return {FUSEE_FSYNC.key: goal, FUSEE_MEMORY.key: goal}


PEER_RATIO_GOAL = ">= 10"  # the issue: ten times the peers
# Ratio goals retired by issue 33, by (workload, benchmark): W1 at ten times
# Restate asks for a step in less than one flush of the disk (bench/NOTES.md).
RETIRED_RATIO_GOALS = {("W1", "restate_compare")}

WORKLOADS = (
    Workload(
        "W1",
        full=Size(1000),
        quick=Size(100),
        figures=(
            Figure(
                "steps_per_s",
                "W1 steps/s",
                1,
                {FUSEE_FSYNC.key: ">= 5000", FUSEE_MEMORY.key: ">= 50000"},
                PEER_RATIO_GOAL,
            ),
        ),
    ),
    Workload(
        "W2",
        full=Size(10, 200),
        quick=Size(10, 20),
        figures=(
            Figure("steps_per_s", "W2 steps/s", 1, _fusee_goal(">= 25000"), PEER_RATIO_GOAL),
            Figure("p50_ms", "W5 step latency p50 ms", 3),
            Figure("p90_ms", "W5 step latency p90 ms", 3),
            Figure("p99_ms", "W5 step latency p99 ms", 3),
            Figure("p99_over_p50", "W5 step latency p99/p50", 2, _fusee_goal("<= 1.5")),
        ),
    ),
    Workload(
        "W3",
        full=Size(500),
        quick=Size(50),
        figures=(Figure("steps_per_s", "W3 steps/s", 1, _fusee_goal(">= 25000"), PEER_RATIO_GOAL),),
    ),
)


class SetupError(Exception):
    """The peer cannot be installed or run at all."""


@dataclass(slots=True)
class Outcome:
    """What the repetitions of one workload on one config came to."""

    figures: list[dict[str, float]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class Opts:
    quick: bool
    repeat: int
    workloads: tuple[Workload, ...]
    systems: frozenset[str]
    timeout: float
    keep: bool
    verbose: bool


def log(message: str) -> None:
    print(f"peers: {message}", file=sys.stderr, flush=True)


def _installed(python: Path, names: Sequence[str]) -> dict[str, str | None]:
    """The version of each package in ``python``'s environment (None: not there)."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run(
        [str(python), "-c", script, *names], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        return dict.fromkeys(names)
    return dict(json.loads(out.stdout))


def ensure_venv(venv: Path, requirements: Mapping[str, str]) -> Path:
    """Create ``venv`` with the pinned ``requirements`` (name: version) unless it has them.

    Returns:
        The venv's python.

    Raises:
        SetupError: the venv cannot be made or pip cannot install them (PyPI unreachable).
    """
    python = venv / "bin" / "python"
    if python.exists() and _installed(python, list(requirements)) == dict(requirements):
        return python
    pins = [f"{name}=={version}" for name, version in requirements.items()]
    if not python.exists():
        log(f"creating {venv} for {' '.join(pins)}")
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False
        )
        if made.returncode != 0:
            raise SetupError(f"could not create {venv}: {made.stderr.strip()}")
    log(f"installing {' '.join(pins)} into {venv} (from PyPI)")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # Short timeouts: an unreachable index should fail in a minute, not hang.
    installed = subprocess.run(
        [*pip, "--timeout", "20", "--retries", "2", *pins],
        capture_output=True,
        text=True,
        check=False,
    )
    if installed.returncode != 0 or _installed(python, list(requirements)) != dict(requirements):
        tail = "\n".join((installed.stderr or installed.stdout).strip().splitlines()[-8:])
        raise SetupError(
            f"could not install {' '.join(pins)} into {venv}; is PyPI reachable? "
            f"Fix that, or delete {venv} and run again, or leave the peer out with "
            f"--systems fusee. pip said:\n{tail}"
        )
    return python


def ensure_dbos_venv() -> Path:
    """Create bench/.venv-dbos with the pinned DBOS unless it is there already."""
    return ensure_venv(DBOS_VENV, {"dbos": DBOS_VERSION})


@dataclass(frozen=True, slots=True)
class Peer:
    """The system fusee is compared with, and how this harness runs it."""

    config: Config  # its ``system`` names its side: peers/<system>_workloads.py
    name: str  # in the ratio figures: "W1 ratio fusee fsync / <name>"
    script: str  # the command that runs the comparison, as its rows record it
    bench: str  # the rows' "bench"
    describe: str  # the rows' "peer": what ran, with versions
    setup: Callable[[], Path]  # installs it if need be; the python its side runs with
    label: Callable[[Mapping[str, Any]], str]  # its name in figures, from a child's meta
    # Why a child's meta shows another version than the pinned one, or None.
    wrong_version: Callable[[Mapping[str, Any]], str | None]
    # Fields added to its rows of a figure (Restate: its two processes' CPU).
    more: Callable[[Figure, Outcome], dict[str, Any]] | None = None

    def workloads(self) -> tuple[Workload, ...]:
        """W1-W3 with this peer in the place of DBOS."""
        configs = (FUSEE_FSYNC, FUSEE_MEMORY, self.config)
        return tuple(replace(w, configs=configs) for w in WORKLOADS)


def _dbos_version(meta: Mapping[str, Any]) -> str | None:
    ran = meta.get("version")
    return None if ran == DBOS_VERSION else f"ran dbos {ran}, not {DBOS_VERSION}"


DBOS = Peer(
    config=DBOS_SQLITE,
    name="DBOS",
    script="bench/peers_compare.py",
    bench="peers",
    describe=f"dbos {DBOS_VERSION}",
    setup=ensure_dbos_venv,
    label=lambda meta: f"DBOS {meta.get('version', DBOS_VERSION)} sqlite",
    wrong_version=_dbos_version,
)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED_ENV_PREFIXES)}
    env["PYTHONPATH"] = str(BENCH)
    return env


def filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` is on, from /proc/mounts ("?" if unknown)."""
    best, kind = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, parts[2]
    return kind


@dataclass(frozen=True, slots=True)
class Child:
    """What one child process said."""

    ok: bool
    missing: str | None
    figures: dict[str, float]
    meta: dict[str, Any]
    error: str


def run_child(
    python: Path, config: Config, workload: Workload, size: Size, tmp_root: str | None, opts: Opts
) -> Child:
    """Run one repetition: a fresh process on a fresh database in a new temp dir."""
    directory = tempfile.mkdtemp(prefix=f"peers-{workload.name}-{config.key}-", dir=tmp_root)
    cmd = [
        str(python),
        "-m",
        f"peers.{config.system}_workloads",
        workload.name,
        "--store",
        config.store,
        "--dir",
        directory,
        "--steps",
        str(size.steps),
        "--workflows",
        str(size.workflows),
    ]
    if opts.verbose:
        log(f"$ {shlex.join(cmd)}")
    try:
        proc = subprocess.run(
            cmd,
            cwd=directory,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=opts.timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Child(False, None, {}, {}, f"timed out after {opts.timeout:g} s")
    finally:
        if not opts.keep:
            shutil.rmtree(directory, ignore_errors=True)
    line: dict[str, Any] | None = None
    for text in proc.stdout.splitlines():
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and RESULT_TAG in parsed:
                line = parsed
    if proc.returncode == EXIT_MISSING and line is not None and "missing" in line:
        return Child(False, str(line["missing"]), {}, {}, "")
    if proc.returncode != 0 or line is None or not line.get("ok"):
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:]) or "(no output)"
        return Child(False, None, {}, {}, f"exit {proc.returncode}:\n{tail}")
    figures = {str(k): float(v) for k, v in line["figures"].items()}
    return Child(True, None, figures, dict(line.get("meta", {})), "")


def parse(argv: Sequence[str], peer: Peer) -> Opts:
    system = peer.config.system
    p = argparse.ArgumentParser(
        prog=Path(peer.script).name,
        description=f"fusee and {peer.name}, side by side (see {peer.script}).",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get(QUICK_ENV, "") not in ("", "0"),
        help=f"smoke test: small workloads, 1 repetition (also {QUICK_ENV}=1)",
    )
    p.add_argument("--repeat", type=int, help=f"repetitions (default {FULL_REPEAT}; quick: 1)")
    workloads = peer.workloads()
    names = [w.name for w in workloads]
    p.add_argument("--workloads", default=",".join(names), help="comma-separated")
    p.add_argument("--systems", default=f"fusee,{system}", help=f"comma-separated: fusee, {system}")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    p.add_argument("-v", "--verbose", action="store_true", help="print each child's command")
    ns = p.parse_args(list(argv))
    wanted = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        p.error(f"unknown workloads {unknown}; choose from {names}")
    systems = frozenset(s.strip() for s in ns.systems.split(",") if s.strip())
    if not systems or not systems <= {"fusee", system}:
        p.error(f"--systems takes fusee, {system} or both")
    repeat = ns.repeat if ns.repeat is not None else (1 if ns.quick else FULL_REPEAT)
    if repeat < 1:
        p.error("--repeat must be at least 1")
    chosen = tuple(w for w in workloads if w.name in wanted)
    return Opts(ns.quick, repeat, chosen, systems, ns.timeout, ns.keep, ns.verbose)


def command_line(argv: Sequence[str], peer: Peer) -> str:
    quick = os.environ.get(QUICK_ENV)
    prefix = f"{QUICK_ENV}={shlex.quote(quick)} " if quick else ""
    return prefix + shlex.join(["python", peer.script, *argv])


def label(config: Config, outcome: Outcome, peer: Peer) -> str:
    # The peer's version is part of its name in every figure it appears in.
    if config.key == peer.config.key:
        return peer.label(outcome.meta)
    return config.label


def rows_for(
    workload: Workload,
    outcomes: Mapping[str, Outcome],
    opts: Opts,
    common: Mapping[str, Any],
    peer: Peer,
) -> list[dict[str, Any]]:
    """The JSON lines of one workload: each figure per config, then its ratio."""
    suffix = " [quick]" if opts.quick else ""
    size = size_of(workload, opts)
    rows: list[dict[str, Any]] = []
    for fig in workload.figures:
        medians: dict[str, float] = {}
        for config in workload.configs:
            outcome = outcomes.get(config.key)
            if outcome is None or outcome.failure is not None or not outcome.figures:
                continue
            values = [f[fig.metric] for f in outcome.figures]
            medians[config.key] = statistics.median(values)
            row: dict[str, Any] = {
                "bench": peer.bench,
                "figure": f"{fig.title} ({label(config, outcome, peer)}){suffix}",
                "value": round(medians[config.key], fig.digits),
            }
            goal = fig.goals.get(config.key)
            if goal is not None:
                row["goal"] = goal
            row |= {
                "repeat": len(values),
                "values": [round(v, fig.digits) for v in values],
                "workload": workload.name,
                "system": f"{config.system} {outcome.meta.get('version', '?')}",
                "store": config.store,
                "size": {"steps": size.steps, "workflows": size.workflows},
                **common,
            }
            if fig.metric == "steps_per_s":
                cpu = statistics.median(f["cpu_us_per_step"] for f in outcome.figures)
                row["cpu_us_per_step"] = round(cpu, 1)
            if "sqlite" in outcome.meta:
                row["sqlite"] = outcome.meta["sqlite"]
            if config.key == peer.config.key and peer.more is not None:
                row |= peer.more(fig, outcome)
            rows.append(row)
        theirs = medians.get(peer.config.key)
        if fig.ratio_goal is not None and FUSEE_FSYNC.key in medians and theirs is not None:
            ours = medians[FUSEE_FSYNC.key]
            retired = (workload.name, peer.bench) in RETIRED_RATIO_GOALS
            rows.append(
                {
                    "bench": peer.bench,
                    "figure": f"{workload.name} ratio fusee fsync / {peer.name}{suffix}",
                    "value": round(ours / theirs, 2) if theirs else float("inf"),
                    **({} if retired else {"goal": fig.ratio_goal}),
                    "repeat": min(
                        len(outcomes[FUSEE_FSYNC.key].figures),
                        len(outcomes[peer.config.key].figures),
                    ),
                    "workload": workload.name,
                    **common,
                }
            )
    return rows


def size_of(workload: Workload, opts: Opts) -> Size:
    return workload.quick if opts.quick else workload.full


def main(argv: Sequence[str], peer: Peer | None = None) -> int:
    """Run the comparison with ``peer`` (DBOS by default); print one JSON line per figure.

    Returns:
        0 when every run that could run succeeded (fusee's engine missing is
        not a failure), 1 when a run failed, 2 when the peer cannot be set up.
    """
    peer = peer if peer is not None else DBOS
    system = peer.config.system
    opts = parse(argv, peer)
    tmp_root = os.environ.get(TMPDIR_ENV) or None
    tmp_fs = filesystem_of(Path(tmp_root or tempfile.gettempdir()))
    if tmp_fs in ("tmpfs", "ramfs"):
        log(
            f"warning: the temporary directories are on {tmp_fs}, where fsync costs "
            f"nothing; set {TMPDIR_ENV} to a directory on disk for durable figures"
        )
    pythons: dict[str, Path] = {"fusee": Path(sys.executable)}
    if system in opts.systems:
        try:
            pythons[system] = peer.setup()
        except SetupError as e:
            log(str(e))
            return 2
    common: dict[str, Any] = {
        "command": command_line(argv, peer),
        "mode": "quick" if opts.quick else "full",
        "tmp_fs": tmp_fs,
        # The machine may be shared: the load says how far to trust the figures.
        "load_1m_at_start": round(os.getloadavg()[0], 2),
    }
    if system in opts.systems:
        common["peer"] = peer.describe
    log(f"{common['command']}  ({common['mode']}, {opts.repeat} repetition(s), temp on {tmp_fs})")

    outcomes: dict[tuple[str, str], Outcome] = {}
    missing: dict[str, str] = {}  # system -> why
    for rep in range(opts.repeat):
        for workload in opts.workloads:
            size = size_of(workload, opts)
            for config in workload.configs:
                if config.system not in opts.systems or config.system in missing:
                    continue
                outcome = outcomes.setdefault((workload.name, config.key), Outcome())
                if outcome.failure is not None:
                    continue
                child = run_child(pythons[config.system], config, workload, size, tmp_root, opts)
                if child.missing is not None:
                    missing[config.system] = child.missing
                    log(f"{config.system}: not available (engine missing: {child.missing})")
                    continue
                if not child.ok:
                    outcome.failure = child.error
                    log(f"{workload.name} on {config.label}: FAILED, {child.error}")
                    continue
                wrong = peer.wrong_version(child.meta) if config.system == system else None
                if wrong is not None:
                    outcome.failure = wrong
                    log(f"{workload.name} on {config.label}: FAILED, {outcome.failure}")
                    continue
                outcome.figures.append(child.figures)
                outcome.meta = child.meta
                log(
                    f"{workload.name} rep {rep + 1}/{opts.repeat} {config.label}: "
                    f"{child.figures['steps_per_s']:,.1f} steps/s"
                )

    for workload in opts.workloads:
        per_config = {
            c.key: outcomes[(workload.name, c.key)]
            for c in workload.configs
            if (workload.name, c.key) in outcomes
        }
        for row in rows_for(workload, per_config, opts, common, peer):
            print(json.dumps(row), flush=True)

    for system, why in missing.items():
        log(f"{system}: not available (engine missing): {why}")
    failed = sorted(f"{w} on {c}" for (w, c), o in outcomes.items() if o.failure is not None)
    if failed:
        log(f"failed: {', '.join(failed)}")
        return 1
    return 0
