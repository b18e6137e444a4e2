"""Engine versions: which code a run started on, so that a deploy does not replay it on other code.

An engine has a version: the one ``Engine.open(..., version=)`` gives (a
release name, a git commit), or one derived from its workflows' code
(`derived_version`: a hash of each workflow function's source). Every run
records the version it started on: its `fusee.record.Start` carries
`version_number` of it (the journal's ``version``, a 32-bit number), and its
row the version's name (``describe().version``).

A run of a ``versioning="pinned"`` workflow (the default) runs on its
version only, as Temporal's pinned workflows and DBOS's application versions
do: an engine of another version neither recovers it nor loads it for a
message; a worker of its version does (on Postgres, where workers of several
versions share a store during a rolling deploy, each version's workers
serve its runs: `fusee.engine._leases`). A run of a
``versioning="auto"`` workflow moves to the version of the engine that
loads it next, which replays its journal: the code's changes go behind
``ctx.patched``. A run started before fusee recorded versions (its `Start`
says `UNVERSIONED`) runs on any version.

The rule: the version a run started on is data in its journal; the engine
compares it, never the code's shape, to decide whether it may run it.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import types
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "UNVERSIONED",
    "VersionLine",
    "check_version",
    "derived_version",
    "version_lines",
    "version_number",
]

UNVERSIONED: Final = 1
"""The ``Start.version`` of a run started before versions were recorded: any engine runs it."""

_VERSION: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+@/-]{0,99}")


def check_version(version: object) -> str:
    """``version`` if it can name an engine version: 1 to 100 characters, no spaces.

    Raises:
        ValueError: It cannot.

    Example:
        >>> check_version("2026.03.1")
        '2026.03.1'
    """
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise ValueError(
            f"an engine version is 1 to 100 letters, digits and ._:+@/- (a release, a git "
            f"commit), starting with a letter or digit; got {version!r}"
        )
    return version


def _code(fn: Any) -> bytes:
    try:
        return inspect.getsource(fn).encode()
    except (OSError, TypeError):
        # No source (a REPL, a frozen app): its bytecode stands in for it.
        code = getattr(fn, "__code__", None)
        return _bytecode(code) if isinstance(code, types.CodeType) else fn.__qualname__.encode()


def _bytecode(code: types.CodeType) -> bytes:
    # Not marshal: its output depends on reference counts.
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_bytecode(const))
        elif isinstance(const, frozenset):
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(repr(const).encode())
    return b"\0".join(parts)


def derived_version(workflows: Iterable[Any]) -> str:
    """The version of an engine given none: a hash of its workflows' names and source.

    It changes when a workflow function's text changes, not when code it
    calls does: give ``Engine.open(..., version=)`` a release name to cover
    that too.

    Example:
        >>> len(derived_version([]))
        12
    """
    digest = hashlib.sha256()
    for wf in sorted(workflows, key=lambda wf: str(wf.name)):
        digest.update(str(wf.name).encode() + b"\0" + _code(wf.fn) + b"\0")
    return digest.hexdigest()[:12]


def version_number(version: str) -> int:
    """The number a `Start` records for ``version`` (never `UNVERSIONED`).

    Example:
        >>> version_number("v1") == version_number("v1") != version_number("v2")
        True
    """
    n = zlib.crc32(version.encode())
    return n if n > UNVERSIONED else n + 2


@dataclass(frozen=True, slots=True)
class VersionLine:
    """One version of a store's runs (`version_lines`): what ``fusee versions`` prints.

    Attributes:
        version: The engine version ("" for runs with none: started before
            versions were recorded, or queued and not yet started).
        runs: Its unfinished runs.
        workers: The live workers that run it.
        warning: Why its runs may not go on (runs, and no worker of it), or None.

    Example:
        >>> VersionLine("v1", 2, ("w-1",), None).runs
        2
    """

    version: str
    runs: int
    workers: tuple[str, ...]
    warning: str | None

    def as_json(self) -> dict[str, Any]:
        """The line as ``fusee versions --json`` and the UI's API give it.

        Example:
            >>> VersionLine("v1", 0, (), None).as_json()["version"]
            'v1'
        """
        return {
            "version": self.version or None,
            "runs": self.runs,
            "workers": list(self.workers),
            "warning": self.warning,
        }


def version_lines(
    unfinished: Iterable[Any], workers: Mapping[str, str] | None
) -> list[VersionLine]:
    """The unfinished runs per version, with the live workers (name -> version) of each.

    ``workers`` is None when who serves the store is unknown: then no
    version is warned about. A version with unfinished runs and no worker
    is: its pinned runs wait until a worker of it runs.

    Example:
        >>> from fusee.store import RunRow
        >>> rows = [RunRow("a", 1, "wf", "running", 0, version="v1")]
        >>> [line.warning is not None for line in version_lines(rows, {"w-2": "v2"})]
        [True, False]
    """
    counts: dict[str, int] = {}
    for row in unfinished:
        counts[row.version] = counts.get(row.version, 0) + 1
    serving: dict[str, list[str]] = {}
    for name, version in (workers or {}).items():
        serving.setdefault(version, []).append(name)
        counts.setdefault(version, 0)
    lines: list[VersionLine] = []
    for version in sorted(counts):
        who = tuple(sorted(serving.get(version, ())))
        warning = None
        if workers is not None and version and counts[version] and not who:
            warning = (
                f"{counts[version]} unfinished run(s) started on version {version!r} and no "
                "worker runs it: its pinned runs wait until a worker of that version runs"
            )
        lines.append(VersionLine(version, counts[version], who, warning))
    return lines
