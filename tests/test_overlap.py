"""The union of intervals behind ``Node.concurrent_time``: overlaps counted once, memory
bounded."""

from __future__ import annotations

import pytest

from instrument import overlap
from instrument.overlap import Union, merged


def test_merged_joins_overlapping_and_touching_intervals() -> None:
    assert merged([(5, 7), (0, 2), (1, 3), (3, 4), (6, 6), (9, 10)]) == [(0, 4), (5, 7), (9, 10)]
    assert merged([]) == []


def test_a_union_added_in_parts_is_the_union_of_all() -> None:
    parts = [[(0, 10), (20, 30)], [(5, 25)], [(40, 50), (45, 46)], [(29, 41)]]
    union = Union()
    for part in parts:
        union.add(part)
    assert union.length() == 50
    assert union.pieces == [(0, 50)]


def test_past_the_bound_the_older_pieces_fold_into_their_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(overlap, "MAX_PIECES", 4)
    union = Union()
    union.add([(10 * i, 10 * i + 2) for i in range(10)])  # 10 pieces of 2 ns, 8 ns apart
    assert len(union.pieces) <= 4
    assert union.length() == 20  # exact
    assert union.horizon == 72  # (the end of the last piece folded)
    union.add([(91, 105), (200, 210)])  # after the horizon: exact
    assert union.length() == 20 + 13 + 10
    union.add([(0, 73)])  # reaching back before it: counted from the horizon on
    assert union.length() == 20 + 13 + 10 + 1
    assert len(union.pieces) <= 4
