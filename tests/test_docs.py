"""The docs' runnable code blocks run, their snippets exist, and the site builds."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# A ```python block right after a `<!-- runnable -->` line runs as a program.
RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.DOTALL)
SNIPPET = re.compile(r'--8<-- "([^"]+)"')
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
