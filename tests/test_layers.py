"""The import-layer contract (scripts/check_layers.py, run by `make lint`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts/check_layers.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module
    spec.loader.exec_module(module)
    return module


check_layers = _checker()


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "fusee"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_package_keeps_its_layers_and_has_no_import_cycle() -> None:
    assert check_layers.violations(ROOT / "fusee") == []


@pytest.mark.parametrize(
    ("files", "found"),
    [
        pytest.param(
            {"__init__.py": "", "machine.py": "from fusee.engine import Engine\n", "engine.py": ""},
            "imports go down the layers only",
            id="upward",
        ),
        pytest.param(
            {
                "__init__.py": "",
                "store/__init__.py": "def f():\n    import fusee.store.memory\n",
                "store/memory.py": "from fusee.store import f\n",
            },
            "import cycle: fusee.store",
            id="lazy-cycle",
        ),
        pytest.param(
            {"__init__.py": "", "newthing.py": ""},
            "no rank; add it to RANKS",
            id="unranked",
        ),
    ],
)
def test_the_checker_reports_what_breaks_the_contract(
    tmp_path: Path, files: dict[str, str], found: str
) -> None:
    problems = check_layers.violations(_package(tmp_path, files))
    assert any(found in p for p in problems), problems


def test_imports_under_type_checking_may_close_a_cycle(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/_commit.py": "from fusee.engine import _streams\n",
        "engine/_streams.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from fusee.engine import _commit\n"
        ),
    }
    assert check_layers.violations(_package(tmp_path, files)) == []


_ENGINE = {"__init__.py": "", "engine/__init__.py": "", "engine/_engine.py": ""}


@pytest.mark.parametrize(
    ("files", "found"),
    [
        pytest.param(
            {
                **_ENGINE,
                "engine/_timers.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n"
                    "    from fusee.engine._engine import Engine\n"
                ),
            },
            "only the engine package imports the facade",
            id="engine-under-type-checking",
        ),
        pytest.param(
            {**_ENGINE, "engine/_journal.py": "", "client.py": "import fusee.engine._journal\n"},
            "a process without workflow code imports fusee.engine's public names",
            id="client-private-engine-module",
        ),
        pytest.param(
            {
                **_ENGINE,
                "engine/_run.py": "",
                "ui/__init__.py": "",
                "ui/_app.py": "from fusee.engine import _run\n",
            },
            "a process without workflow code imports fusee.engine's public names",
            id="ui-private-engine-module",
        ),
    ],
)
def test_the_checker_keeps_the_facade_and_private_engine_modules_to_the_engine(
    tmp_path: Path, files: dict[str, str], found: str
) -> None:
    problems = check_layers.violations(_package(tmp_path, files))
    assert any(found in p for p in problems), problems


@pytest.mark.parametrize(
    ("files", "found"),
    [
        pytest.param(
            {**_ENGINE, "engine/_runs.py": "", "engine/_state.py": "import fusee.engine._runs\n"},
            "fusee.engine._state (room 1) imports fusee.engine._runs (room 3)",
            id="upward-at-run-time",
        ),
        pytest.param(
            {
                **_ENGINE,
                "engine/_inbox.py": "",
                "engine/_messages.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n"
                    "    from fusee.engine._inbox import Inbox\n"
                ),
            },
            "fusee.engine._messages (room 5) imports fusee.engine._inbox (room 6)",
            id="upward-under-type-checking",
        ),
        pytest.param(
            {**_ENGINE, "engine/_newroom.py": ""},
            "fusee.engine._newroom: no room; add it to ROOMS",
            id="no-room",
        ),
    ],
)
def test_the_checker_refuses_an_engine_module_importing_a_higher_room(
    tmp_path: Path, files: dict[str, str], found: str
) -> None:
    problems = check_layers.violations(_package(tmp_path, files))
    assert any(found in p for p in problems), problems


def test_an_engine_module_may_import_its_own_room_and_lower_ones(tmp_path: Path) -> None:
    files = {
        **_ENGINE,
        "engine/_state.py": "",
        "engine/_commit.py": "",
        "engine/_leases.py": "",
        "engine/_queues.py": (
            "from fusee.engine import _commit, _leases, _state\nimport fusee.engine._retention\n"
        ),
        "engine/_retention.py": "",
    }
    assert check_layers.violations(_package(tmp_path, files)) == []


@pytest.mark.parametrize(
    "write",
    [
        pytest.param("state.signals = []", id="assign"),
        pytest.param("state.row_status += 1", id="augmented"),
        pytest.param("row, state.final_row = state.final_row, None", id="tuple"),
    ],
)
def test_the_checker_refuses_a_run_state_field_assigned_outside_its_module(
    tmp_path: Path, write: str
) -> None:
    files = {
        **_ENGINE,
        "engine/_state.py": (
            "class RunState:\n"
            "    signals: list[int]\n"
            "    row_status: int\n"
            "    final_row: object\n"
            "    def end(self) -> None:\n"
            "        self.row_status = 1\n"
        ),
        "engine/_host.py": f"def turned(state, row):\n    {write}\n",
    }
    problems = check_layers.violations(_package(tmp_path, files))
    assert any("a field of RunState" in p for p in problems), problems


def test_a_part_may_assign_its_own_field_named_like_a_run_states(tmp_path: Path) -> None:
    files = {
        **_ENGINE,
        "engine/_state.py": "class RunState:\n    signals: list[int]\n",
        "engine/_timers.py": "class Timers:\n    def __init__(self):\n        self.signals = []\n",
    }
    assert check_layers.violations(_package(tmp_path, files)) == []


def test_the_checker_reports_a_holder_that_no_longer_imports_the_facade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check_layers, "ENGINE_HOLDERS", frozenset({"fusee.engine._fork"}))
    problems = check_layers.violations(_package(tmp_path, {**_ENGINE, "engine/_fork.py": ""}))
    assert any("fusee.engine._fork no longer imports fusee.engine._engine" in p for p in problems)


def test_a_client_may_import_the_engines_public_names_and_the_remote_layer(
    tmp_path: Path,
) -> None:
    files = {
        **_ENGINE,
        "remote/__init__.py": "",
        "client.py": "from fusee.engine import Engine\nfrom fusee.remote import Remote\n",
    }
    assert check_layers.violations(_package(tmp_path, files)) == []
