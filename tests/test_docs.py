"""The docs' runnable code blocks run, their snippets exist, and the install route works.

The install route and the testing page's pytest example run in a new
virtual environment (`fresh_venv`, one per session), as a new user's would.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fresh_venv import FreshVenv, deprecations, fresh_venv

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# A ```python block right after a `<!-- runnable -->` line runs as a program.
RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.DOTALL)
SNIPPET = re.compile(r'--8<-- "([^"]+)"')
# A block right after a `<!-- file: NAME -->` line is a file of a user's project.
PROJECT_FILE = re.compile(r"<!-- file: (\S+) -->\n```\w+\n(.*?)\n```", re.DOTALL)
OUTPUT_COMMENT = re.compile(r"^\s*print\(.*\)\s+# (\S[^:]*?)(?::.*)?$", re.MULTILINE)


def _blocks() -> list[Any]:
    """The runnable blocks, as pytest params named after their page."""
    params: list[Any] = []
    for page in sorted(DOCS.rglob("*.md")):
        for n, match in enumerate(RUNNABLE.finditer(page.read_text(encoding="utf-8"))):
            name = f"{page.relative_to(DOCS).with_suffix('')}-{n}"
            params.append(pytest.param(match.group(1), id=name))
    return params


BLOCKS = _blocks()


def test_the_docs_have_runnable_blocks() -> None:
    assert len(BLOCKS) >= 15


@pytest.mark.parametrize("code", BLOCKS)
def test_a_runnable_block_runs(code: str, request: pytest.FixtureRequest) -> None:
    # A module of its own, registered: the codec resolves its classes' hints through it.
    name = "docs_block_" + re.sub(r"\W", "_", request.node.callspec.id)
    module = types.ModuleType(name)
    sys.modules[name] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"<{name}>", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    # A comment after a print states its output, before any colon: `print(x)  # 42: why`.
    expected = [m.group(1) for m in OUTPUT_COMMENT.finditer(code)]
    printed = out.getvalue()
    for want in expected:
        assert want.strip() in printed, f"{want!r} not in the output:\n{printed}"


def test_every_included_snippet_exists() -> None:
    for page in DOCS.rglob("*.md"):
        for path in SNIPPET.findall(page.read_text(encoding="utf-8")):
            assert (ROOT / path).is_file(), f"{page.name} includes missing {path}"


def test_the_api_reference_lists_every_error_of_the_tree_and_both_clients() -> None:
    import fusee.errors

    listed = set(re.findall(r"^::: fusee\.(\w+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    missing = {*fusee.errors.__all__, "Client", "SyncClient"} - listed
    assert not missing, f"docs/api.md does not list {sorted(missing)}"


def test_the_concepts_page_names_every_status() -> None:
    from fusee import RunStatus

    statuses = (DOCS / "concepts.md").read_text().split("## Statuses", 1)[1].split("\n## ", 1)[0]
    assert [s.value for s in RunStatus if f"`{s.value}`" not in statuses] == []


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    return fresh_venv(tmp_path_factory)


@pytest.mark.parametrize(
    ("line", "found"),
    [
        pytest.param(
            "  BuildBackendWarning: `project.license` as a TOML table is deprecated",
            True,
            id="setuptools",
        ),
        pytest.param("DEPRECATION: Legacy editable install of fusee", True, id="pip"),
        pytest.param("WARNING: Location 'file:///opt/x/' is ignored", False, id="pip-config"),
        pytest.param("Successfully installed fusee-0.1.0", False, id="plain"),
    ],
)
def test_deprecation_warnings_are_told_from_other_output(line: str, found: bool) -> None:
    assert deprecations(f"Processing ./fusee\n{line}\n") == ([line] if found else [])


def test_a_wheel_builds_and_installs_with_its_test_extra_without_deprecation_warnings(
    venv: FreshVenv,
) -> None:
    assert deprecations(venv.build_output) == [], venv.build_output
    assert deprecations(venv.install_output) == [], venv.install_output
    shown = venv.run("pip", "show", "fusee", "pytest", "pytest-asyncio", cwd=venv.path).stdout
    assert shown.count("Name: ") == 3
    # The wheel's fusee, not the checkout's: the venv imports it from its site-packages.
    where = venv.run("python", "-c", "import fusee; print(fusee.__file__)", cwd=venv.path)
    assert where.stdout.startswith(str(venv.path))


def test_the_testing_pages_pytest_example_passes_and_type_checks_in_a_new_project(
    venv: FreshVenv, tmp_path: Path
) -> None:
    files = PROJECT_FILE.findall((DOCS / "testing.md").read_text(encoding="utf-8"))
    assert [name for name, _ in files] == ["pyproject.toml", "test_greet.py"]
    for name, text in files:
        (tmp_path / name).write_text(text + "\n", encoding="utf-8")
    # -W error: pytest-asyncio warns about settings the page may have left out.
    tested = venv.run("pytest", "-W", "error", "-p", "no:cacheprovider", cwd=tmp_path)
    assert "1 passed" in tested.stdout, tested.stdout
    checked = venv.mypy("--strict", "test_greet.py", cwd=tmp_path)
    assert "Success" in checked.stdout, checked.stdout


@pytest.mark.parametrize(
    ("page", "where"),
    [
        pytest.param("ui.md", "- Filters: status", id="ui-runs-page-filters"),
        pytest.param("ui.md", "| `status` |", id="ui-api-status-parameter"),
        pytest.param("concepts.md", "## Statuses", id="concepts-statuses"),
    ],
)
def test_a_page_that_lists_the_statuses_lists_every_one(page: str, where: str) -> None:
    from fusee import RunStatus

    text = (DOCS / page).read_text()
    start = text.index(where) + len(where)
    # The list runs to the end of its table row, or of its paragraph (the one
    # under a heading).
    end = text.find("\n", start) if where.startswith("|") else text.find("\n\n", start + 2)
    listed = set(re.findall(r"`([a-z]+)`", text[start:end]))
    assert {str(s) for s in RunStatus} <= listed, f"{page}: missing statuses"
