"""examples/project, installed into a new venv as a new project would be, passes its tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fresh_venv import FreshVenv, deprecations, fresh_venv

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "project"


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    return fresh_venv(tmp_path_factory)


def test_the_example_project_installs_passes_its_tests_and_type_checks(
    venv: FreshVenv, tmp_path: Path
) -> None:
    # A copy, as a user makes one (and the checkout gets no build/ of pip's).
    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # Its dependency on fusee[test] is met by the wheel the venv already has.
    installed = venv.run("pip", "install", "--disable-pip-version-check", ".[test]", cwd=project)
    assert deprecations(installed.stdout + installed.stderr) == []
    tested = venv.run("pytest", "-p", "no:cacheprovider", cwd=project)
    assert "3 passed" in tested.stdout, tested.stdout
    # Its own mypy settings (strict, the src layout), against the installed fusee.
    checked = venv.mypy(cwd=project)
    assert "Success: no issues found in 3 source files" in checked.stdout, checked.stdout
