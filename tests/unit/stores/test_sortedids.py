"""SortedIds behaves as a sorted set, whatever the order of adds and discards."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stores import sortedids
from stores.sortedids import SortedIds

keys = st.integers(0, 300).map(lambda i: f"{i:04d}")
actions = st.lists(
    st.tuples(st.sampled_from(["add", "discard", "update"]), st.lists(keys, max_size=40)), max_size=80
)


@settings(max_examples=200)
@given(actions, st.one_of(st.none(), keys))
def test_matches_a_sorted_set(actions: list[tuple[str, list[str]]], cursor: str | None) -> None:
    sortedids.LOAD = 4  # small chunks: splits and empty chunks happen within a few adds
    try:
        ids, model = SortedIds(), set()
        for action, values in actions:
            if action == "update":
                ids.update(values)
                model.update(values)
            for value in values[:3]:
                getattr(ids, action if action != "update" else "add")(value)
                (model.add if action != "discard" else model.discard)(value)
            assert len(ids) == len(model)
        assert list(ids) == sorted(model)
        assert list(ids.after(cursor)) == sorted(v for v in model if cursor is None or v > cursor)
        assert all((value in ids) == (value in model) for value in ("0000", "0150", "0300", "9999"))
    finally:
        sortedids.LOAD = 1000
