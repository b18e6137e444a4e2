"""A new virtual environment with fusee installed from a wheel, as a new user makes one.

One per test session, shared by the tests that need it (building the wheel
and the venv takes about ten seconds): `fresh_venv` builds it on first use
and hands the same one out after. Tests may install more into it (the
example project) but must not change what is there.

The rule: nothing here reads the repository's `.venv`, except its pip to
build the wheel and its mypy to type-check what the venv holds; the venv
itself gets fusee and its dependencies the way a user's would, from the
package index.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a source distribution of fusee holds: the wheel is built from a copy
# of these, so the checkout gets no build/ or egg-info of a test's making.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "fusee")
# setuptools' and pip's warnings: `SetuptoolsDeprecationWarning: ...`,
# `DEPRECATION: ...`. (pip's `WARNING:` lines about this machine's index
# settings are not the project's, and are not matched.)
DEPRECATION = re.compile(r"[Dd]eprecat|DEPRECATION|\w+Warning\b")


@dataclass(frozen=True)
class FreshVenv:
    """A venv with ``fusee[test]`` installed from the wheel built from this checkout."""

    path: Path
    wheel: Path
    # Everything pip and the build printed, to check for warnings.
    build_output: str
    install_output: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(self, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        """Runs a program of the venv (``"pytest"``, ``"pip"``) in ``cwd``; raises on failure."""
        return run(self.path / "bin" / str(args[0]), *args[1:], cwd=cwd)

    def mypy(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """The checkout's mypy in ``cwd``, checking against what the venv has installed."""
        # One cache per venv: the second check reuses the analysis of fusee and pytest.
        return run(
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            self.python,
            "--cache-dir",
            self.path.parent / "mypy-cache",
            *args,
            cwd=cwd,
        )


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs a command, with its output in the error when it fails."""
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


def deprecations(output: str) -> list[str]:
    """The lines of ``output`` that are deprecation or setuptools warnings."""
    return [line for line in output.splitlines() if DEPRECATION.search(line)]


_made: list[FreshVenv] = []


def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    """The session's venv, made on the first call."""
    if not _made:
        _made.append(_make(tmp_path_factory.mktemp("fresh-venv")))
    return _made[0]


def _make(base: Path) -> FreshVenv:
    source = base / "fusee-src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    wheels = base / "wheels"
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--disable-pip-version-check",
        "--wheel-dir",
        wheels,
        source,
        cwd=base,
    )
    (wheel,) = wheels.glob("fusee-*.whl")
    path = base / "venv"
    venv.create(path, with_pip=True)
    installed = run(
        path / "bin" / "pip",
        "install",
        "--disable-pip-version-check",
        f"{wheel}[test]",
        cwd=base,
    )
    return FreshVenv(
        path,
        wheel,
        built.stdout + built.stderr,
        installed.stdout + installed.stderr,
    )
