"""kiteq-server's collector settings: young generation collected less often, startup frozen."""

from __future__ import annotations

import gc

from kiteq.gc_tuning import YOUNG_THRESHOLD, tune_gc


def test_tune_gc_raises_the_young_threshold_and_freezes_what_exists() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
