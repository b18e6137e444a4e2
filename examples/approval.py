"""An approval that waits for a signal, with a timeout.

The workflow asks a reviewer, then waits (parked, costing nothing) for the
``review`` signal; without one before the deadline it escalates. Here three
requests go three ways: approved, rejected, and expired.

    python examples/approval.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import fusee

review = fusee.signal("review", bool)


@dataclass(frozen=True)
class Request:
    id: str
    what: str
    timeout_s: float = 3600.0


def ask_reviewer(request: Request) -> None:
    print(f"  [{request.id}] asked a reviewer: {request.what}")


def escalate(request: Request) -> None:
    print(f"  [{request.id}] no answer in {request.timeout_s:g}s: escalated to a manager")


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, request: Request) -> str:
    """Asks, then waits for ``review`` (True or False) or the deadline."""
    await ctx.step("ask", lambda: ask_reviewer(request))
    decision = await ctx.wait_for(review, timeout=request.timeout_s)
    if decision is None:
        await ctx.step("escalate", lambda: escalate(request))
        return "expired"
    return "approved" if decision else "rejected"


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[approval]) as engine:
        yes = await engine.start(approval, "r-1", Request("r-1", "a new laptop"))
        no = await engine.start(approval, "r-2", Request("r-2", "a pony"))
        late = await engine.start(approval, "r-3", Request("r-3", "a holiday", timeout_s=1.0))
        await asyncio.sleep(0.3)
        await yes.signal(review, True)
        print("  [r-1] reviewer said yes")
        await no.signal(review, False)
        print("  [r-2] reviewer said no")
        for run in (yes, no, late):
            print(f"{run.id}: {await run.result()}")


if __name__ == "__main__":
    asyncio.run(main())
