"""Evaluation metrics shared by benchmarks and the command line."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["pass_at_k", "mean_confidence_interval"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): ``1 − C(n−c, k) / C(n, k)`` for ``c`` passes in ``n`` samples.

    Computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` for numerical stability.

    Example:
        >>> from llmgym.metrics import pass_at_k
        >>> pass_at_k(10, 0, 1), pass_at_k(10, 10, 5), round(pass_at_k(10, 3, 1), 3), round(pass_at_k(4, 1, 2), 3)
        (0.0, 1.0, 0.3, 0.5)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_confidence_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation confidence interval.

    Example:
        >>> from llmgym.metrics import mean_confidence_interval
        >>> mean, half = mean_confidence_interval([0.0, 1.0, 0.0, 1.0])
        >>> mean, round(half, 3)
        (0.5, 0.566)
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_confidence_interval needs at least one value")
    if x.size == 1:
        return float(x[0]), 0.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return float(x.mean()), float(z * x.std(ddof=1) / math.sqrt(x.size))
