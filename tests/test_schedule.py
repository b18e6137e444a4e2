"""`fusee.Schedule` (fusee/_schedule.py): checked when made; its ticks and run ids."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

import fusee
from fusee._schedule import manual_run_id, parse_spec, run_id, spec_text


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, n: int) -> int:
    return n


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    when = datetime.datetime(year, month, day, hour, minute, tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        pytest.param({}, ValueError, "cron=... or every=..., exactly one", id="neither"),
        pytest.param({"cron": "* * * * *", "every": "1m"}, ValueError, "exactly one", id="both"),
        pytest.param({"cron": "61 * * * *"}, ValueError, "not a cron expression", id="cron"),
        pytest.param(
            {"cron": "* * * * *", "tz": "Mars/Olympus"}, ValueError, "unknown time zone", id="tz"
        ),
        pytest.param({"every": "10ms"}, ValueError, "under a second", id="every"),
        pytest.param(
            {"every": "1m", "overlap": "queue"}, ValueError, "overlap must be one of", id="overlap"
        ),
        pytest.param({"every": "1m", "input": "x"}, fusee.PayloadError, "does not fit", id="input"),
    ],
)
def test_a_bad_schedule_is_refused_when_made(
    kw: dict[str, Any], error: type[Exception], match: str
) -> None:
    kw.setdefault("input", 1)
    with pytest.raises(error, match=match):
        fusee.Schedule("s", job, **kw)


def test_a_schedule_needs_a_workflow_definition() -> None:
    with pytest.raises(TypeError, match="needs a workflow"):
        fusee.Schedule("s", job.fn, every="1m")  # type: ignore[arg-type]


def test_cron_ticks_follow_the_time_zone_and_intervals_the_epoch() -> None:
    nightly = fusee.Schedule("n", job, cron="0 2 * * *", tz="Europe/Paris", input=1)
    # 02:00 in Paris is 01:00 UTC in winter, 00:00 UTC in summer.
    assert nightly.next_tick(ms(2026, 1, 1)) == ms(2026, 1, 1, 1)
    assert nightly.next_tick(ms(2026, 6, 30, 12)) == ms(2026, 7, 1, 0)
    hourly = fusee.Schedule("h", job, every="1h", input=1)
    assert hourly.ticks(ms(2026, 1, 1, 0, 30), ms(2026, 1, 1, 3)) == [
        ms(2026, 1, 1, 1),
        ms(2026, 1, 1, 2),
        ms(2026, 1, 1, 3),
    ]


def test_run_ids_name_the_tick_in_utc_to_the_second() -> None:
    assert run_id("nightly", ms(2026, 12, 1, 2)) == "nightly-2026-12-01T02:00:00+00:00"
    assert manual_run_id("nightly", ms(2026, 12, 1, 2) + 5) == (
        "nightly-manual-2026-12-01T02:00:00.005+00:00"
    )


def test_the_spec_changes_with_what_the_schedule_ticks_on() -> None:
    a = fusee.Schedule("s", job, every="1m", input=1)
    b = fusee.Schedule("s", job, every="2m", input=1)
    c = fusee.Schedule("s", job, every="1m", input=1, overlap="allow")
    assert len({a.spec, b.spec, c.spec}) == 3


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(dict(every="90s"), id="every"),
        pytest.param(dict(cron="0 2 * * 1-5", tz="Europe/Paris"), id="cron-in-a-zone"),
        pytest.param(
            dict(every="1h", overlap="buffer_one", catch_up="3h", queue="reports"),
            id="on-a-queue",
        ),
    ],
)
def test_a_stored_spec_reads_back_as_the_schedule_it_came_from(schedule: dict[str, Any]) -> None:
    made = fusee.Schedule("s", job, input=1, **schedule)
    again = fusee.Schedule("s", job, input=1, **parse_spec(made.spec))
    assert again.spec == made.spec
    assert again.ticks(0, 10 * 86_400_000) == made.ticks(0, 10 * 86_400_000)


def test_a_spec_parse_refuses_text_no_schedule_writes() -> None:
    with pytest.raises(ValueError, match="is not a schedule's spec"):
        parse_spec("hourly; overlap skip")
    with pytest.raises(ValueError, match="at 'color red'"):
        parse_spec("every 1000ms; color red")


def test_a_spec_reads_with_its_durations_as_written() -> None:
    s = fusee.Schedule("s", job, every="1h30m", input=1, overlap="allow", catch_up="10m")
    assert spec_text(s.spec) == "every 1h30m; overlap allow; catch_up 10m"
