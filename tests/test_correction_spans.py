"""The closure of a correction's window under the spans of one group's rows (correct/edges.py)."""

from __future__ import annotations

from bergstream.runtime.correct.edges import closure

START, END = 100, 200


def test_rows_within_the_window_or_beside_it_leave_it_as_it_is() -> None:
    assert closure([(100, 150), (150, 200), (40, 100), (200, 260), (120, 120)], START, END) == (START, END)


def test_a_row_across_an_edge_widens_the_window_to_its_span() -> None:
    assert closure([(80, 120)], START, END) == (80, END)
    assert closure([(180, 230)], START, END) == (START, 230)
    assert closure([(50, 250)], START, END) == (50, 250)


def test_rows_that_overlap_the_widened_window_widen_it_again_whatever_their_order() -> None:
    # Main's session [60, 90) meets the backfill's [80, 120), which crosses the start; [10, 60) meets none.
    rows = [(10, 60), (60, 90), (80, 120), (190, 210), (205, 300), (300, 320)]
    assert closure(rows, START, END) == (60, 300)
    assert closure(list(reversed(rows)), START, END) == (60, 300)
