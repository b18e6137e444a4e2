"""Shared test settings."""

from __future__ import annotations

import os
from collections.abc import Iterator

# Imported here, at the top of the stack: CPython 3.11.7 raises a spurious
# "AST constructor recursion depth mismatch" when pytest's assertion
# rewriter compiles hypothesis's modules deep inside a plugin hook, which is
# where the hypothesis plugin imports it when no test module did.
import hypothesis
import pytest
from _postgres import Cluster

# pytester runs small pytest sessions (tests/test_pytest_plugin.py checks the plugin's fixtures).
pytest_plugins = ["pytester"]

hypothesis.settings.register_profile("fusee", deadline=None, print_blob=True)
# CI explores the same examples on every run (a property test there must not
# fail by the luck of the draw); machines of developers keep drawing new ones.
hypothesis.settings.register_profile(
    "ci", deadline=None, print_blob=True, derandomize=True, database=None
)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "fusee")


@pytest.fixture(autouse=True)
def _no_errors_logged(fusee_no_errors_logged: None) -> None:
    """Every test fails when an engine logs an unexpected error (fusee.pytest_plugin)."""


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One throwaway PostgreSQL server for the whole session, started when first asked for.

    Tests get fresh stores from it with ``postgres_cluster.new_store()`` (a
    schema each); it is stopped and removed when the session ends.
    """
    with Cluster() as cluster:
        yield cluster
