"""A worker process for the Client tests: ``python client_worker.py DIR_OR_URL``.

Serves `client_workflows` on the store until its stdin closes; prints
``ready`` once its engine is open.
"""

from __future__ import annotations

import asyncio
import sys

import client_workflows as wfs

import fusee


async def main(target: str) -> None:
    async with await fusee.Engine.open(target, workflows=[wfs.tally, wfs.echo], durability="none"):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
