"""WorkflowLoop: deterministic turns, durable timers, refusals, shutdown, ordered helpers."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee._combinators import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    as_completed,
    select,
    wait,
)
from fusee._loop import RunEvicted, WorkflowLoop, _name_refusals, start_eagerly
from fusee.errors import NondeterministicCall

T = TypeVar("T")


def _among(handle: asyncio.TimerHandle, handles: list[asyncio.TimerHandle]) -> bool:
    # TimerHandle compares by value (when, callback, args): compare identities.
    return any(handle is other for other in handles)


class FakeHost:
    """Records the timers a loop starts and cancels."""

    def __init__(self) -> None:
        self.started: list[asyncio.TimerHandle] = []
        self.cancelled: list[asyncio.TimerHandle] = []

    def timer_started(self, handle: asyncio.TimerHandle) -> None:
        self.started.append(handle)

    def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
        assert not _among(handle, self.cancelled), "a timer was reported cancelled twice"
        self.cancelled.append(handle)


class Run:
    """A loop, its fake host, and the driver's moves."""

    def __init__(self, name: str = "run", start_time: float = 0.0) -> None:
        self.host = FakeHost()
        self.loop = WorkflowLoop(self.host, name=name, start_time=start_time)
        self.fired: list[asyncio.TimerHandle] = []

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = self.loop.create_task(coro)
        self.turn()
        return task

    def turn(self) -> None:
        turn(self.loop)

    def resolve(self, fut: asyncio.Future[Any], value: object) -> None:
        fut.set_result(value)
        self.turn()

    def pending_timers(self) -> list[asyncio.TimerHandle]:
        return [
            handle
            for handle in self.host.started
            if not _among(handle, self.host.cancelled) and not _among(handle, self.fired)
        ]

    def fire_next(self) -> asyncio.TimerHandle:
        handle = min(self.pending_timers(), key=lambda handle: handle.when())
        self.fired.append(handle)
        assert self.loop.fire_timer(handle)
        self.turn()
        return handle


MakeRun = Callable[..., Run]


def turn(loop: WorkflowLoop) -> None:
    """One turn, as the driver runs it: the loop is the running loop meanwhile."""
    token = loop.enter()
    try:
        loop.run_ready()
    finally:
        loop.leave(token)


@pytest.fixture
def make_run() -> Iterator[MakeRun]:
    runs: list[Run] = []

    def make(name: str = "run", start_time: float = 0.0) -> Run:
        run = Run(name, start_time)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.loop.shutdown()
        assert run.loop.errors == []


@pytest.fixture
def run(make_run: MakeRun) -> Run:
    return make_run()


def current_name() -> str:
    task = asyncio.current_task()
    assert task is not None
    return task.get_name()


# -- turns -------------------------------------------------------------------


def test_callbacks_run_in_call_soon_order_including_those_scheduled_meanwhile(run: Run) -> None:
    seen: list[str] = []

    def first() -> None:
        seen.append("first")
        run.loop.call_soon(seen.append, "scheduled by first")

    run.loop.call_soon(first)
    run.loop.call_soon(seen.append, "second")
    assert not run.loop.is_quiescent()
    run.turn()
    assert seen == ["first", "second", "scheduled by first"]
    assert run.loop.is_quiescent()


def test_a_cancelled_handle_does_not_run(run: Run) -> None:
    seen: list[str] = []
    handle = run.loop.call_soon(seen.append, "cancelled")
    run.loop.call_soon(seen.append, "kept")
    handle.cancel()
    run.turn()
    assert seen == ["kept"]


def test_workflow_code_sees_the_workflow_loop_as_running_loop(run: Run) -> None:
    seen: dict[str, object] = {}

    async def workflow() -> None:
        seen["running"] = asyncio.get_running_loop()
        seen["event"] = asyncio.get_event_loop()
        seen["task"] = asyncio.current_task()

    task = run.start(workflow())
    assert seen == {"running": run.loop, "event": run.loop, "task": task}
    assert asyncio.events._get_running_loop() is None


def test_a_turn_is_not_reentrant(run: Run) -> None:
    errors: list[BaseException] = []

    def reenter() -> None:
        try:
            run.loop.enter()
        except RuntimeError as error:
            errors.append(error)

    run.loop.call_soon(reenter)
    run.turn()
    assert len(errors) == 1
    assert "not re-entrant" in str(errors[0])


@pytest.mark.asyncio
async def test_the_drivers_loop_runs_again_after_each_turn_even_when_workflow_code_raises() -> None:
    real = asyncio.get_running_loop()
    hooks = sys.get_asyncgen_hooks()
    run = Run()
    inside: list[asyncio.AbstractEventLoop] = []

    async def workflow() -> None:
        inside.append(asyncio.get_running_loop())
        raise ValueError("workflow failed")

    task = run.start(workflow())
    assert inside == [run.loop]
    assert isinstance(task.exception(), ValueError)
    assert asyncio.get_running_loop() is real
    assert sys.get_asyncgen_hooks() == hooks

    def escape() -> None:
        raise SystemExit(3)

    run.loop.call_soon(escape)
    with pytest.raises(SystemExit):
        run.turn()
    assert asyncio.get_running_loop() is real
    assert sys.get_asyncgen_hooks() == hooks
    await asyncio.sleep(0)  # the real loop still works
    run.loop.shutdown()
    assert run.loop.errors == []


@pytest.mark.expect_engine_errors("Exception in callback")
def test_an_exception_in_a_callback_goes_to_errors_not_to_the_driver(run: Run) -> None:
    def fail() -> None:
        raise ValueError("boom")

    run.loop.call_soon(fail)
    run.turn()
    [context] = run.loop.errors
    assert isinstance(context["exception"], ValueError)
    assert context["message"].startswith("Exception in callback")
    run.loop.errors.clear()


# -- tasks -------------------------------------------------------------------


def names_program() -> Coroutine[Any, Any, list[str]]:
    async def child() -> str:
        await asyncio.sleep(0)
        return current_name()

    async def workflow() -> list[str]:
        names = [current_name()]
        names += await asyncio.gather(child(), child())
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(child()) for _ in range(2)]
        names += [task.result() for task in tasks]
        names.append(await asyncio.create_task(child()))
        names.append(await asyncio.ensure_future(child()))
        return names

    return workflow()


