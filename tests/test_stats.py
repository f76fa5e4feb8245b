"""Output statistics (mbbatch.stats): intervals, histogram quantiles and the
steady-state check."""

import numpy as np

from mbbatch.stats import backlog_growing


def test_backlog_heuristic():
    S = 10.0
    level = np.full(32, 50.0) + np.sin(np.arange(32)) * 5
    growing = np.linspace(0, 5000, 32)
    assert not backlog_growing(level, S)
    assert backlog_growing(growing, S)
    assert not backlog_growing(np.full(32, np.nan), S)
