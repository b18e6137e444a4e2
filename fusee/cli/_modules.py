"""The user's modules: imported by dotted name or file path, and their workflows.

The rule: one definition per workflow name across the modules a command
names, as an engine runs one definition per name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from fusee._definitions import WorkflowDef
from fusee.cli._output import CliError


def import_module(spec: str) -> ModuleType:
    """Imports a module by dotted name (from the current directory too) or by file path."""
    try:
        if spec.endswith(".py") or os.sep in spec or "/" in spec:
            path = Path(spec)
            if not path.is_file():
                raise CliError(f"no module file {spec!r}")
            name = path.stem
            loaded = sys.modules.get(name)
            if loaded is not None:
                if Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
                    return loaded
                name = f"fusee_cli_{name}_{secrets.token_hex(2)}"
            parent = str(path.resolve().parent)
            if parent not in sys.path:
                sys.path.insert(0, parent)
            found = importlib.util.spec_from_file_location(name, path)
            if found is None or found.loader is None:
                raise CliError(f"cannot import {spec!r}: not a Python module")
            module = importlib.util.module_from_spec(found)
            # Registered before it runs: the codec resolves its classes' hints through it.
            sys.modules[name] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return module
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
        return importlib.import_module(spec)
    except CliError:
        raise
    except (Exception, SystemExit) as e:
        raise CliError(f"cannot import module {spec!r}: {type(e).__name__}: {e}") from None


def workflows_of(modules: Iterable[ModuleType], what: str) -> list[WorkflowDef[Any, Any]]:
    found: dict[str, WorkflowDef[Any, Any]] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, WorkflowDef):
                other = found.get(value.name)
                if other is not None and other is not value:
                    raise CliError(
                        f"two workflows are named {value.name!r} ({other.location} and "
                        f"{value.location}); an engine runs one definition per name"
                    )
                found[value.name] = value
    if not found:
        raise CliError(f"{what} defines no workflows (no @fusee.workflow at its top level)")
    return [found[k] for k in sorted(found)]


def pick(workflows: Sequence[WorkflowDef[Any, Any]], name: str, what: str) -> WorkflowDef[Any, Any]:
    for wf in workflows:
        if wf.name == name or wf.fn.__name__ == name:
            return wf
    names = ", ".join(wf.name for wf in workflows)
    raise CliError(f"{what} has no workflow {name!r} (it has: {names})")
