"""Holm's correction for a family of paired differences read together (the automatic reading, the zero-shot table).

Reading 40 cells at 5% each calls about two of them significant when nothing differs. Holm's step-down
procedure keeps the family-wise error rate at alpha: sort the m p-values, compare the i-th smallest (1-based)
with alpha / (m - i + 1), and stop at the first that fails. The adjusted p-value of the i-th smallest is
max over j <= i of min(1, (m - j + 1) p_(j)); a cell is significant when its adjusted p-value is <= alpha.
A NaN p-value (no resample, no scorable item) is not part of the family and stays NaN.
"""

from __future__ import annotations

import numpy as np


def holm(p_values: np.ndarray | list[float]) -> np.ndarray:
    """Holm-adjusted p-values, in the input order (NaN in, NaN out; m counts the finite ones)."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = finite.size
    if m == 0:
        return out
    order = finite[np.argsort(p[finite], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)  # step-down: an adjusted p never falls below an earlier one
    return out


def holm_significant(p_values: np.ndarray | list[float], alpha: float) -> np.ndarray:
    """Which cells Holm's procedure calls significant at family-wise level alpha (False where p is NaN)."""
    adjusted = holm(p_values)
    return np.isfinite(adjusted) & (adjusted <= alpha)
