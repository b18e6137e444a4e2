"""Tests of the pytest plugin's ``fusee_no_errors_logged`` fixture, in small pytest sessions."""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest

@pytest.fixture(autouse=True)
def _no_errors_logged(fusee_no_errors_logged: None) -> None:
    pass
"""

BROKEN = {
    "fusee-error": """
import logging

def test_it():
    logging.getLogger("fusee").error("fusee engine task failed")
""",
    "task-destroyed": """
import asyncio

async def forever():
    await asyncio.Event().wait()

def test_it():
    loop = asyncio.new_event_loop()
    task = loop.create_task(forever())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    del task
""",
    "exception-in-callback": """
import asyncio

def boom():
    raise ValueError("boom")

async def main():
    asyncio.get_running_loop().call_soon(boom)
    await asyncio.sleep(0)

def test_it():
    asyncio.run(main())
""",
    "run-loop-error": """
import asyncio
import fusee
from fusee.testing import TestEngine

async def fails():
    raise ValueError("nobody awaits me")

@fusee.workflow("orphan")
async def orphan(ctx: fusee.Ctx) -> int:
    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    del task
    return 1

async def main():
    async with TestEngine(workflows=[orphan]) as t:
        assert await t.execute(orphan, "o-1") == 1

def test_it():
    asyncio.run(main())
""",
}


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # In a process of its own: the errors the session logs on purpose must
    # not reach this session's own check.
    return pytester.runpytest_subprocess(
        "-p", "no:randomly", "-o", "asyncio_default_fixture_loop_scope=function", *args
    )


def test_a_test_in_which_an_engine_broke_quietly_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**{f"test_{k.replace('-', '_')}": v for k, v in BROKEN.items()})
    result = _run(pytester)
    # Each test passes its call and errors at teardown, where the check runs.
    result.assert_outcomes(passed=len(BROKEN), errors=len(BROKEN))
    result.stdout.fnmatch_lines_random(
        [
            "*fusee ERROR: fusee engine task failed*",
            "*asyncio ERROR: Task was destroyed but it is pending!*",
            "*asyncio ERROR: Exception in callback*boom*",
            "*a run's loop's exception handler: Task exception was never retrieved*",
        ]
    )


def test_a_task_a_fixture_held_is_blamed_on_its_test_at_the_next_tests_start(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
import asyncio
import pytest

async def forever():
    await asyncio.Event().wait()

@pytest.fixture
def held():
    loop = asyncio.new_event_loop()
    task = loop.create_task(forever())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    return [task]  # pytest drops it after the test's teardown

def test_holds(held):
    pass

def test_next():
    pass
"""
    )
    result = _run(pytester)
    # test_next errors at its setup, before it runs.
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_next*",
            "*after the previous test, test_a_task_a_fixture_held_*::test_holds, its leftovers*",
            "*Task was destroyed but it is pending!*",
        ]
    )


def test_only_the_errors_a_test_marks_as_expected_pass(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    marked = {
        "test_pattern": "@pytest.mark.expect_engine_errors('task failed')",
        "test_any": "@pytest.mark.expect_engine_errors",
        "test_other_pattern": "@pytest.mark.expect_engine_errors('other')",
        "test_two_markers": (
            "@pytest.mark.expect_engine_errors('other')\n"
            "@pytest.mark.expect_engine_errors('engine task')"
        ),
    }
    pytester.makepyfile(
        **{
            name: BROKEN["fusee-error"].replace("def test_it", f"import pytest\n\n{m}\ndef test_it")
            for name, m in marked.items()
        },
        test_warning="""
import logging

def test_it():
    logging.getLogger("fusee").warning("only a warning")
""",
    )
    result = _run(pytester, "--strict-markers")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["ERROR test_other_pattern.py::test_it*"])
