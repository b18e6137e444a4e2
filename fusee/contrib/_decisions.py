"""A person's answer to an agent's deferred tool calls: the signal both agent integrations wait for.

The rule: its name and fields are on disk (journaled signal payloads); a
field may be added with a default, never renamed.
"""

from __future__ import annotations

from typing import Any

import pydantic

import fusee

__all__ = ["DECISIONS", "Decisions", "wait_for_decisions"]


class Decisions(pydantic.BaseModel):
    """A person's answer to a run's deferred tool calls (the `DECISIONS` signal's payload).

    Attributes:
        approve: Ids of the tool calls to make.
        deny: Ids of the tool calls not to make, each with what to tell the model.
        results: Results of calls made outside the agent (external tools), by
            id (pydantic-ai only).

    Example:
        >>> Decisions(approve=["call-1"], deny={"call-2": "not today"}).deny
        {'call-2': 'not today'}
    """

    approve: list[str] = pydantic.Field(default_factory=list)
    deny: dict[str, str] = pydantic.Field(default_factory=dict)
    results: dict[str, Any] = pydantic.Field(default_factory=dict)


DECISIONS = fusee.signal("fusee.agent.decisions", Decisions)
"""The signal an agent run waits for when it defers tool calls to a person.

Example:
    >>> async def approve(run: fusee.Run[str], call_id: str) -> None:
    ...     await run.signal(DECISIONS, Decisions(approve=[call_id]))
"""


async def wait_for_decisions(
    ctx: fusee.Ctx,
    decisions: fusee.SignalDef[Decisions],
    timeout: str | float | None,
    calls: str,
) -> Decisions:
    """The next ``decisions`` signal; past ``timeout``, a clear error naming the ``calls``."""
    answer = await ctx.wait_for(decisions, timeout=timeout)
    if answer is None:
        raise fusee.FuseeError(
            f"no {decisions.name!r} signal came within {timeout!r} for {calls}; "
            "send it with run.signal(...) sooner, or pass a longer decisions_timeout"
        )
    return answer
