"""Shard leases: which runs of a store shared by several workers this engine serves.

On a shared store (Postgres) every run belongs to a shard (`shard_index`,
the store's rule), and a worker serves the runs of the shards it holds by
lease, each with an epoch, timed by the database's clock. Every
`Leases.interval` a worker renews its leases and its membership, reckons
its fair share from the live workers (the shard count divided by them,
rounded up), takes free or expired shards up to it and gives back those
above it (once it has been above for a few rounds in a row). A shard it
takes it recovers from the journals; a shard it gives back it first makes
durable; a shard it loses (a renewal that finds it taken over, a write
refused with `fusee.StaleLease`) it drops at once, with its records not
yet written (`Committer.drop`).

Workers of several versions share a store during a rolling deploy: each
version given to a worker (``Engine.open(..., version=)``, `Engine.pins`)
has a **lane** of its own (`LeasedStore.serve_version`; lane 0 is that of
workers that pin no version). A lane leases its own copy of the shards, so
each shard has one holder per lane, and a run belongs to the lane of the
version it started on: its version's workers recover it, run it and answer
for it. A run whose lane has no live worker is served by the newest lane
that has one (`Leases.serving`), which runs it if it may (an ``auto``
workflow's, one of no version, any run for an engine that does not pin)
and otherwise answers that it waits for a worker of its version.

The rule: the engine writes a shard's records only under its lease (the
committer fences every append with the shard's epoch, see `Leases.fence`),
and hosts a run only while `Leases.owns` its id and the run is its lane's
(`Leases.elsewhere`): a message to a run of another shard or lane goes
through the store's inbox to its owner (`fusee.remote`), which the store
routes by the lane serving the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Protocol

from fusee.engine._state import shard_index
from fusee.errors import FuseeError

if TYPE_CHECKING:
    from fusee.engine._commit import Committer

__all__ = ["APPLYING", "LeasedStore", "Leases", "default_worker", "forwards", "is_shared"]

log = logging.getLogger("fusee")

# A round at least this often: a dead worker's shards are taken over at
# most this long after its lease ran out.
_MAX_INTERVAL_S: Final = 1.0
# Rounds in a row a worker must find itself above its fair share before it
# gives shards back: a worker whose renewal came late once (a busy loop)
# counts as gone for a round, and the shards would go back and forth.
_OVER_ROUNDS: Final = 3


class LeasedStore(Protocol):
    """What a store several workers share offers besides the `fusee.store.Store` protocol."""

    @property
    def shards(self) -> int: ...

    async def acquire_shards(
        self, owner: str, want: int, lease_s: float, *, reclaim: bool = False
    ) -> dict[int, int]: ...

    async def renew_shards(
        self, owner: str, shards: Iterable[int], lease_s: float
    ) -> dict[int, int]: ...

    async def release_shards(self, owner: str, shards: Iterable[int]) -> None: ...

    async def join(self, owner: str, lease_s: float, version: str = "") -> int: ...

    async def leave(self, owner: str) -> None: ...

    async def max_lsn(self, shards: Iterable[int]) -> int: ...

    async def serve_version(self, version: str) -> int: ...

    async def lanes(self) -> tuple[dict[str, int], set[int]]: ...

    async def lane_of(self, version: str) -> int: ...

    async def reroute_commands(self) -> int: ...


# Set while the inbox applies a command: a command whose run moved stays in
# the store for the shard's holder to take (`Inbox._run`); posted again from
# inside, it would wait behind the command that posts it.
APPLYING: Final[ContextVar[bool]] = ContextVar("fusee_applying", default=False)


class _Leased(Protocol):
    """What `forwards` reads of an engine: its leases (None on a store no worker shares)."""

    @property
    def leases(self) -> Leases | None: ...


def forwards(engine: _Leased) -> bool:
    """Whether an operation its run's lost lease refused goes on through the store's inbox.

    A store no worker shares has no lease to lose: a `fusee.StaleLease` there
    is the store failing, and reaches the caller.
    """
    return engine.leases is not None and not APPLYING.get()


def is_shared(store: object) -> bool:
    """Whether ``store`` is shared by workers that lease its shards (Postgres).

    Example:
        >>> from fusee.store.memory import MemoryStore
        >>> is_shared(MemoryStore())
        False
    """
    return callable(getattr(store, "acquire_shards", None))


def default_worker() -> str:
    """A name for this worker: its host, its process and a random part.

    Example:
        >>> default_worker().count("/")
        2
    """
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:6]}"


class Leases:
    """The shards one engine holds on a shared store, kept by lease.

    Args:
        store: Its shared store (open).
        lease_s: A lease's length: a dead worker's shards move after it.
        owner: This worker's name: a worker started again under the same
            name takes its shards back at once.
        committer: The engine's committer (its LSNs pass a taken shard's).
        version: The engine's version (the workers' roll call shows it).
        lost_shards: Drops at once the runs of shards another worker took.
        recover_shards: Picks up the unfinished runs of shards taken.
        drop_shards: Unloads the runs of shards given back.

    Example:
        >>> def serves(leases: Leases | None, id: str) -> bool:
        ...     return leases is None or leases.owns(id)
    """

    def __init__(
        self,
        store: LeasedStore,
        *,
        lease_s: float,
        owner: str,
        committer: Committer,
        version: str,
        lost_shards: Callable[[list[int]], None],
        recover_shards: Callable[[set[int]], Awaitable[None]],
        drop_shards: Callable[[list[int]], None],
        pins: bool = False,
        lanes_changed: Callable[[set[int]], object] = lambda shards: None,
        look_again: Callable[[], None] = lambda: None,
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"a shard lease must last more than 0 s, not {lease_s!r}")
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"a worker needs a non-empty str name, not {owner!r}")
        self._committer = committer
        self._version = version
        self._lost_shards = lost_shards
        self._recover_shards = recover_shards
        self._drop_shards = drop_shards
        # Whether the engine pins its version (a lane of its own), what to do
        # when the lanes with a live worker change (in the background), and
        # the queues' look at every queue while several lanes are live.
        self._pins = pins
        self._lanes_changed = lanes_changed
        self._look_again = look_again
        self._store = store
        self.lease_s = lease_s
        self.owner = owner
        self.count = store.shards
        # A third of the lease: two renewals may fail before it runs out.
        self.interval = min(lease_s / 3, _MAX_INTERVAL_S)
        self.held: dict[int, int] = {}  # shard -> epoch
        # Shards being given back: still written under their lease until released.
        self._releasing: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        # The keeper is told to stop, never cancelled: a query cut short
        # leaves asyncpg a connection to clean up after the store closed.
        self._stopping = asyncio.Event()
        self._failing = False
        self._over = 0  # rounds in a row above the fair share
        # This worker's lane (0 unless its engine pins its version), each
        # version's lane as last read, and the lanes with a live worker.
        self.lane = 0
        self._lanes: dict[str, int] = {}
        self.live: set[int] = set()

    def owns(self, id: str) -> bool:
        """Whether this engine serves run ``id`` (it holds the run's shard)."""
        return shard_index(id, self.count) in self.held

    def fence(self, shard: int) -> int | None:
        """The epoch to write ``shard``'s records under; None when it is not held."""
        epoch = self.held.get(shard)
        return epoch if epoch is not None else self._releasing.get(shard)

    def shard_of(self, id: str) -> int:
        """Run ``id``'s shard."""
        return shard_index(id, self.count)

    async def lane_of(self, version: str) -> int:
        """The lane of the runs of ``version`` (a run row's ``version``).

        A version seen for the first time is looked up once: a worker
        registers its version before it writes a run of it, so a version
        not registered then is lane 0's for good.
        """
        lane = self._lanes.get(version)
        if lane is None:
            lane = await self._store.lane_of(version) if version else 0
            self._lanes[version] = lane
        return lane

    def serving(self, lane: int) -> int:
        """The lane serving runs of ``lane``: itself while it has a live worker, else the newest."""
        live = self.live
        if lane in live or not live:
            return lane
        return max(live)

    async def reroute(self) -> None:
        """Moves commands left to a lane with no live worker to the lane serving their runs."""
        await self._store.reroute_commands()

    async def foreign(self, version: str) -> bool:
        """Whether the runs of ``version`` are another lane's than this worker's."""
        return await self.lane_of(version) != self.lane

    async def elsewhere(self, version: str) -> bool:
        """Whether another lane than this worker's serves the runs of ``version``."""
        return self.serving(await self.lane_of(version)) != self.lane

    async def start(self) -> None:
        """Takes a first share (recovering its runs), then keeps the leases in the background."""
        self.lane = await self._store.serve_version(self._version if self._pins else "")
        await self._round(first=True)
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="fusee-leases")

    async def _keep(self) -> None:
        stopping = self._stopping
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.interval)
            if stopping.is_set():
                return
            try:
                await self._round()
            except Exception as e:  # the leases outlive any one failure of the store
                if stopping.is_set():
                    return
                if not self._failing:
                    log.warning("renewing shard leases failed (retrying): %s", e)
                    self._failing = True
                continue
            if self._failing:
                log.warning("renewing shard leases works again")
                self._failing = False

    async def _round(self, *, first: bool = False) -> None:
        store = self._store
        if self.held:
            asked = dict(self.held)
            kept = await store.renew_shards(self.owner, asked, self.lease_s)
            lost = [s for s, epoch in asked.items() if kept.get(s) != epoch and s in self.held]
            if lost:
                self._lost_shards(lost)
        live = await store.join(self.owner, self.lease_s, self._version)
        lanes, lanes_live = await store.lanes()
        self._lanes.update(lanes)
        if lanes_live != self.live:
            self.live = lanes_live
            if not first and self.held:
                # A lane lost its last worker (its runs may be this lane's
                # to serve now), or came back.
                self._lanes_changed(set(self.held))
        if len(lanes_live) > 1 and not first:
            self._look_again()
        fair = -(-self.count // max(live, 1))
        self._over = self._over + 1 if len(self.held) > fair else 0
        if len(self.held) < fair:
            got = await store.acquire_shards(
                self.owner, fair - len(self.held), self.lease_s, reclaim=first
            )
            if got:
                await self._adopt(got)
        elif self._over >= _OVER_ROUNDS:
            self._over = 0
            await self.give_back(sorted(self.held)[fair:])

    async def _adopt(self, got: dict[int, int]) -> None:
        # The previous holder's last records are the highest of those shards:
        # this worker's records number past them, before it writes any.
        self._committer.advance(await self._store.max_lsn(got))
        self.held.update(got)
        log.info("worker %s took shards %s", self.owner, _names(got))
        await self._recover_shards(set(got))

    async def give_back(self, shards: Iterable[int]) -> None:
        """Makes ``shards``' records durable, drops their runs and releases their leases."""
        wanted = [s for s in shards if s in self.held]
        if not wanted:
            return
        for s in wanted:
            self._releasing[s] = self.held.pop(s)
        try:
            # Messages to their runs go to the next holder from here on.
            await self._committer.flush(bounded=False)
            self._drop_shards(wanted)
            await self._committer.flush(bounded=False)
            await self._store.release_shards(self.owner, wanted)
            log.info("worker %s gave back shards %s", self.owner, _names(wanted))
        finally:
            for s in wanted:
                self._releasing.pop(s, None)

    def lose(self, shards: Iterable[int]) -> list[int]:
        """Forgets ``shards`` (taken over by another worker); returns those it held."""
        lost = [s for s in shards if s in self.held or s in self._releasing]
        for s in lost:
            self.held.pop(s, None)
            self._releasing.pop(s, None)
        return lost

    async def stop(self) -> None:
        """Stops renewing and gives every shard back at once (the engine closes)."""
        task, self._task = self._task, None
        self._stopping.set()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        held, self.held = sorted(self.held), {}
        try:
            if held:
                await self._store.release_shards(self.owner, held)
            await self._store.leave(self.owner)
        except FuseeError as e:
            log.warning(
                "worker %s could not give its shards back (they move once their leases run "
                "out): %s",
                self.owner,
                e,
            )

    def abandon(self) -> None:
        """Stops renewing, leaving the leases to run out (a crash)."""
        self._task = None
        self._stopping.set()


def _names(shards: Iterable[Any]) -> str:
    return ", ".join(str(s) for s in sorted(shards))