def test_task_names_are_deterministic_and_equal_across_identical_runs(make_run: MakeRun) -> None:
    first = make_run("order-1").start(names_program()).result()
    second = make_run("order-1").start(names_program()).result()
    assert first == second == [f"order-1-task-{n}" for n in range(1, 8)]


def test_task_names_do_not_use_asyncios_global_counter(run: Run) -> None:
    def unnamed_task_number() -> int:
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(asyncio.sleep(0))
            loop.run_until_complete(task)
            return int(task.get_name().removeprefix("Task-"))
        finally:
            loop.close()

    before = unnamed_task_number()
    run.start(names_program()).result()
    assert unnamed_task_number() == before + 1


def test_explicit_task_names_are_kept_and_still_count(run: Run) -> None:
    async def workflow() -> list[str]:
        loop = asyncio.get_running_loop()
        named = loop.create_task(asyncio.sleep(0), name="mine")
        unnamed = loop.create_task(asyncio.sleep(0))
        await asyncio.gather(named, unnamed)
        return [named.get_name(), unnamed.get_name()]

    assert run.start(workflow()).result() == ["mine", "run-task-3"]


def test_a_task_factory_is_used_and_its_tasks_are_named(run: Run) -> None:
    made: list[asyncio.Future[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    run.loop.set_task_factory(factory)
    assert run.loop.get_task_factory() is factory
    task = run.start(asyncio.sleep(0))
    assert made == [task]
    assert task.get_name() == "run-task-1"
    run.loop.set_task_factory(None)
    assert run.loop.get_task_factory() is None


def test_tasks_are_kept_alive_until_done(run: Run) -> None:
    refs: list[weakref.ref[asyncio.Future[str]]] = []
    seen: list[str] = []

    async def background() -> None:
        # Only this coroutine holds the future: the task and the future are a
        # cycle that the garbage collector would destroy mid-await.
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        refs.append(weakref.ref(fut))
        seen.append(await fut)

    run.loop.create_task(background())
    run.turn()
    gc.collect()
    fut = refs[0]()
    assert fut is not None
    run.resolve(fut, "done")
    assert seen == ["done"]


# -- time and timers -----------------------------------------------------------


def test_time_starts_at_the_recorded_start_and_moves_only_when_the_driver_says(
    make_run: MakeRun,
) -> None:
    run = make_run(start_time=1000.0)
    assert run.loop.time() == 1000.0
    run.turn()
    assert run.loop.time() == 1000.0
    run.loop.advance_to(1005.5)
    assert run.loop.time() == 1005.5
    with pytest.raises(ValueError, match="forward only"):
        run.loop.advance_to(1000.0)
    handle = run.loop.call_later(10, lambda: None)
    assert handle.when() == 1015.5
    run.loop.fire_timer(handle)
    assert run.loop.time() == 1015.5
    run.turn()


def test_firing_an_earlier_timer_does_not_move_time_back(run: Run) -> None:
    early = run.loop.call_at(5.0, lambda: None)
    run.loop.advance_to(20.0)
    assert run.loop.fire_timer(early)
    assert run.loop.time() == 20.0
    run.turn()


@pytest.mark.parametrize("delay", [pytest.param(0, id="zero"), pytest.param(-1, id="negative")])
def test_asyncio_sleep_of_zero_or_less_is_a_plain_yield(run: Run, delay: float) -> None:
    async def workflow() -> str:
        await asyncio.sleep(delay)
        return "done"

    assert run.start(workflow()).result() == "done"
    assert run.host.started == []


def test_asyncio_sleep_is_a_durable_timer_the_host_fires(make_run: MakeRun) -> None:
    run = make_run(start_time=100.0)

    async def workflow() -> float:
        await asyncio.sleep(30)
        return asyncio.get_running_loop().time()

    task = run.start(workflow())
    [timer] = run.host.started
    assert timer.when() == 130.0
    assert not task.done()
    run.fire_next()
    assert task.result() == 130.0
    # asyncio.sleep cancels its handle in a finally; that is not news for the host.
    assert run.host.cancelled == []


def test_cancelling_a_sleeping_task_cancels_its_timer_exactly_once(run: Run) -> None:
    task = run.start(asyncio.sleep(30))
    [timer] = run.host.started
    task.cancel()
    run.turn()
    assert task.cancelled()
    assert run.host.cancelled == [timer]
    timer.cancel()
    assert len(run.host.cancelled) == 1


def test_firing_a_cancelled_timer_moves_time_but_runs_nothing(run: Run) -> None:
    seen: list[str] = []
    handle = run.loop.call_later(10, seen.append, "fired")
    handle.cancel()
    assert run.loop.fire_timer(handle) is False
    run.turn()
    assert seen == []
    assert run.loop.time() == 10.0


def test_a_timer_fires_once_and_only_on_its_own_loop(make_run: MakeRun) -> None:
    run, other = make_run("run"), make_run("other")
    handle = run.loop.call_later(1, lambda: None)
    with pytest.raises(ValueError, match="not a timer of workflow loop 'other'"):
        other.loop.fire_timer(handle)
    assert run.loop.fire_timer(handle)
    with pytest.raises(RuntimeError, match="not pending"):
        run.loop.fire_timer(handle)
    run.turn()


def test_timers_at_or_before_now_still_go_through_the_host(run: Run) -> None:
    run.loop.advance_to(50.0)
    handles = [
        run.loop.call_later(0, lambda: None),
        run.loop.call_later(-5, lambda: None),
        run.loop.call_at(10.0, lambda: None),
    ]
    assert [handle.when() for handle in run.host.started] == [50.0, 45.0, 10.0]
    for handle in handles:
        handle.cancel()
    assert len(run.host.cancelled) == 3


# -- asyncio inside a run ----------------------------------------------------------


def test_asyncio_timeout_cancels_its_timer_when_the_body_finishes_first(run: Run) -> None:
    fut = run.loop.create_future()

    async def workflow() -> object:
        async with asyncio.timeout(10):
            return await fut

    task = run.start(workflow())
    [timer] = run.host.started
    assert timer.when() == 10.0  # absolute loop time, through call_at
    run.resolve(fut, "in time")
    assert task.result() == "in time"
    assert run.host.cancelled == [timer]


def test_asyncio_timeout_raises_when_the_host_fires_its_timer(run: Run) -> None:
    fut = run.loop.create_future()

    async def workflow() -> object:
        async with asyncio.timeout(10):
            return await fut

    task = run.start(workflow())
    run.fire_next()
    assert isinstance(task.exception(), TimeoutError)
    assert fut.cancelled()
    assert run.host.cancelled == []


def test_rescheduling_an_asyncio_timeout_replaces_its_timer(run: Run) -> None:
    fut = run.loop.create_future()

    async def workflow() -> object:
        async with asyncio.timeout(10) as scope:
            scope.reschedule(asyncio.get_running_loop().time() + 20)
            return await fut

    task = run.start(workflow())
    first, second = run.host.started
    assert (first.when(), second.when()) == (10.0, 20.0)
    assert run.host.cancelled == [first]
    run.resolve(fut, "ok")
    assert task.result() == "ok"
    assert run.host.cancelled == [first, second]


def test_asyncio_wait_for_returns_in_time_and_cancels_its_timer(run: Run) -> None:
    fut = run.loop.create_future()

    async def workflow() -> object:
        return await asyncio.wait_for(fut, 5)

    task = run.start(workflow())
    [timer] = run.host.started
    run.resolve(fut, 42)
    assert task.result() == 42
    assert run.host.cancelled == [timer]


def test_asyncio_wait_for_times_out_and_cancels_the_inner_task(run: Run) -> None:
    log: list[str] = []
    fut = run.loop.create_future()

    async def inner() -> None:
        try:
            await fut
        except asyncio.CancelledError:
            log.append("inner cancelled")
            raise

    async def workflow() -> None:
        await asyncio.wait_for(inner(), 5)

    task = run.start(workflow())
    run.fire_next()
    assert isinstance(task.exception(), TimeoutError)
    assert log == ["inner cancelled"]


def test_asyncio_gather_returns_results_in_argument_order(run: Run) -> None:
    first, second = run.loop.create_future(), run.loop.create_future()

    async def double(fut: asyncio.Future[int]) -> int:
        return 2 * await fut

    async def workflow() -> list[int]:
        return list(await asyncio.gather(double(first), double(second)))

    task = run.start(workflow())
    run.resolve(second, 2)
    run.resolve(first, 1)
    assert task.result() == [2, 4]


def test_a_task_group_cancels_the_others_when_one_fails(run: Run) -> None:
    log: list[str] = []
    trigger = run.loop.create_future()

    async def failing() -> None:
        await trigger
        raise ValueError("failed")

    async def waiting() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    async def workflow() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(failing())
            group.create_task(waiting())

    task = run.start(workflow())
    [timer] = run.host.started
    run.resolve(trigger, None)
    error = task.exception()
    assert isinstance(error, ExceptionGroup)
    assert [type(e) for e in error.exceptions] == [ValueError]
    assert log == ["cancelled"]
    assert run.host.cancelled == [timer]


def test_event_queue_and_condition_made_inside_the_run_work(run: Run) -> None:
    log: list[str] = []
    fut = run.loop.create_future()

    async def workflow() -> None:
        event = asyncio.Event()
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        condition = asyncio.Condition()

        async def consumer() -> None:
            await event.wait()
            log.append("event")
            log.append(f"got {await queue.get()}")
            log.append(f"got {await queue.get()}")
            async with condition:
                await condition.wait()
                log.append("notified")

        async def producer() -> None:
            log.append(f"trigger {await fut}")
            event.set()
            await queue.put(1)
            await queue.put(2)
            await asyncio.sleep(0)
            async with condition:
                condition.notify_all()

        await asyncio.gather(consumer(), producer())

    task = run.start(workflow())
    run.resolve(fut, "go")
    task.result()
    assert log == ["trigger go", "event", "got 1", "got 2", "notified"]


def test_lock_and_semaphore_hand_over_in_arrival_order(run: Run) -> None:
    log: list[str] = []
    gate = run.loop.create_future()

    async def workflow() -> None:
        lock = asyncio.Lock()
        semaphore = asyncio.Semaphore(1)

        async def worker(name: str) -> None:
            async with lock:
                log.append(f"{name} lock")
                await gate
            async with semaphore:
                log.append(f"{name} semaphore")
                await asyncio.sleep(0)

        await asyncio.gather(worker("a"), worker("b"), worker("c"))

    task = run.start(workflow())
    assert log == ["a lock"]
    run.resolve(gate, None)
    task.result()
    assert [entry for entry in log if entry.endswith("lock")] == ["a lock", "b lock", "c lock"]
    assert [entry for entry in log if entry.endswith("semaphore")] == [
        "a semaphore",
        "b semaphore",
        "c semaphore",
    ]


def test_shield_keeps_the_inner_task_running_when_the_outer_await_is_cancelled(
    run: Run,
) -> None:
    fut = run.loop.create_future()

    async def inner() -> str:
        return f"inner {await fut}"

    async def workflow() -> tuple[bool, str]:
        protected = asyncio.create_task(inner())
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(protected)
        except TimeoutError:
            return protected.done(), await protected
        raise AssertionError("the timeout did not fire")

    task = run.start(workflow())
    run.fire_next()
    assert not task.done()
    run.resolve(fut, "done")
    assert task.result() == (False, "inner done")


# -- what replay cannot repeat ----------------------------------------------------------


REFUSED = [
    pytest.param("run_forever", (), id="run_forever"),
    pytest.param("run_until_complete", (None,), id="run_until_complete"),
    pytest.param("stop", (), id="stop"),
    pytest.param("call_soon_threadsafe", (print,), id="call_soon_threadsafe"),
    pytest.param("run_in_executor", (None, print), id="run_in_executor"),
    pytest.param("set_default_executor", (None,), id="set_default_executor"),
    pytest.param("shutdown_default_executor", (), id="shutdown_default_executor"),
    pytest.param("getaddrinfo", ("example.com", 80), id="getaddrinfo"),
    pytest.param("getnameinfo", (("127.0.0.1", 80),), id="getnameinfo"),
    pytest.param("create_connection", (None, "example.com", 80), id="create_connection"),
    pytest.param("create_server", (None, "", 80), id="create_server"),
    pytest.param("create_datagram_endpoint", (None,), id="create_datagram_endpoint"),
    pytest.param("create_unix_connection", (None, "/tmp/s"), id="create_unix_connection"),
    pytest.param("create_unix_server", (None, "/tmp/s"), id="create_unix_server"),
    pytest.param("connect_accepted_socket", (None, None), id="connect_accepted_socket"),
    pytest.param("sendfile", (None, None), id="sendfile"),
    pytest.param("start_tls", (None, None, None), id="start_tls"),
    pytest.param("connect_read_pipe", (None, None), id="connect_read_pipe"),
    pytest.param("connect_write_pipe", (None, None), id="connect_write_pipe"),
    pytest.param("subprocess_exec", (None, "ls"), id="subprocess_exec"),
    pytest.param("subprocess_shell", (None, "ls"), id="subprocess_shell"),
    pytest.param("add_reader", (0, print), id="add_reader"),
    pytest.param("remove_reader", (0,), id="remove_reader"),
    pytest.param("add_writer", (1, print), id="add_writer"),
    pytest.param("remove_writer", (1,), id="remove_writer"),
    pytest.param("sock_recv", (None, 1), id="sock_recv"),
    pytest.param("sock_recv_into", (None, bytearray(1)), id="sock_recv_into"),
    pytest.param("sock_recvfrom", (None, 1), id="sock_recvfrom"),
    pytest.param("sock_recvfrom_into", (None, bytearray(1)), id="sock_recvfrom_into"),
    pytest.param("sock_sendall", (None, b""), id="sock_sendall"),
    pytest.param("sock_sendto", (None, b"", ("127.0.0.1", 80)), id="sock_sendto"),
    pytest.param("sock_connect", (None, ("127.0.0.1", 80)), id="sock_connect"),
    pytest.param("sock_accept", (None,), id="sock_accept"),
    pytest.param("sock_sendfile", (None, None), id="sock_sendfile"),
    pytest.param("add_signal_handler", (15, print), id="add_signal_handler"),
    pytest.param("remove_signal_handler", (15,), id="remove_signal_handler"),
]


@pytest.mark.parametrize(("method", "args"), REFUSED)
def test_calls_replay_cannot_repeat_raise_nondeterministic_call(
    run: Run, method: str, args: tuple[object, ...]
) -> None:
    with pytest.raises(
        NondeterministicCall, match=rf"^{method} cannot run in workflow code: "
    ) as e:
        getattr(run.loop, method)(*args)
    if method not in ("run_forever", "run_until_complete", "stop") and "signal" not in method:
        assert "Do the work in a step: await ctx.step('name', fn)" in str(e.value)


def test_the_refusal_message_names_the_call_and_the_step() -> None:
    loop = WorkflowLoop(FakeHost())
    with pytest.raises(NondeterministicCall) as e:
        loop.run_in_executor(None, print)
    assert str(e.value) == (
        "run_in_executor cannot run in workflow code: threads are not replayed. "
        "Do the work in a step: await ctx.step('name', fn)"
    )
    loop.close()


def test_asyncio_to_thread_raises_nondeterministic_call_in_workflow_code(run: Run) -> None:
    task = run.start(asyncio.to_thread(print, "from a thread"))
    assert isinstance(task.exception(), NondeterministicCall)


def test_every_event_loop_method_is_defined_by_the_workflow_loop() -> None:
    names = [
        name
        for name, value in vars(asyncio.AbstractEventLoop).items()
        if callable(value) and not name.startswith("__")
    ]
    assert names
    for name in names:
        assert vars(WorkflowLoop)[name].__qualname__ == f"WorkflowLoop.{name}", name


def test_a_loop_method_from_a_newer_python_is_refused_by_name() -> None:
    class NewerLoop(asyncio.AbstractEventLoop):
        def frobnicate(self) -> None:
            raise NotImplementedError

    class Loop(WorkflowLoop):
        pass

    _name_refusals(Loop, NewerLoop)
    refused = vars(Loop)["frobnicate"]
    assert refused.__qualname__ == f"{Loop.__qualname__}.frobnicate"
    loop = Loop(FakeHost())
    with pytest.raises(
        NondeterministicCall,
        match=r"^frobnicate cannot run in workflow code: this loop method has no deterministic",
    ):
        refused(loop)
    loop.close()


def test_call_soon_sets_every_slot_handle_init_sets(run: Run) -> None:
    # call_soon builds its Handle without Handle.__init__: a Python whose
    # Handle gains, loses or fills a slot otherwise fails here, not in a run.
    context = contextvars.copy_context()
    made = run.loop.call_soon(print, "x", context=context)
    reference = asyncio.Handle(print, ("x",), run.loop, context)
    slots = [slot for slot in asyncio.Handle.__slots__ if slot != "__weakref__"]
    assert sorted(slots) == [
        "_args",
        "_callback",
        "_cancelled",
        "_context",
        "_loop",
        "_repr",
        "_source_traceback",
    ]
    assert {slot: getattr(made, slot) for slot in slots} == {
        slot: getattr(reference, slot) for slot in slots
    }
    made.cancel()


# -- objects of another loop ----------------------------------------------------------------


def _python_task(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = getattr(asyncio.tasks, "_PyTask")(coro, loop=loop, **kwargs)  # noqa: B009
    return task


@pytest.mark.parametrize(
    "task_factory",
    [pytest.param(None, id="c-task"), pytest.param(_python_task, id="python-task")],
)
@pytest.mark.expect_engine_errors("attached to a different loop")
def test_awaiting_a_future_of_another_loop_fails_with_advice(
    make_run: MakeRun, task_factory: Any
) -> None:
    run, other = make_run("run"), make_run("other")
    run.loop.set_task_factory(task_factory)
    foreign = other.loop.create_future()
    caught: list[BaseException] = []

    async def workflow() -> None:
        try:
            await foreign
        except RuntimeError as error:
            caught.append(error)

    task = run.start(workflow())
    task.result()
    [error] = caught
    assert type(error) is RuntimeError
    assert "attached to a different loop" in str(error)
    assert "Create asyncio.Event, Queue, Lock, Semaphore and Condition objects inside" in str(error)
    [context] = run.loop.errors
    assert isinstance(context["exception"], NondeterministicCall)
    assert context["task"] is task
    run.loop.errors.clear()


@pytest.mark.expect_engine_errors("is bound to a different event loop")
def test_awaiting_an_event_bound_to_another_loop_fails_with_advice(make_run: MakeRun) -> None:
    run, other = make_run("run"), make_run("other")
    event = asyncio.Event()
    other.start(event.wait())  # binds the event to the other loop

    async def workflow() -> None:
        await event.wait()

    task = run.start(workflow())
    error = task.exception()
    assert type(error) is RuntimeError
    assert "is bound to a different event loop" in str(error)
    assert "created or first used outside this workflow run" in str(error)
    [context] = run.loop.errors
    assert isinstance(context["exception"], NondeterministicCall)
    run.loop.errors.clear()
    event.set()
    other.turn()


@pytest.mark.asyncio
@pytest.mark.expect_engine_errors(
    "attached to a different loop", "is bound to a different event loop"
)
async def test_awaiting_objects_of_the_drivers_loop_fails_with_advice() -> None:
    real = asyncio.get_running_loop()
    run = Run()
    real_future = real.create_future()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.sleep(0)  # binds the event to the real loop

    async def await_future() -> None:
        await real_future

    async def await_event() -> None:
        await event.wait()

    on_future = run.loop.create_task(await_future())
    on_event = run.loop.create_task(await_event())
    run.turn()
    assert asyncio.get_running_loop() is real
    assert "awaited a future of another event loop" in str(on_future.exception())
    assert "first used outside this workflow run" in str(on_event.exception())
    assert [type(context["exception"]) for context in run.loop.errors] == [
        NondeterministicCall,
        NondeterministicCall,
    ]
    event.set()
    await waiter
    real_future.cancel()
    run.loop.shutdown()


# -- shutdown --------------------------------------------------------------------------------


def test_shutdown_runs_finally_blocks_but_not_cancellation_handlers(run: Run) -> None:
    log: list[str] = []

    async def workflow() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            log.append("except CancelledError")
            raise
        except Exception:
            log.append("except Exception")
            raise
        finally:
            log.append(f"finally, shutting down: {run.loop.is_shutting_down()}")
            await asyncio.sleep(1)  # fails at once: no hang
            log.append("after the await in finally")

    task = run.start(workflow())
    [timer] = run.host.started
    assert run.loop.is_running()
    run.loop.shutdown()
    assert log == ["finally, shutting down: True"]
    assert isinstance(task.exception(), RunEvicted)
    # A parked run keeps its timers: the host hears nothing.
    assert run.host.started == [timer]
    assert run.host.cancelled == []
    assert run.loop.is_closed()
    assert not run.loop.is_running()


def test_a_closed_loop_lets_go_of_its_host() -> None:
    # A run's driver is the host of its loop and refers to the loop: a closed
    # loop that kept it would leave every parked or ended run in a cycle.
    host = FakeHost()
    loop = WorkflowLoop(host)
    held = weakref.ref(host)
    turn(loop)
    loop.shutdown()
    del host
    gc.collect()  # what a reference cycle through the loop would need
    assert held() is None
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, lambda: None)


def test_shutdown_cancels_tasks_that_never_started_without_running_them(run: Run) -> None:
    log: list[str] = []

    async def workflow() -> None:
        log.append("started")

    task = run.loop.create_task(workflow())
    run.loop.shutdown()
    assert task.cancelled()
    assert log == []


def test_shutdown_does_not_deliver_a_result_the_driver_resolved_meanwhile(run: Run) -> None:
    log: list[object] = []
    fut = run.loop.create_future()

    async def workflow() -> None:
        log.append(await fut)

    task = run.start(workflow())
    fut.set_result("late")
    run.loop.shutdown()
    assert log == []
    assert isinstance(task.exception(), RunEvicted)


def test_shutdown_ends_groups_gathers_shields_and_timeouts_quietly(run: Run) -> None:
    log: list[str] = []
    fut = run.loop.create_future()

    async def child(name: str) -> None:
        try:
            await fut
        except asyncio.CancelledError:
            log.append(f"{name} cancelled")
            raise

    async def workflow() -> None:
        inner = asyncio.create_task(child("shielded"))
        queue: asyncio.Queue[int] = asyncio.Queue()
        lock = asyncio.Lock()
        await lock.acquire()
        async with asyncio.TaskGroup() as group:
            group.create_task(child("grouped"))
            group.create_task(asyncio.wait_for(child("wait_for"), 30))
            group.create_task(queue.get())
            group.create_task(lock.acquire())
            group.create_task(select(child("select a"), child("select b")))
            async with asyncio.timeout(60):
                await asyncio.gather(child("gathered"), asyncio.shield(inner))

    task = run.start(workflow())
    tasks = run.loop.tasks
    assert set(tasks) == asyncio.all_tasks(run.loop)
    assert len(tasks) == 11
    assert tasks[0] is task
    run.loop.shutdown()
    assert log == []
    assert all(t.done() for t in tasks)
    assert task.done()
    assert run.host.cancelled == []
    assert not fut.done()  # a journal future is the driver's: shutdown leaves it alone


def test_shutdown_ends_an_anyio_task_group_quietly(run: Run) -> None:
    # anyio's group ends with its children, with no error logged (one would
    # fail the test).
    fut = run.loop.create_future()
    ended: list[str] = []

    async def child(name: str) -> None:
        try:
            await fut
        finally:
            ended.append(name)

    async def workflow() -> None:
        async with anyio.create_task_group() as group:
            for name in ("a", "b", "c"):
                group.start_soon(child, name)
            await fut

    task = run.start(workflow())
    tasks = run.loop.tasks
    assert len(tasks) == 4
    run.loop.shutdown()
    assert sorted(ended) == ["a", "b", "c"]
    assert all(t.done() for t in tasks)
    assert task.done()


def test_shutdown_names_tasks_that_swallow_run_evicted(run: Run) -> None:
    fut = run.loop.create_future()

    log: list[str] = []

    async def stubborn() -> None:
        try:
            while True:
                with contextlib.suppress(RunEvicted):
                    await fut
        finally:
            log.append("closed")

    run.start(stubborn())
    with pytest.raises(RuntimeError, match=r"'run-task-1' of workflow run 'run' kept running"):
        run.loop.shutdown()
    assert run.loop.is_closed()
    assert log == ["closed"]  # now, not whenever the garbage collector gets to it


@pytest.mark.expect_engine_errors("raised while its run shut down")
def test_shutdown_reports_other_errors_raised_while_unwinding(run: Run) -> None:
    async def workflow() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            raise ValueError("cleanup failed")

    run.start(workflow())
    run.loop.shutdown()
    [context] = run.loop.errors
    assert isinstance(context["exception"], ValueError)
    assert "raised while its run shut down" in context["message"]
    run.loop.errors.clear()


def test_a_closed_loop_refuses_new_work_and_closing_again_does_nothing(run: Run) -> None:
    run.loop.close()
    run.loop.close()
    run.loop.shutdown()
    with pytest.raises(RuntimeError, match="closed"):
        run.loop.call_soon(print)
    with pytest.raises(RuntimeError, match="closed"):
        run.loop.call_later(1, print)
    with pytest.raises(RuntimeError, match="closed"):
        run.loop.enter()
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="closed"):
        run.loop.create_task(coro)
    coro.close()


def test_shutdown_cannot_run_from_the_loops_own_callbacks(run: Run) -> None:
    errors: list[BaseException] = []

    def shut() -> None:
        try:
            run.loop.shutdown()
        except RuntimeError as error:
            errors.append(error)

    run.loop.call_soon(shut)
    run.turn()
    assert "between turns" in str(errors[0])


# -- async generators --------------------------------------------------------------------------


def test_an_abandoned_async_generator_is_closed_inside_the_run(run: Run) -> None:
    log: list[object] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            log.append(("closed", asyncio.get_running_loop() is run.loop, current_name()))

    async def workflow() -> None:
        async for _ in numbers():
            break
        log.append("after the loop")

    run.start(workflow()).result()
    assert log == ["after the loop", ("closed", True, "run-asyncgen-close-1")]


def test_shutdown_closes_async_generators_left_open(run: Run) -> None:
    log: list[str] = []
    kept: list[AsyncIterator[int]] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            log.append("closed")

    async def workflow() -> None:
        agen = numbers()
        kept.append(agen)
        await agen.__anext__()

    run.start(workflow()).result()
    assert log == []
    run.loop.shutdown()
    assert log == ["closed"]


def test_shutdown_asyncgens_closes_them_from_workflow_code(run: Run) -> None:
    log: list[str] = []
    kept: list[AsyncIterator[int]] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
        finally:
            log.append("closed")

    async def workflow() -> None:
        agen = numbers()
        kept.append(agen)
        await agen.__anext__()
        await asyncio.get_running_loop().shutdown_asyncgens()

    run.start(workflow()).result()
    assert log == ["closed"]


# -- settings and the exception handler -------------------------------------------------------


def test_library_questions_get_sane_answers(run: Run) -> None:
    assert run.loop.is_running()
    assert not run.loop.is_closed()
    assert run.loop.get_debug() is False
    run.loop.set_debug(True)
    assert run.loop.get_debug() is True
    run.loop.set_debug(False)
    assert run.loop.name == "run"
    assert "WorkflowLoop 'run'" in repr(run.loop)
    assert not run.loop.is_shutting_down()


def test_a_custom_exception_handler_gets_the_contexts(run: Run) -> None:
    seen: list[dict[str, Any]] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        assert loop is run.loop
        seen.append(context)

    run.loop.set_exception_handler(handler)
    assert run.loop.get_exception_handler() is handler
    run.loop.call_exception_handler({"message": "one"})
    assert seen == [{"message": "one"}]
    assert run.loop.errors == []
    run.loop.set_exception_handler(None)
    with pytest.raises(TypeError):
        run.loop.set_exception_handler(42)  # type: ignore[arg-type]


@pytest.mark.expect_engine_errors("Unhandled error in exception handler")
def test_an_exception_handler_that_raises_is_reported_by_the_default_one(run: Run) -> None:
    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        raise ValueError("handler failed")

    run.loop.set_exception_handler(handler)
    run.loop.call_exception_handler({"message": "one"})
    [context] = run.loop.errors
    assert context["message"] == "Unhandled error in exception handler"
    assert context["context"] == {"message": "one"}
    run.loop.errors.clear()


def test_run_evicted_is_not_an_error(run: Run) -> None:
    run.loop.call_exception_handler({"message": "evicted", "exception": RunEvicted()})
    group = BaseExceptionGroup("evicted", [RunEvicted(), RunEvicted()])
    run.loop.call_exception_handler({"message": "group", "exception": group})
    assert run.loop.errors == []


# -- wait, as_completed, select --------------------------------------------------------------


def futures(run: Run, n: int) -> list[asyncio.Future[str]]:
    return [run.loop.create_future() for _ in range(n)]


@pytest.mark.parametrize(
    ("return_when", "resolve", "done", "pending"),
    [
        pytest.param(FIRST_COMPLETED, [2, 0], [0, 2], [1], id="first-completed-in-input-order"),
        pytest.param(ALL_COMPLETED, [2, 1, 0], [0, 1, 2], [], id="all-completed"),
        pytest.param(FIRST_EXCEPTION, [-1], [1], [0, 2], id="first-exception"),
    ],
)
def test_wait_returns_lists_in_input_order(
    run: Run, return_when: str, resolve: list[int], done: list[int], pending: list[int]
) -> None:
    futs = futures(run, 3)

    async def workflow() -> tuple[list[int], list[int]]:
        done, pending = await wait(futs, return_when=return_when)
        return [futs.index(f) for f in done], [futs.index(f) for f in pending]

    task = run.start(workflow())
    for index in resolve:
        if index < 0:
            futs[1].set_exception(ValueError("failed"))
        else:
            futs[index].set_result(str(index))
    run.turn()
    assert task.result() == (done, pending)
    for fut in futs:
        fut.cancel()
    if futs[1].done() and not futs[1].cancelled():
        futs[1].exception()


def test_wait_with_a_timeout_returns_what_is_done_when_the_timer_fires(run: Run) -> None:
    futs = futures(run, 2)

    async def workflow() -> tuple[int, int]:
        done, pending = await wait(futs, timeout=10)
        return len(done), len(pending)

    task = run.start(workflow())
    run.resolve(futs[1], "b")
    run.fire_next()
    assert task.result() == (1, 1)
    assert run.host.cancelled == []
    futs[0].cancel()


def test_wait_cancels_its_timer_when_done_in_time(run: Run) -> None:
    [fut] = futures(run, 1)
    task = run.start(wait([fut], timeout=10))
    [timer] = run.host.started
    run.resolve(fut, "a")
    assert task.result() == ([fut], [])
    assert run.host.cancelled == [timer]


def test_wait_returns_at_once_when_already_done(run: Run) -> None:
    [fut] = futures(run, 1)
    fut.set_result("a")

    async def workflow() -> list[str]:
        yielded: list[str] = []
        asyncio.get_running_loop().call_soon(yielded.append, "yielded")
        done, _ = await wait([fut, fut], timeout=10)
        assert done == [fut]
        return list(yielded)

    assert run.start(workflow()).result() == []
    assert run.host.started == []


@pytest.mark.parametrize(
    ("aws", "error"),
    [
        pytest.param([], ValueError, id="empty"),
        pytest.param(["not a future"], TypeError, id="not-a-future"),
    ],
)
def test_wait_refuses_bad_arguments(run: Run, aws: list[Any], error: type[Exception]) -> None:
    task = run.start(wait(aws))
    assert isinstance(task.exception(), error)


def test_wait_refuses_an_unknown_return_when(run: Run) -> None:
    [fut] = futures(run, 1)
    task = run.start(wait([fut], return_when="SOMETIMES"))
    assert isinstance(task.exception(), ValueError)


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        pytest.param([[2], [0], [1]], ["c", "a", "b"], id="across-turns-completion-order"),
        pytest.param([[2, 0, 1]], ["a", "b", "c"], id="within-one-turn-input-order"),
        pytest.param([[1], [2, 0]], ["b", "a", "c"], id="mixed"),
    ],
)
def test_as_completed_yields_in_completion_order_with_ties_in_input_order(
    run: Run, turns: list[list[int]], expected: list[str]
) -> None:
    futs = futures(run, 3)

    async def workflow() -> list[str]:
        return [fut.result() async for fut in as_completed(futs)]

    task = run.start(workflow())
    for indexes in turns:
        for index in indexes:
            futs[index].set_result("abc"[index])
        run.turn()
    assert task.result() == expected


