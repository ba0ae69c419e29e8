"""Whether a tensor holds NaN or inf, in one pass and without a boolean copy of it."""

from __future__ import annotations

import torch

__all__ = ["first_nonfinite"]


def first_nonfinite(t: torch.Tensor) -> list[int] | None:
    """The index of ``t``'s first NaN or inf entry, or None when every entry is finite.

    The sum propagates NaN and inf (and ``inf - inf`` is NaN), so a finite sum proves every entry
    finite in one pass with no boolean copy; only when it is not (a NaN, an inf, or a sum that
    overflows) are the entries looked at one by one."""
    if not t.numel() or not (t.is_floating_point() or t.is_complex()):
        return None
    if bool(torch.isfinite(t.sum())):
        return None
    bad = (~torch.isfinite(t)).nonzero()
    return bad[0].tolist() if bad.numel() else None
