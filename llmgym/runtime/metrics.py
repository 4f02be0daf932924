"""Evaluation metrics shared by benchmarks and the command line."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["bootstrap_interval", "mean_confidence_interval", "pass_at_k", "reward_interval", "wilson_interval"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): ``1 − C(n−c, k) / C(n, k)`` for ``c`` passes in ``n`` samples.

    Computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` for numerical stability.

    Example:
        >>> from llmgym.runtime.metrics import pass_at_k
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

    Symmetric, so near a bound it can leave the values' range (``0.016 ± 0.031`` for rewards in
    [0, 1]); :func:`reward_interval` respects the range.

    Example:
        >>> from llmgym.runtime.metrics import mean_confidence_interval
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


def _z(confidence: float) -> float:
    from statistics import NormalDist

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(mean: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for the mean ``mean`` of ``n`` observations in [0, 1] (pass/fail rates).

    ``(p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``: always inside [0, 1], and not empty
    at 0 or 1 passes (where a normal interval shrinks to a point or leaves [0, 1]). For observations
    that are means of several pass/fail samples (a task's pass rate), it is conservative: a value in
    [0, 1] with mean p has variance at most p(1−p), the variance the interval assumes.

    Example:
        >>> from llmgym.runtime.metrics import wilson_interval
        >>> low, high = wilson_interval(0.0, 164)
        >>> low, round(high, 4)
        (0.0, 0.0229)
        >>> [round(x, 3) for x in wilson_interval(0.5, 4)]
        [0.15, 0.85]
    """
    if n < 1:
        raise ValueError(f"wilson_interval needs n >= 1, got {n}")
    if not 0.0 <= mean <= 1.0:
        raise ValueError(f"wilson_interval needs a mean in [0, 1], got {mean}")
    z2 = _z(confidence) ** 2
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = math.sqrt(z2 * mean * (1 - mean) / n + z2 * z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampled with replacement, seeded).

    Every resampled mean lies between the smallest and the largest value, so the interval never
    leaves the range the values came from (a reward in [0, 1] gets an interval in [0, 1]).

    Example:
        >>> from llmgym.runtime.metrics import bootstrap_interval
        >>> low, high = bootstrap_interval([0.2, 0.4, 0.4, 0.6, 0.9])
        >>> 0.2 <= low < 0.5 < high <= 0.9
        True
        >>> bootstrap_interval([0.25])
        (0.25, 0.25)
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    _z(confidence)  # checks the level
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(max(low, x.min())), float(min(high, x.max()))


def reward_interval(values: Sequence[float], pass_fail: bool, confidence: float = 0.95,
                    seed: int = 0) -> tuple[float, float, str]:
    """A confidence interval for the mean of ``values`` (one per task) that respects the reward's range.

    ``pass_fail`` (every reward 0 or 1): the Wilson score interval over the ``len(values)`` tasks
    (:func:`wilson_interval`); otherwise a percentile bootstrap over the tasks
    (:func:`bootstrap_interval`). Returns ``(low, high, method)`` with method ``"wilson"`` or
    ``"bootstrap"``.

    Example:
        >>> from llmgym.runtime.metrics import reward_interval
        >>> low, high, method = reward_interval([0.0, 0.0, 1.0, 0.0], pass_fail=True)
        >>> method, 0.0 < low < 0.25 < high < 1.0
        ('wilson', True)
        >>> reward_interval([0.5, 0.5], pass_fail=False)
        (0.5, 0.5, 'bootstrap')
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("reward_interval needs at least one value")
    if pass_fail:
        low, high = wilson_interval(float(x.mean()), int(x.size), confidence)
        return low, high, "wilson"
    low, high = bootstrap_interval(x, confidence, seed=seed)
    return low, high, "bootstrap"
