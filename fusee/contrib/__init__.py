"""Integrations of fusee with other libraries, each behind its own extra.

- `fusee.contrib.pydantic_ai` (``pip install "fusee[pydantic-ai]"``): a
  pydantic-ai ``Agent`` run durably inside a workflow.
- `fusee.contrib.openai_agents` (``pip install "fusee[openai-agents]"``): the
  OpenAI Agents SDK's ``Runner`` run durably inside a workflow.

Both wait for the same signal when an agent defers tool calls to a person:
`fusee.contrib.DECISIONS`, whose payload is a `fusee.contrib.Decisions`.

The rule: a module here imports fusee's public names only (it sits above the
engine and the client), and its library only where the library says its
API is public.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DECISIONS", "Decisions"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the signal's payload is a pydantic model, and
    # pydantic comes with the extras, not with fusee.
    if name in __all__:
        from fusee.contrib import _decisions

        return getattr(_decisions, name)
    raise AttributeError(f"module 'fusee.contrib' has no attribute {name!r}")
