"""Tests of `fusee.store._batch`: calls made at once share a trip, and each gets its own outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fusee.store._batch import Batched


class Server:
    """A server that refuses a whole trip holding a negative number, as a statement fails whole."""

    def __init__(self) -> None:
        self.trips: list[list[int]] = []

    async def trip(self, items: Sequence[int]) -> list[int]:
        self.trips.append(list(items))
        await asyncio.sleep(0)
        if any(i < 0 for i in items):
            raise ValueError(f"{min(items)} is negative")
        return [i * 10 for i in items]


async def test_calls_made_at_once_go_in_one_trip_and_get_their_own_outcomes() -> None:
    server = Server()
    batched = Batched(server.trip)

    assert await asyncio.gather(*(batched(i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert server.trips == [[0, 1, 2, 3, 4]]


async def test_a_call_that_fails_its_trip_fails_alone() -> None:
    server = Server()
    batched = Batched(server.trip)

    outcomes = await asyncio.gather(batched(1), batched(-2), batched(3), return_exceptions=True)

    assert outcomes[0] == 10
    assert outcomes[2] == 30
    assert isinstance(outcomes[1], ValueError)
    assert "-2 is negative" in str(outcomes[1])
    assert server.trips[0] == [1, -2, 3]  # then call by call
    assert sorted(server.trips[1:]) == [[-2], [1], [3]]


async def test_calls_made_while_a_trip_is_out_go_in_the_next_one_up_to_the_limit() -> None:
    server = Server()
    batched = Batched(server.trip, limit=2)

    first = asyncio.ensure_future(batched(1))
    while not server.trips:  # the first trip leaves with 1 alone
        await asyncio.sleep(0)
    later = [asyncio.ensure_future(batched(i)) for i in (2, 3, 4)]

    assert await asyncio.gather(first, *later) == [10, 20, 30, 40]
    assert server.trips == [[1], [2, 3], [4]]


async def test_a_caller_that_gives_up_leaves_the_trip_to_end_for_the_others() -> None:
    server = Server()
    batched = Batched(server.trip)
    gone = asyncio.ensure_future(batched(1))
    kept = asyncio.ensure_future(batched(2))
    await asyncio.sleep(0)
    gone.cancel()

    assert await kept == 20
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert server.trips == [[1, 2]]


async def test_calls_whose_trip_is_cancelled_are_cancelled_rather_than_left_waiting() -> None:
    trips: list[Sequence[int]] = []

    async def never_answers(items: Sequence[int]) -> list[int]:
        trips.append(items)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    batched = Batched(never_answers)
    out = asyncio.ensure_future(batched(1))
    while not trips:
        await asyncio.sleep(0)
    waiting = asyncio.ensure_future(batched(2))
    await asyncio.sleep(0)
    sender = batched._out
    assert sender is not None
    sender.cancel()  # what a stopping loop does to it

    for call in (out, waiting):
        with pytest.raises(asyncio.CancelledError):
            await call
