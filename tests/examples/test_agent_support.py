"""examples/agent_support.py: offline, the agent asks before the refund and streams its answer.

Its durability (steps, crashes, a real kill) is tested in tests/contrib.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

ANSWER = "Done: refunded 39.90 for order 1042. Anything else?"


def test_the_example_streams_its_answer_after_a_person_approves_the_refund(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline: without a key the scripted model answers.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = run_example("agent_support", cwd=tmp_path)
    assert out.splitlines() == [
        "customer: Please refund my order #1042, the kettle leaks.",
        'agent: [asks a person: refund({"order_id":"1042","amount":39.9})]',
        f"[approved] {ANSWER}",
        f"result: {ANSWER}",
        "refunds: [{'order_id': '1042', 'amount': 39.9}]",
    ]
