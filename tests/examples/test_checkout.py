"""The demo (`make demo`): killed with SIGKILL during its sleep, run again, it resumes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from example_runner import EXAMPLES, Example, run_example

import fusee
from examples import checkout
from fusee.cli import main
from fusee.testing import crash_everywhere

ORDER = checkout.Order("o-1", "ada@example.com", [checkout.Item("mug", 2, 1290)], 60.0)


def recorded_steps(data: Path) -> list[str]:
    out = io.StringIO()
    if main(["show", checkout.ORDER_ID, "--json", "--data", str(data)], stdout=out) != 0:
        return []
    records = json.loads(out.getvalue())["records"]
    return [r["name"] for r in records if r["kind"] in ("step", "timer")]


def test_the_demo_resumes_after_kill_9_without_running_recorded_steps_again(
    tmp_path: Path,
) -> None:
    # A cool-off long enough that the rival below starts before it ends, however
    # loaded the machine.
    first = Example("checkout", "--cool-off", "12", cwd=tmp_path)
    first.wait_for("step quote")
    first.wait_for("step charge      attempt 2")
    first.wait_for("manager          approves")
    first.wait_for("kill me now")
    # Killed once the journal holds the cool-off's timer (so the notify step is durable).
    pause = threading.Event()
    for _ in range(500):
        if "cool-off" in recorded_steps(tmp_path / "data"):
            break
        pause.wait(0.02)
    assert recorded_steps(tmp_path / "data") == ["quote", "charge", "notify", "cool-off"]
    # A second copy meanwhile is refused: one process writes a store.
    rival = subprocess.run(
        [sys.executable, str(EXAMPLES / "checkout.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rival.returncode == 1
    assert "already writes the store in data" in rival.stderr
    first.kill()
    assert first.proc.returncode == -9

    second = run_example("checkout", "--cool-off", "4", cwd=tmp_path)
    assert "is already in data/ (suspended): attaching to it" in second
    assert "recorded steps: quote, charge, notify" in second
    for ran_before in ("step quote", "step charge", "manager", "step notify"):
        assert ran_before not in second
    for runs_now in ("step pack", "step label", "step email"):
        assert runs_now in second
    assert "status='shipped'" in second

    third = run_example("checkout", cwd=tmp_path)
    assert "(completed): attaching to it" in third
    assert "step " not in third
    assert "status='shipped'" in third


def test_the_demo_refunds_when_the_approval_times_out(tmp_path: Path) -> None:
    out = run_example("checkout", "--no-approve", "--approval-timeout", "1", cwd=tmp_path)
    assert "nobody sends it" in out
    assert "step refund" in out
    assert "status='refunded'" in out


@pytest.mark.asyncio
async def test_checkout_ships_when_approved_whatever_the_crash() -> None:
    async def approve(t: object, run: fusee.Run[checkout.Receipt]) -> None:
        await run.signal(checkout.approval, True, dedup="approval")

    receipt = await crash_everywhere(
        checkout.checkout, ORDER, workflows=[checkout.ship], id="o-1", drive=approve
    )
    assert receipt == checkout.Receipt("o-1", "ch_o-1", "FR-O-1", "shipped")


@pytest.mark.asyncio
async def test_checkout_refunds_without_approval_whatever_the_crash() -> None:
    receipt = await crash_everywhere(checkout.checkout, ORDER, workflows=[checkout.ship], id="o-1")
    assert receipt == checkout.Receipt("o-1", "ch_o-1", None, "refunded")