def test_as_completed_also_yields_awaitables_of_results(run: Run) -> None:
    futs = futures(run, 2)

    async def double(fut: asyncio.Future[str]) -> str:
        return 2 * await fut

    async def workflow() -> list[str]:
        return [await next_done for next_done in as_completed([double(f) for f in futs])]

    task = run.start(workflow())
    run.resolve(futs[1], "b")
    run.resolve(futs[0], "a")
    assert task.result() == ["bb", "aa"]


def test_as_completed_times_out_after_yielding_what_is_done(run: Run) -> None:
    futs = futures(run, 2)
    seen: list[str] = []

    async def workflow() -> None:
        async for fut in as_completed(futs, timeout=10):
            seen.append(fut.result())

    task = run.start(workflow())
    run.resolve(futs[1], "b")
    run.fire_next()
    assert seen == ["b"]
    assert isinstance(task.exception(), TimeoutError)
    futs[0].cancel()


def test_breaking_out_of_as_completed_cancels_its_timer(run: Run) -> None:
    futs = futures(run, 2)

    async def workflow() -> str:
        async for fut in as_completed(futs, timeout=10):
            return fut.result()
        raise AssertionError("nothing completed")

    task = run.start(workflow())
    [timer] = run.host.started
    run.resolve(futs[0], "a")
    assert task.result() == "a"
    assert run.host.cancelled == [timer]
    futs[1].cancel()


