"""A worker process for the Client tests: ``python client_worker.py DIR_OR_URL [DURABILITY]``.

Serves `client_workflows` on the store until its stdin closes; prints
``ready`` once its engine is open.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import client_workflows as wfs

import fusee


async def main(target: str, durability: str) -> None:
    workflows: list[fusee.WorkflowDef[Any, Any]] = [wfs.tally, wfs.echo]
    async with await fusee.Engine.open(target, workflows=workflows, durability=durability):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "none"))
