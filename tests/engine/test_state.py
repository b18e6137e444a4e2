"""A shard's alarms: one per run id and position, kept compact for parked runs."""

from __future__ import annotations

import itertools
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.engine._state import Alarms
from fusee.engine._timers import TIMER, Alarm, Timers

_KEYS = st.tuples(st.sampled_from(["a", "b"]), st.integers(-1, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _KEYS), max_size=30))
def test_a_shards_alarms_answer_as_a_dict_by_run_and_position(
    ops: list[tuple[bool, tuple[str, int]]],
) -> None:
    # One alarm per (id, position); an id holds its lone alarm itself and
    # a dict only while it has more, which no caller may see.
    alarms, model = Alarms(), {}
    for put, (id, seq) in ops:
        if put:
            alarm = Alarm(cast(Timers, None), id, 1, seq, TIMER)
            alarms.put(alarm)
            model[id, seq] = alarm
        else:
            assert alarms.pop(id, seq) is model.pop((id, seq), None)
        assert alarms == model
        assert len(alarms) == len(model)
        for id, seq in itertools.product("abc", range(-1, 4)):
            assert alarms.at(id, seq) is model.get((id, seq))
    handles = [_Handle() for _ in model]
    for alarm, handle in zip(model.values(), handles, strict=True):
        alarm.handle = handle
    alarms.cancel_all()
    assert len(alarms) == 0
    assert all(h.cancelled for h in handles)


class _Handle:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