def test_as_completed_can_be_iterated_once(run: Run) -> None:
    [fut] = futures(run, 1)
    fut.set_result("a")

    async def workflow() -> None:
        completed = as_completed([fut])
        for next_done in completed:
            await next_done
        iter(completed)

    task = run.start(workflow())
    assert isinstance(task.exception(), RuntimeError)


@pytest.mark.parametrize(
    ("resolve", "expected"),
    [
        pytest.param([1], (1, "b"), id="only-one"),
        pytest.param([2, 0], (0, "a"), id="tie-goes-to-the-first-argument"),
    ],
)
def test_select_returns_the_winner_and_cancels_the_losers(
    run: Run, resolve: list[int], expected: tuple[int, str]
) -> None:
    futs = futures(run, 3)
    log: list[str] = []

    async def racer(fut: asyncio.Future[str]) -> str:
        try:
            return await fut
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    racers: list[asyncio.Task[str]] = []

    async def workflow() -> tuple[int, str]:
        racers.extend(asyncio.create_task(racer(f)) for f in futs)
        return await select(*racers)

    task = run.start(workflow())
    for index in resolve:
        futs[index].set_result("abc"[index])
    run.turn()
    assert task.result() == expected
    assert all(r.done() for r in racers)
    assert log == ["cancelled"] * (3 - len(resolve))


