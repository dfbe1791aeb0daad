"""Buffers: named, typed regions of memory that loads and stores address."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import dtype as dt
from .expr import Expr, Var


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """A dense row-major array.

    ``shape`` may hold symbolic Vars; ``data`` is the pointer variable that codegen binds.
    ``strides`` (in elements) is empty for compact row-major layout, or one stride per axis when
    ``storage_align`` pads rows. ``scope`` is "global" for kernel arguments, "local" for
    temporaries the kernel allocates.
    """

    name: str
    shape: tuple[Expr, ...]
    dtype: str
    data: Var = field(default=None)  # type: ignore[assignment]
    strides: tuple[Expr, ...] = ()
    scope: str = "global"
    align: int = 64

    def __post_init__(self) -> None:
        if self.data is None:
            object.__setattr__(self, "data", Var(self.name, "handle"))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return dt.itemsize(self.dtype)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.dtype}, [{', '.join(map(str, self.shape))}])"

    __hash__ = object.__hash__
