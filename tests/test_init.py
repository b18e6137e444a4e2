"""The package's public surface."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import fusee
import fusee.errors


def test_all_is_sorted_and_unique() -> None:
    assert fusee.__all__ == sorted(set(fusee.__all__))


def test_every_name_in_all_exists() -> None:
    missing = [name for name in fusee.__all__ if not hasattr(fusee, name)]
    assert missing == []


def test_every_error_is_reexported() -> None:
    assert set(fusee.errors.__all__) <= set(fusee.__all__)


def _public_modules() -> list[str]:
    return [
        m.name
        for m in pkgutil.walk_packages(fusee.__path__, "fusee.")
        if not any(part.startswith("_") for part in m.name.split("."))
    ]


@pytest.mark.parametrize("module", _public_modules())
def test_public_modules_declare_all_of_documented_names(module: str) -> None:
    # Their order is ruff's (RUF022); that each name exists and says what it is, is ours.
    mod = importlib.import_module(module)
    names: list[str] = getattr(mod, "__all__", [])
    assert names, f"{module} has no __all__"
    assert [n for n in names if not hasattr(mod, n)] == []
    undocumented = [
        n
        for n in names
        if callable(getattr(mod, n)) and not (getattr(mod, n).__doc__ or "").strip()
    ]
    assert undocumented == []