def test_select_raises_what_the_winner_raised(run: Run) -> None:
    futs = futures(run, 2)
    task = run.start(select(futs[0], futs[1]))
    futs[1].set_exception(ValueError("lost"))
    run.turn()
    assert isinstance(task.exception(), ValueError)
    assert futs[0].cancelled()


def test_a_cancelled_select_cancels_everything_it_raced(run: Run) -> None:
    futs = futures(run, 2)
    task = run.start(select(*futs))
    task.cancel()
    run.turn()
    assert task.cancelled()
    assert all(fut.cancelled() for fut in futs)


def test_select_needs_something_to_race(run: Run) -> None:
    task: asyncio.Task[tuple[int, object]] = run.start(select())
    assert isinstance(task.exception(), ValueError)


# -- determinism -----------------------------------------------------------------------------


OPS = ["await", "yield", "gather", "wait", "spawn"]


def execute(program: list[list[str]], order: list[tuple[int, int, int]], failing: set[Any]) -> Any:
    host = FakeHost()
    loop = WorkflowLoop(host, name="prop")
    futs = {key: loop.create_future() for key in order}
    trace: list[object] = []

    def outcome(fut: asyncio.Future[Any]) -> str:
        return repr(fut.exception()) if fut.exception() else str(fut.result())

    async def settle(fut: asyncio.Future[Any]) -> str:
        await wait([fut])
        return outcome(fut)

    async def worker(i: int, ops: list[str]) -> None:
        for j, op in enumerate(ops):
            first, second = futs[(i, j, 0)], futs[(i, j, 1)]
            if op == "await":
                trace.append((current_name(), "await", await settle(first)))
            elif op == "yield":
                await asyncio.sleep(0)
                trace.append((current_name(), "yield"))
            elif op == "gather":
                await asyncio.gather(first, second, return_exceptions=True)
                trace.append((current_name(), "gather", outcome(first), outcome(second)))
            elif op == "wait":
                done, _ = await wait([second, first], return_when=FIRST_COMPLETED)
                trace.append((current_name(), "wait", [outcome(f) for f in done]))
            else:
                child = asyncio.create_task(settle(first))
                child.add_done_callback(lambda t: trace.append((t.get_name(), "done", t.result())))
                trace.append((current_name(), "spawned", child.get_name()))

    async def main() -> None:
        await asyncio.gather(*(worker(i, ops) for i, ops in enumerate(program)))
        trace.append("end")

    loop.create_task(main())
    turn(loop)
    for key in order:
        if key in failing:
            futs[key].set_exception(ValueError(str(key)))
        else:
            futs[key].set_result(str(key))
        trace.append(("deliver", key))
        turn(loop)
    loop.shutdown()
    assert loop.errors == []
    for fut in futs.values():
        if not fut.cancelled():
            fut.exception()
    return trace


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_the_same_deliveries_give_the_same_trace(data: st.DataObject) -> None:
    program = data.draw(
        st.lists(st.lists(st.sampled_from(OPS), min_size=1, max_size=4), min_size=1, max_size=4)
    )
    keys = [(i, j, k) for i, ops in enumerate(program) for j in range(len(ops)) for k in (0, 1)]
    order = data.draw(st.permutations(keys))
    failing = data.draw(st.sets(st.sampled_from(keys)))
    first = execute(program, order, failing)
    # Different addresses (so different hashes) for what the second run allocates.
    size = data.draw(st.integers(0, 300))
    ballast = [[None] * (n % 40) for n in range(size)] + [bytearray(n) for n in range(size)]
    gc.collect()
    second = execute(program, order, failing)
    del ballast
    assert first == second
    assert "end" in first


