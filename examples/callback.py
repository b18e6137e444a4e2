"""An external callback: hand a token out, wait for the outside world to complete it.

``ctx.await_completion(name, fn)`` runs ``fn`` as a step with ``s.token``
(here: an email with a confirmation link) and then waits, parked, until
someone calls ``engine.complete(token, value)`` (here: the web handler of
that link). The token survives restarts: it names the run and the wait.

    python examples/callback.py
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import fusee

# The mail server of this example: the step puts emails here, the user reads them.
outbox: queue.Queue[tuple[str, str]] = queue.Queue()


def send_confirmation(email: str, token: str) -> None:
    print(f"  sent a confirmation link to {email}: https://example.com/confirm?token={token}")
    outbox.put((email, token))


def create_account(email: str) -> str:
    print(f"  created the account of {email}")
    return f"acct-{email.split('@')[0]}"


@fusee.workflow("signup")
async def signup(ctx: fusee.Ctx, email: str) -> str:
    """Emails a confirmation link, waits for its click, then creates the account."""
    click: Any = await ctx.await_completion(
        "confirm-email", lambda s: send_confirmation(email, s.token or "")
    )
    if not click.get("confirmed"):
        return "declined"
    return await ctx.step("create-account", lambda: create_account(email))


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[signup]) as engine:
        run = await engine.start(signup, "signup-ada", "ada@example.com")
        email, token = await asyncio.to_thread(outbox.get, timeout=10)
        print(f"  {email} clicked the link: the web handler completes the token")
        await engine.complete(token, {"confirmed": True})
        print(f"signup-ada: {await run.result()}")


if __name__ == "__main__":
    asyncio.run(main())
