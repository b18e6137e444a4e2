"""The package version, in one place (the package, the CLI and the UI read it)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
