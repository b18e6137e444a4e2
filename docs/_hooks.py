"""mkdocs hooks for the API reference.

fusee's docstrings title their doctests ``Example:`` (STYLE.md). griffe reads
only ``Examples:`` as an examples section (code blocks); any other title is
an admonition of plain Markdown, where a doctest's output such as
``[1.0, 2.0]`` reads as a link. Teach griffe the singular title too.
"""

from __future__ import annotations

from griffe import DocstringSectionKind

try:
    from griffe._internal.docstrings import google as _google
except ImportError:  # an older griffe
    from griffe.docstrings import google as _google  # type: ignore[no-redef]

_google._section_kind.setdefault("example", DocstringSectionKind.examples)
