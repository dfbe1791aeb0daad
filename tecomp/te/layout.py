"""cache_read / cache_write with a permuted layout: the copy stores its dimensions in another order.

``cache_read_layout(s, W, "pack", [C], (1, 2, 3, 0))`` makes ``W.pack[ci, kh, kw, co] =
W[co, ci, kh, kw]`` and has ``C`` read ``W.pack`` with its indices permuted the same way, so a
loop over ``co`` walks the copy contiguously (a vector load instead of a gather).
``cache_write_layout(s, C, "local", (0, 2, 3, 1))`` computes ``C`` into ``C.local[n, h, w, c]``
(its axes in that order) and turns ``C`` into the copy ``C[n, c, h, w] = C.local[n, h, w, c]``:
the accumulator of a tile is then contiguous along ``c``. These are the layout rewrites of a
blocked convolution (the vector over output channels) expressed as schedule primitives, so the
user's arrays keep their layout and the transform is a stage of the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .tensor import Operation, Tensor

if TYPE_CHECKING:
    from .schedule import Schedule


def _check_order(order: Sequence[int], ndim: int, what: str) -> tuple[int, ...]:
    out = tuple(int(k) for k in order)
    if sorted(out) != list(range(ndim)):
        raise ScheduleError(f"{what}: order {tuple(order)} is not a permutation of the "
                            f"{ndim} dimensions")
    return out


def cache_read_layout(sch: Schedule, tensor: Tensor, scope: str,
                      readers: Sequence[Tensor | Operation], order: Sequence[int]) -> Tensor:
    """Copy ``tensor`` into a new stage ``"<name>.<scope>"`` whose dimension ``k`` is the
    tensor's dimension ``order[k]``; ``readers`` read the copy (indices permuted alike)."""
    perm = _check_order(order, len(tensor.shape), f"cache_read_layout of {tensor.name}")
    return sch._cache_read(tensor, scope, readers, perm, "cache_read_layout")


def cache_write_layout(sch: Schedule, tensor: Tensor, scope: str, order: Sequence[int]) -> Tensor:
    """Compute ``tensor`` into a new stage ``"<name>.<scope>"`` whose axis ``k`` is the
    tensor's axis ``order[k]``; ``tensor``'s stage becomes a copy out of it."""
    op = sch[tensor].op
    perm = _check_order(order, len(getattr(op, "axis", tensor.shape)), f"cache_write_layout of {op.name}")
    return sch._cache_write(tensor, scope, perm, "cache_write_layout")


__all__ = ["cache_read_layout", "cache_write_layout"]
