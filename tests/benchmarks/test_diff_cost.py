"""What ``instrument diff`` costs: the bootstrap of 500 regions over 1,000 reports, the
regions resampled together against one at a time, interleaved in the same rounds."""

from __future__ import annotations

import random
from typing import Any

import pytest
from paired import Contender

from instrument import diffstats

REGIONS = 500
REPORTS = 1000


@pytest.mark.benchmark(group="diff")
def test_the_regions_resampled_together_and_one_at_a_time(paired: Any) -> None:
    rng = random.Random(0)
    pairs = [
        ([rng.random() for _ in range(REPORTS)], [rng.random() for _ in range(REPORTS)])
        for _ in range(REGIONS)
    ]
    tenth = pairs[: REGIONS // 10]

    def one_at_a_time() -> None:  # a tenth of them: the whole takes ten times as long
        for a, b in tenth:
            diffstats.shift(a, b)

    paired(
        [
            Contender("500 regions together", lambda: diffstats.shifts(pairs), inner=1,
                      baseline=True),
            Contender("50 regions one at a time", one_at_a_time, inner=1),
        ],
        rounds=5,
        warmup_rounds=1,
    )  # fmt: skip
