"""A reminder loop: sleep, remind, repeat; continue as new so the journal stays short.

A loop that runs for months would grow its journal forever. Every few
reminders the workflow calls ``ctx.continue_as_new(state)``: the run ends
and a new one, with the same id, starts from ``state`` and an empty
journal. A ``stop`` signal ends the loop (the sleep is a wait with a timeout).

    python examples/reminder.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import fusee

stop = fusee.signal("stop", bool)

PER_RUN = 3  # reminders per run before continuing as new


@dataclass(frozen=True)
class Reminders:
    who: str
    every_s: float
    remaining: int
    sent: int = 0


def remind(state: Reminders, run: int) -> None:
    print(f"  reminder #{state.sent + 1} to {state.who} (run {run})")


@fusee.workflow("reminder")
async def reminder(ctx: fusee.Ctx, state: Reminders) -> int:
    """Sends ``remaining`` reminders, one every ``every_s``; returns how many it sent."""
    run = ctx.info.run
    for _ in range(PER_RUN):
        if state.remaining == 0:
            return state.sent
        if await ctx.wait_for(stop, timeout=state.every_s):
            return state.sent
        await ctx.step("remind", lambda state=state: remind(state, run))
        state = replace(state, remaining=state.remaining - 1, sent=state.sent + 1)
    ctx.continue_as_new(state)


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[reminder]) as engine:
        sent = await engine.execute(reminder, "remind-ada", Reminders("ada", 0.1, remaining=7))
        print(f"sent {sent} reminders over {sent // PER_RUN + 1} runs of one id")
        run = await engine.start(reminder, "remind-bo", Reminders("bo", 0.2, remaining=100))
        await asyncio.sleep(0.5)
        await run.signal(stop, True)
        print(f"bo said stop after {await run.result()} reminders")


if __name__ == "__main__":
    asyncio.run(main())
