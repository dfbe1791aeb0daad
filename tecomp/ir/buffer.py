"""Buffers: named, typed regions of memory that loads and stores address."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    # TVM's decl_buffer fields: the element offset of the buffer's first element from
    # ``data`` (0, a constant, or a Var the binding fixes) and the factor it is a multiple of
    elem_offset: Expr = field(default=None)  # type: ignore[assignment]
    offset_factor: int = 0

    def __post_init__(self) -> None:
        if self.data is None:
            object.__setattr__(self, "data", Var(self.name, "handle"))
        if self.elem_offset is None:
            from .expr import const

            object.__setattr__(self, "elem_offset", const(0))

    def access_ptr(self, access_mask: Any = "rw", ptr_type: str = "handle",
                   content_lanes: int = 1, offset: Any = 0, extent: Any = None) -> Expr:
        """A pointer to the buffer's first element plus ``offset`` elements (TVM's
        ``Buffer.access_ptr``; ``access_mask`` ("r", "w", "rw" or TVM's bit mask) is
        accepted for compatibility: extern calls may read and write any pointer they get)."""
        from .expr import BufferLoad, Call, to_expr

        if isinstance(access_mask, str) and set(access_mask) - set("rw"):
            raise ValueError(f"access_ptr of {self.name}: access mask must be made of 'r' and "
                             f"'w', got {access_mask!r}")
        if ptr_type != "handle":
            raise ValueError(f"access_ptr of {self.name}: only ptr_type='handle' is supported")
        idx = to_expr(offset)
        if not (hasattr(self.elem_offset, "value") and self.elem_offset.value == 0):
            idx = self.elem_offset + idx
        return Call("handle", "address_of", (BufferLoad(self, (idx,)),))

    def vload(self, begin: Any, dtype: str | None = None) -> Expr:
        """Load the element at index ``begin`` (a tuple, one index per dimension)."""
        from .expr import BufferLoad, to_expr

        idx = begin if isinstance(begin, (tuple, list)) else (begin,)
        return BufferLoad(self, tuple(to_expr(i) for i in idx))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return dt.itemsize(self.dtype)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.dtype}, [{', '.join(map(str, self.shape))}])"

    def __getitem__(self, idx: Any) -> Expr:
        """``buf[i, j]``: a load of one element (in extern bodies written in the IR)."""
        return self.vload(idx)

    __hash__ = object.__hash__
