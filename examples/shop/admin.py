"""The shop's admin script: act on many orders at once, through a `fusee.Client`.

    python -m examples.shop.admin close --store ./data --dry-run    # which orders it would cancel
    python -m examples.shop.admin close --store ./data              # cancel them

``close`` cancels every order still queued (behind a customer's earlier
order, or not admitted yet) when the shop closes: none of them has been
charged, and each ends ``cancelled`` with the reason given. The same from
the command line, with the workers' codecs:

    fusee cancel --status queued --workflow order --reason "shop closed" \\
        --store ./data --codecs examples.shop.settings:codecs --dry-run
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import fusee
from examples.shop import settings
from examples.shop.workflows import order

__all__ = ["close", "main"]


async def close(
    runs: fusee.Client | fusee.Engine, *, reason: str = "shop closed", dry_run: bool = False
) -> fusee.BulkResult:
    """Cancels every queued order (with ``dry_run``: says which it would cancel).

    Example:
        >>> async def main(client: fusee.Client) -> None:
        ...     print((await close(client, dry_run=True)).done)
    """
    return await runs.cancel_many(
        workflow=order.name, status="queued", reason=reason, dry_run=dry_run
    )


async def _main(store: str, reason: str, dry_run: bool) -> None:
    async with await fusee.Client.connect(store, codecs=settings.codecs()) as client:
        result = await close(client, reason=reason, dry_run=dry_run)
    print(f"{'would cancel' if dry_run else 'cancelled'} {len(result.done)} queued order(s)")
    for id in result.done:
        print(f"  {id}")
    for id, why in result.skipped.items():
        print(f"  skipped {id}: {why}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.shop.admin")
    parser.add_argument("action", choices=["close"])
    parser.add_argument("--store", default="./data")
    parser.add_argument("--reason", default="shop closed")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(_main(args.store, args.reason, args.dry_run))


if __name__ == "__main__":
    main(sys.argv[1:])
