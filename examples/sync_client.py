"""A plain script (or a Django or Flask view) driving runs with `fusee.SyncClient`.

No ``async`` here: `fusee.SyncClient` runs its event loop in a thread of its
own and each call blocks until the worker answers. The worker is the one
process that runs the workflow code; this script starts it for the demo.

    python examples/sync_client.py                  # the demo: a worker and three invoices
    python examples/sync_client.py worker ./data    # or run the worker yourself

In a Django view, one client for the whole process::

    CLIENT = fusee.SyncClient.connect(settings.FUSEE_STORE)

    def approve(request, invoice_id):
        CLIENT.get(invoice_id).signal(approved, request.user.username, dedup=request.POST["nonce"])
        return JsonResponse(CLIENT.get(invoice_id).describe().status, safe=False)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile

import fusee

approved = fusee.signal("approved", str)
amount_due = fusee.query("amount_due")


@fusee.workflow("invoice")
async def invoice(ctx: fusee.Ctx, amount: int) -> str:
    """Waits for an approval (one hour at most), then sends the invoice."""
    ctx.on_query(amount_due, lambda _: amount)
    by = await ctx.wait_for(approved, timeout="1h")
    if by is None:
        return "expired"
    return await ctx.step("send", lambda: f"sent {amount} EUR, approved by {by}")


async def worker(data: str) -> None:
    """Runs the workflows on ``data`` until stdin closes (or Ctrl-C)."""
    async with await fusee.Engine.open(data, workflows=[invoice]):
        print("worker ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


def demo() -> None:
    with tempfile.TemporaryDirectory() as data:
        served = subprocess.Popen(
            [sys.executable, __file__, "worker", data],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert served.stdout is not None
        print(served.stdout.readline().strip())
        try:
            with fusee.SyncClient.connect(data) as client:
                runs = [client.start(invoice, f"inv-{n}", 100 * n) for n in (1, 2, 3)]
                print(f"inv-2 is due {runs[1].query(amount_due)} EUR")
                runs[0].signal(approved, "ada", dedup="approval-1")
                runs[1].signal(approved, "bo")
                runs[2].cancel("customer left")
                for run in runs:
                    try:
                        print(f"{run.id}: {run.result()}")
                    except fusee.Cancelled as e:
                        print(f"{run.id}: cancelled ({e})")
                print("completed:", [info.id for info in client.list(status="completed")])
        finally:
            assert served.stdin is not None
            served.stdin.close()
            served.wait(30)
            served.stdout.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        asyncio.run(worker(sys.argv[2]))
    else:
        demo()
