"""Shared test settings."""

from __future__ import annotations

# Imported here, at the top of the stack: CPython 3.11.7 raises a spurious
# "AST constructor recursion depth mismatch" when pytest's assertion
# rewriter compiles hypothesis's modules deep inside a plugin hook, which is
# where the hypothesis plugin imports it when no test module did.
import hypothesis

hypothesis.settings.register_profile("fusee", deadline=None, print_blob=True)
hypothesis.settings.load_profile("fusee")
