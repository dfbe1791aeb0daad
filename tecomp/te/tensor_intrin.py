"""Tensor intrinsics: a compute pattern plus the code that replaces it (``tensorize``).

``decl_tensor_intrin(op, fimpl)`` declares that loop nests computing ``op`` (a small compute
over placeholders) may be replaced by ``fimpl(ins, outs)``, where ``ins``/``outs`` are
`TensorRegion`s describing where the matched tiles live in the real buffers. ``fimpl`` returns a
statement, an expression (e.g. ``te.call_extern(...)``) or a list of them. For a reduction the
implementation must *accumulate* into the output (tecomp emits the initialisation itself, from
the reducer's identity), or return a ``(body, reset, update)`` triple as in TVM: ``update`` is
the tensorized loop nest's body and ``reset``, when not None, replaces the element-wise
initialisation of the tiles (inside the spatial loops outside the tensorized axis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TecompError
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Call, Expr, Ramp, const, to_expr
from ..ir.stmt import BufferStore, Evaluate, Stmt, seq
from .tensor import ComputeOp, Operation, PlaceholderOp, Tensor


@dataclass(eq=False)
class TensorRegion:
    """A tile of a real buffer as seen by an intrinsic implementation.

    ``elem_offset`` is the flat element offset of the tile's first element in ``buffer``;
    ``shape`` and ``strides`` (in elements) are the tile's own dimensions, i.e. those of the
    intrinsic's placeholder (buffer dimensions the tile does not span are squeezed out, as in
    TVM). ``vload``/``vstore``/``access_ptr`` address relative to the tile origin; check
    ``strides`` before assuming a dimension is contiguous.
    """

    buffer: Buffer
    elem_offset: Expr
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    @property
    def name(self) -> str:
        return self.buffer.name

    def offset(self, idx: Sequence[Any]) -> Expr:
        """Flat element offset of tile index ``idx`` in the underlying buffer."""
        if len(idx) != len(self.shape):
            raise TecompError(
                f"tensor region {self.name}: expected {len(self.shape)} indices, got {len(idx)}"
            )
        flat: Expr = self.elem_offset
        for i, s in zip(idx, self.strides):
            flat = flat + to_expr(i) * s
        from ..arith.simplify import simplify

        return simplify(flat)

    def access_ptr(self, mode: str = "r", offset: Sequence[Any] | None = None) -> Expr:
        """Pointer to the tile's first element (or to ``offset`` within the tile)."""
        idx = offset if offset is not None else [0] * len(self.shape)
        return Call("handle", "address_of", (BufferLoad(self.buffer, (self.offset(idx),)),))

    def vload(self, idx: Sequence[Any], lanes: int = 1) -> Expr:
        """Load ``lanes`` consecutive elements of the buffer starting at tile index ``idx``."""
        off = self.offset(idx)
        if lanes == 1:
            return BufferLoad(self.buffer, (off,))
        return BufferLoad(self.buffer, (Ramp(off, const(1), lanes),))

    def vstore(self, idx: Sequence[Any], value: Expr) -> Stmt:
        from ..ir import dtype as dt

        off = self.offset(idx)
        n = dt.lanes(value.dtype)
        index = off if n == 1 else Ramp(off, const(1), n)
        return BufferStore(self.buffer, value, (index,))

    def __getitem__(self, idx: Any) -> Expr:
        return self.vload(idx if isinstance(idx, tuple) else (idx,))


@dataclass(eq=False)
class TensorIntrin:
    name: str
    op: ComputeOp
    inputs: list[Tensor]
    fimpl: Callable[..., Any]

    def implement(self, ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        return self.implement_parts(ins, outs)[0]

    def implement_parts(self, ins: list[TensorRegion], outs: list[TensorRegion]) -> tuple[Stmt, Stmt | None]:
        """The update statement and, for a ``(body, reset, update)`` triple with a reset, the
        reset: TVM's way for an accumulator only the intrinsic can address (a tensor-core
        fragment) to be initialised by the intrinsic rather than by element stores."""
        res = self.fimpl(ins, outs)
        reset = None
        if isinstance(res, tuple) and len(res) == 3:
            if res[1] is not None:
                reset = _as_stmt(res[1], self.name)
            res = res[2] if res[2] is not None else res[0]
        return _as_stmt(res, self.name), reset


def _as_stmt(res: Any, name: str) -> Stmt:
    if isinstance(res, Stmt):
        return res
    if isinstance(res, Expr):
        return Evaluate(res)
    if isinstance(res, (list, tuple)):
        return seq(*[_as_stmt(r, name) for r in res])
    raise TecompError(f"tensor intrinsic {name}: implementation returned {type(res).__name__}, "
                      "expected a statement or an expression")


def decl_tensor_intrin(
    op: Operation | Tensor,
    fcompute: Callable[..., Any],
    name: str = "tensor_intrin",
    binds: dict[Any, Any] | None = None,
) -> TensorIntrin:
    """Declare a tensor intrinsic for ``op`` implemented by ``fcompute(ins, outs)``."""
    if isinstance(op, Tensor):
        op = op.op
    if not isinstance(op, ComputeOp):
        raise TecompError("decl_tensor_intrin: op must be a te.compute operation")
    inputs = op.input_tensors
    for t in inputs:
        if not isinstance(t.op, PlaceholderOp):
            raise TecompError(
                f"decl_tensor_intrin {name}: input {t.name} must be a placeholder"
            )
    return TensorIntrin(name, op, inputs, fcompute)
