"""scripts/bench's gap section: how a row's rounds are shown (BENCHMARKS.md, section 3)."""

from __future__ import annotations

from benchmarks.bench.sections.gap import runs


def test_one_round_is_its_count_and_several_their_median_then_each():
    assert runs([714292.4]) == "714,292"
    assert runs([715744.0, 714078.0, 714292.0]) == "714,292 (715,744 / 714,078 / 714,292)"
    assert runs([2.0, 4.0]) == "3 (2 / 4)"  # an even count: the mean of the middle two


def test_a_row_the_other_checkout_lacks_is_a_dash():
    assert runs(None) == "-" and runs([]) == "-"
