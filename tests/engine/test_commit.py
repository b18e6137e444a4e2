"""The committer: what waits on the log's durability runs in LSN order, once."""

from __future__ import annotations

import asyncio
import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.engine._commit import Committer
from fusee.store.memory import MemoryStore


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), max_size=12))
def test_durability_callbacks_run_by_lsn_then_as_registered(gates: list[int]) -> None:
    # Registered in any LSN order (a gate older than the last one is rare
    # but allowed), they run by LSN, and those of one LSN as registered.
    async def main() -> list[tuple[int, int]]:
        store = MemoryStore()
        await store.open()
        committer = Committer(store)
        ran: list[tuple[int, int]] = []
        for n, gate in enumerate(gates):
            committer.on_durable(gate, functools.partial(ran.append, (gate, n)))
        assert ran == []  # nothing is durable yet
        committer.start()
        for _ in range(3):
            committer.append("a", 1, b"x")
        await committer.flush()
        # Durable through 3: a callback registered now runs at once.
        committer.on_durable(3, functools.partial(ran.append, (3, -1)))
        for _ in range(3):
            committer.append("a", 1, b"x")
        await committer.flush()
        await committer.close()
        return ran

    ran = asyncio.run(main())
    expected = sorted((gate, n) for n, gate in enumerate(gates) if gate <= 3)
    expected.append((3, -1))
    expected += sorted((gate, n) for n, gate in enumerate(gates) if gate > 3)
    assert ran == expected