# -- start_eagerly -------------------------------------------------------------

_seen_var: contextvars.ContextVar[str] = contextvars.ContextVar("_seen_var", default="unset")


def _in_context(value: str) -> contextvars.Context:
    """A copy of the current context with `_seen_var` set to ``value``."""
    context = contextvars.copy_context()
    context.run(_seen_var.set, value)
    return context


async def test_an_eager_task_that_returns_at_once_ran_as_its_own_task_in_its_context() -> None:
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task()
    seen: list[tuple[asyncio.Task[Any] | None, str]] = []

    async def work() -> None:
        seen.append((asyncio.current_task(), _seen_var.get()))

    assert start_eagerly(loop, work(), _in_context("step")) is None
    [(task, value)] = seen
    assert task is not None
    assert task is not caller
    assert task.done()
    assert value == "step"
    assert asyncio.current_task() is caller  # the caller's task is put back
    assert _seen_var.get() == "unset"


async def test_an_eager_task_that_suspends_goes_on_as_the_same_task() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[str] = loop.create_future()
    seen: list[tuple[asyncio.Task[Any] | None, str]] = []

    async def work() -> None:
        seen.append((asyncio.current_task(), _seen_var.get()))
        seen.append((asyncio.current_task(), await gate))

    task = start_eagerly(loop, work(), _in_context("step"))
    assert task is not None
    assert not task.done()
    assert seen == [(task, "step")]  # ran to its first await before start_eagerly returned
    gate.set_result("woken")
    await task
    assert seen == [(task, "step"), (task, "woken")]


