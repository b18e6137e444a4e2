"""Streaming: a step writes tokens to a stream that a client reads live.

The step's stream is journaled chunk by chunk; ``run.stream("tokens")``
reads it from the start, then live, until it ends with the step. If the
process dies mid-stream, the step runs again and its stream continues after
the chunks already recorded: readers never see a token twice.

    python examples/streaming.py
"""

from __future__ import annotations

import asyncio

import fusee

ANSWER = "Durable execution records every result, so a crash loses nothing."
TOKEN_DELAY_S = 0.05  # how slowly the stand-in model "thinks"


async def generate(s: fusee.StepCtx, prompt: str) -> str:
    """A stand-in for a language model: one word at a time."""
    words = ANSWER.split()
    async with s.stream("tokens") as out:
        for word in words:
            await asyncio.sleep(TOKEN_DELAY_S)
            await out.append(word)
    return " ".join(words)


@fusee.workflow("chat")
async def chat(ctx: fusee.Ctx, prompt: str) -> str:
    """Answers ``prompt``, streaming the answer's tokens as they come."""
    return await ctx.step("generate", lambda s: generate(s, prompt))


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[chat]) as engine:
        run = await engine.start(chat, "chat-1", "What is durable execution?")
        print("tokens, as they land: ", end="", flush=True)
        async for token in run.stream("tokens"):
            print(token, end=" ", flush=True)
        print()
        print(f"result: {await run.result()}")


if __name__ == "__main__":
    asyncio.run(main())
