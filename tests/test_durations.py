"""Tests of `fusee._durations`: the duration forms the public API accepts.

The rules under test are the module's: strings of ``<number><unit>`` parts
from the largest unit to the smallest, numbers of seconds and timedeltas are
durations; nothing negative, non-finite or ambiguous is; and `duration_ms`
never rounds down, so a timer never fires early.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee._durations import duration_ms, format_ms, parse_duration

ACCEPTED = (
    "use a number of seconds, a timedelta, or a string like "
    "'500ms', '10s', '5m', '2h', '1d', '1h30m'"
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("1s", 1.0, id="seconds"),
        pytest.param("10m", 600.0, id="minutes"),
        pytest.param("2h", 7_200.0, id="hours"),
        pytest.param("1d", 86_400.0, id="days"),
        pytest.param("250us", 0.000_25, id="microseconds"),
        pytest.param("250µs", 0.000_25, id="micro-sign"),
        pytest.param("250\u03bcs", 0.000_25, id="greek-mu"),
        pytest.param("1h30m", 5_400.0, id="hours-and-minutes"),
        pytest.param("1m30s", 90.0, id="minutes-and-seconds"),
        pytest.param("2d12h", 216_000.0, id="days-and-hours"),
        pytest.param("1d2h3m4s5ms6us", 93_784.005_006, id="every-unit"),
        pytest.param("1.5s", 1.5, id="fraction"),
        pytest.param("0.25h", 900.0, id="fraction-of-hour"),
        pytest.param("90m", 5_400.0, id="more-minutes-than-an-hour"),
        pytest.param("0s", 0.0, id="zero"),
        pytest.param("1h 30m", 5_400.0, id="space-between-parts"),
        pytest.param("  10s\n", 10.0, id="space-around"),
        pytest.param("007s", 7.0, id="leading-zeros"),
        pytest.param(0, 0.0, id="int-zero"),
        pytest.param(10, 10.0, id="int"),
        pytest.param(1.5, 1.5, id="float"),
        pytest.param(2**40, float(2**40), id="large-int"),
        pytest.param(dt.timedelta(minutes=1, microseconds=5), 60.000_005, id="timedelta"),
        pytest.param(dt.timedelta(0), 0.0, id="zero-timedelta"),
    ],
)
def test_valid_durations_parse_to_seconds(
    value: str | float | dt.timedelta, seconds: float
) -> None:
    parsed = parse_duration(value)

    assert type(parsed) is float
    assert parsed == seconds


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("5 minutes", "", id="words"),
        pytest.param("1w", "", id="weeks"),
        pytest.param("1x", "", id="unknown-unit"),
        pytest.param("1H", "", id="uppercase-unit"),
        pytest.param("10", "", id="no-unit"),
        pytest.param("5 m", "", id="space-inside-a-part"),
        pytest.param("1h,30m", "", id="comma"),
        pytest.param("1.s", "", id="fraction-without-digits"),
        pytest.param(".5s", "", id="no-leading-digit"),
        pytest.param("1e3s", "", id="exponent"),
        pytest.param("-1s", "", id="negative-string"),
        pytest.param("+1s", "", id="plus-sign"),
        pytest.param("nan", "", id="nan-string"),
        pytest.param("\u0661s", "", id="non-ascii-digit"),
        pytest.param("1s1h", "largest to smallest", id="misordered"),
        pytest.param("1h1h", "each at most once", id="repeated"),
        pytest.param("1us1µs", "each at most once", id="micro-twice"),
        pytest.param("", "it is empty", id="empty"),
        pytest.param("   ", "it is empty", id="blank"),
        pytest.param(-1, "it is negative", id="negative-int"),
        pytest.param(-0.5, "it is negative", id="negative-float"),
        pytest.param(float("nan"), "it is not finite", id="nan"),
        pytest.param(float("inf"), "it is not finite", id="inf"),
        pytest.param(True, "a bool is not a duration", id="true"),
        pytest.param(False, "a bool is not a duration", id="false"),
        pytest.param(dt.timedelta(seconds=-1), "it is negative", id="negative-timedelta"),
        pytest.param("9" * 400 + "d", "it is too large", id="too-large-for-a-float"),
        pytest.param("9" * 5_000 + "s", "the number is too long", id="too-many-digits"),
    ],
)
def test_invalid_durations_raise_value_error_showing_the_input_and_the_forms(
    value: str | float | dt.timedelta, why: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"invalid duration {value!r}: {ACCEPTED}")) as e:
        parse_duration(value)
    assert why in str(e.value)


def test_the_error_for_a_worded_duration_reads_as_documented() -> None:
    expected = (
        "invalid duration '5 minutes': use a number of seconds, a timedelta, "
        "or a string like '500ms', '10s', '5m', '2h', '1d', '1h30m'"
    )

    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        parse_duration("5 minutes")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="none"),
        pytest.param([1], id="list"),
        pytest.param(b"1s", id="bytes"),
        pytest.param(decimal.Decimal(1), id="decimal"),
    ],
)
def test_values_of_other_types_raise_type_error(value: object) -> None:
    with pytest.raises(TypeError, match=r"invalid duration .* of type"):
        parse_duration(value)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        duration_ms(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        pytest.param("1m30s", 90_000, id="string"),
        pytest.param("1.1s", 1_100, id="decimal-fraction-is-exact"),
        pytest.param(1.1, 1_100, id="float-read-as-written"),
        pytest.param(0.1, 100, id="tenth"),
        pytest.param("1us", 1, id="microsecond-rounds-up"),
        pytest.param("1.0005s", 1_001, id="half-ms-rounds-up"),
        pytest.param(0.0001, 1, id="small-float-rounds-up"),
        pytest.param(dt.timedelta(microseconds=1_500), 2, id="timedelta-rounds-up"),
        pytest.param(dt.timedelta(days=1), 86_400_000, id="timedelta-day"),
        pytest.param("0s", 0, id="zero"),
        pytest.param(2**70, 2**70 * 1_000, id="huge-int-stays-exact"),
    ],
)
def test_duration_ms_rounds_up_to_whole_milliseconds(
    value: str | float | dt.timedelta, ms: int
) -> None:
    assert duration_ms(value) == ms


def test_duration_ms_refuses_what_parse_duration_refuses() -> None:
    with pytest.raises(ValueError, match="invalid duration '1s1h'"):
        duration_ms("1s1h")


units = st.integers(min_value=0, max_value=10_000)


@settings(max_examples=200, deadline=None)
@given(
    d=st.none() | units,
    h=st.none() | units,
    m=st.none() | units,
    s=st.none() | units,
    ms=st.none() | units,
    gap=st.sampled_from(["", " "]),
)
def test_formatted_parts_parse_to_their_sum(
    d: int | None, h: int | None, m: int | None, s: int | None, ms: int | None, gap: str
) -> None:
    parts = [(d, "d", 86_400), (h, "h", 3_600), (m, "m", 60), (s, "s", 1)]
    text = gap.join(f"{n}{unit}" for n, unit, _ in parts if n is not None)
    if ms is not None:
        text += f"{gap}{ms}ms"
    if not text:
        text = "0s"
    exact = sum(Fraction(n * per) for n, _, per in parts if n is not None)
    exact += Fraction(ms or 0, 1_000)

    assert parse_duration(text) == float(exact)
    assert duration_ms(text) == exact * 1_000


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=1e12, allow_nan=False))
def test_a_number_of_seconds_parses_to_itself_and_never_to_fewer_ms(seconds: float) -> None:
    ms = duration_ms(seconds)

    assert parse_duration(seconds) == seconds
    # Compared as floats: the float is read as its shortest decimal, which
    # is the float, though a hair away from its binary value.
    assert float(Fraction(ms - 1, 1_000)) <= seconds <= float(Fraction(ms, 1_000))


@settings(max_examples=200, deadline=None)
@given(st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=10**6)))
def test_a_timedelta_never_becomes_fewer_milliseconds(delta: dt.timedelta) -> None:
    ms = duration_ms(delta)

    assert dt.timedelta(milliseconds=ms - 1) < delta <= dt.timedelta(milliseconds=ms)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        pytest.param(3_600_000, "1h", id="an-hour"),
        pytest.param(5_400_000, "1h30m", id="hours-and-minutes"),
        pytest.param(86_400_000 + 1, "1d1ms", id="a-day-and-a-millisecond"),
        pytest.param(1_500, "1s500ms", id="seconds-and-milliseconds"),
        pytest.param(0, "0s", id="zero"),
    ],
)
def test_milliseconds_format_as_a_person_writes_them(ms: int, text: str) -> None:
    assert format_ms(ms) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**15))
def test_a_formatted_duration_parses_back_to_its_milliseconds(ms: int) -> None:
    assert duration_ms(format_ms(ms)) == ms


def test_a_negative_duration_does_not_format() -> None:
    with pytest.raises(ValueError, match="it is negative"):
        format_ms(-1)
