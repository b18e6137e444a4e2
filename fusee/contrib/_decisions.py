"""A person's answer to an agent's deferred tool calls: the signal both agent integrations wait for.

The rule: its name and fields are on disk (journaled signal payloads); a
field may be added with a default, never renamed.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    calls: Mapping[str, str],
) -> Decisions:
    """Waits for ``decisions`` signals until every one of ``calls`` (tool names by id) is answered.

    A person may answer the calls one signal at a time; what a signal says
    about other calls than ``calls`` is ignored, and a later answer to a call
    replaces an earlier one.

    Raises:
        fusee.FuseeError: No signal came within ``timeout`` (each wait's).
    """
    # Each call's latest answer: ("approve" | "deny" | "result", what it says).
    decided: dict[str, tuple[str, Any]] = {}
    while left := [id for id in calls if id not in decided]:
        answer = await ctx.wait_for(decisions, timeout=timeout)
        if answer is None:
            waiting = ", ".join(f"{calls[id]} ({id})" for id in left)
            raise fusee.FuseeError(
                f"no {decisions.name!r} signal came within {timeout!r} for {waiting}; "
                "send it with run.signal(...) sooner, or pass a longer decisions_timeout"
            )
        for id in calls:
            if id in answer.approve:
                decided[id] = ("approve", None)
            elif id in answer.deny:
                decided[id] = ("deny", answer.deny[id])
            elif id in answer.results:
                decided[id] = ("result", answer.results[id])
    return Decisions(
        approve=[id for id, (how, _) in decided.items() if how == "approve"],
        deny={id: said for id, (how, said) in decided.items() if how == "deny"},
        results={id: said for id, (how, said) in decided.items() if how == "result"},
    )