async def test_an_eager_task_cancelled_at_its_first_await_sees_cancelled_error_there() -> None:
    loop = asyncio.get_running_loop()
    inner = loop.create_task(asyncio.sleep(3600))
    outcome: list[str] = []

    async def work() -> None:
        try:
            await inner
        except asyncio.CancelledError:
            outcome.append("cancelled at its await")
            raise

    task = start_eagerly(loop, work(), contextvars.copy_context())
    assert task is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == ["cancelled at its await"]
    assert inner.cancelled()  # the awaited task is cancelled with it, as for any task


async def test_an_eager_task_holds_a_cancel_scope_and_timeout_entered_before_it_suspends() -> None:
    loop = asyncio.get_running_loop()
    ended: list[str] = []

    async def work() -> None:
        with anyio.move_on_after(0) as scope:
            await asyncio.sleep(3600)
        assert scope.cancelled_caught
        try:
            async with asyncio.timeout(0):
                await asyncio.sleep(3600)
        except TimeoutError:
            ended.append("timed out")

    task = start_eagerly(loop, work(), contextvars.copy_context())
    assert task is not None
    await task
    assert ended == ["timed out"]


async def test_an_eager_task_started_from_inside_another_task_leaves_that_task_current() -> None:
    loop = asyncio.get_running_loop()
    inside: list[bool] = []

    async def step() -> None:
        inside.append(asyncio.current_task() is not outer)

    async def caller() -> None:
        start_eagerly(loop, step(), contextvars.copy_context())
        inside.append(asyncio.current_task() is outer)

    outer = loop.create_task(caller())
    await outer
    assert inside == [True, True]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 starts a task eagerly on any loop")
async def test_an_eager_start_on_a_loop_whose_call_soon_is_its_own_makes_an_ordinary_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    seen: list[asyncio.Task[Any] | None] = []

    async def work() -> None:
        seen.append(asyncio.current_task())

    # A loop instance that shadows call_soon itself (instrumented, or a
    # loop type with no instance attributes) is left alone.
    monkeypatch.setattr(loop, "call_soon", loop.call_soon)
    task = start_eagerly(loop, work(), contextvars.copy_context())
    assert task is not None
    assert seen == []  # started by the loop, not at once
    await task
    assert seen == [task]
