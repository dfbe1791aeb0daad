"""The declaration language: iteration variables, tensors, placeholder and compute operations."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import Expr, ExprLike, IntImm, ProducerLoad, Reduce, Var, const, to_expr
from ..ir.functor import ExprVisitor


class AxisVar(Var):
    """The loop variable of an IterVar; lets ``compute`` tell axes apart from size variables."""

    __slots__ = ()


class IterVarKind:
    DATA_PAR = "data_par"
    REDUCE = "reduce"
    THREAD = "thread"
    OPAQUE = "opaque"


class _ExprOps:
    """Arithmetic on objects that stand for an expression (IterVar, rank-0 tensors)."""

    def as_expr(self) -> Expr:
        raise NotImplementedError

    def __add__(self, o: ExprLike) -> Expr:
        return self.as_expr() + o

    def __radd__(self, o: ExprLike) -> Expr:
        return o + self.as_expr()

    def __sub__(self, o: ExprLike) -> Expr:
        return self.as_expr() - o

    def __rsub__(self, o: ExprLike) -> Expr:
        return o - self.as_expr()

    def __mul__(self, o: ExprLike) -> Expr:
        return self.as_expr() * o

    def __rmul__(self, o: ExprLike) -> Expr:
        return o * self.as_expr()

    def __floordiv__(self, o: ExprLike) -> Expr:
        return self.as_expr() // o

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return self.as_expr().__rfloordiv__(o)

    def __mod__(self, o: ExprLike) -> Expr:
        return self.as_expr() % o

    def __rmod__(self, o: ExprLike) -> Expr:
        return self.as_expr().__rmod__(o)

    def __truediv__(self, o: ExprLike) -> Expr:
        return self.as_expr() / o

    def __rtruediv__(self, o: ExprLike) -> Expr:
        # through Expr's own, so 2 / i raises TVM's division-ambiguity error like i / 2
        return self.as_expr().__rtruediv__(o)

    def __neg__(self) -> Expr:
        return -self.as_expr()

    def __lt__(self, o: ExprLike) -> Expr:
        return self.as_expr() < o

    def __le__(self, o: ExprLike) -> Expr:
        return self.as_expr() <= o

    def __gt__(self, o: ExprLike) -> Expr:
        return self.as_expr() > o

    def __ge__(self, o: ExprLike) -> Expr:
        return self.as_expr() >= o

    def __and__(self, o: ExprLike) -> Expr:
        return self.as_expr() & o

    def __rand__(self, o: ExprLike) -> Expr:
        return o & self.as_expr()

    def __or__(self, o: ExprLike) -> Expr:
        return self.as_expr() | o

    def __ror__(self, o: ExprLike) -> Expr:
        return o | self.as_expr()

    def __xor__(self, o: ExprLike) -> Expr:
        return self.as_expr() ^ o

    def __rxor__(self, o: ExprLike) -> Expr:
        return o ^ self.as_expr()

    def __lshift__(self, o: ExprLike) -> Expr:
        return self.as_expr() << o

    def __rlshift__(self, o: ExprLike) -> Expr:
        return o << self.as_expr()

    def __rshift__(self, o: ExprLike) -> Expr:
        return self.as_expr() >> o

    def __rrshift__(self, o: ExprLike) -> Expr:
        return o >> self.as_expr()

    def __invert__(self) -> Expr:
        return ~self.as_expr()

    # == and != stay identity comparisons: IterVars and Tensors are used as dict keys and list
    # members all over the schedule code.

    def astype(self, dtype: str) -> Expr:
        return self.as_expr().astype(dtype)


@dataclass(eq=False)
class Range:
    """Half-open ``[min, min + extent)``."""

    min: Expr
    extent: Expr

    def __repr__(self) -> str:
        return f"range(min={self.min}, ext={self.extent})"


class IterVar(_ExprOps):
    """An iteration axis: a variable, its domain, and whether it is spatial or a reduction."""

    def __init__(self, dom: Range | None, var: Var, kind: str, thread_tag: str = "") -> None:
        self.dom = dom
        self.var = var
        self.kind = kind
        self.thread_tag = thread_tag

    def as_expr(self) -> Expr:
        return self.var

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"IterVar({self.var.name}, {self.dom}, {self.kind})"

    def __str__(self) -> str:
        return self.var.name


def var(name: str = "v", dtype: str = "int32") -> Var:
    """A symbolic scalar (typically a shape dimension bound at call time)."""
    return Var(name, dt.canonical(dtype))


def size_var(name: str = "n", dtype: str = "int32") -> Var:
    return var(name, dtype)


def _to_range(r: Any) -> Range:
    if isinstance(r, Range):
        return r
    if isinstance(r, (tuple, list)) and len(r) == 2:
        lo, hi = to_expr(r[0]), to_expr(r[1])
        from ..arith.simplify import simplify

        return Range(lo, simplify(hi - lo))
    ext = to_expr(r)
    return Range(const(0, ext.dtype), ext)


def reduce_axis(dom: Any, name: str = "rv") -> IterVar:
    """A reduction axis over ``dom`` = (begin, end) or an extent."""
    return IterVar(_to_range(dom), AxisVar(name, "int32"), IterVarKind.REDUCE)


def thread_axis(*args: Any, **kwargs: Any) -> IterVar:
    """A GPU thread/block index (``"threadIdx.x"``, ``"blockIdx.x"``, ``"vthread"``...) for
    ``bind``. TVM's signature ``thread_axis(dom=None, tag="", name="")`` (e.g.
    ``thread_axis((0, 2), "vthread", name="vx")``) and the short ``thread_axis("threadIdx.x")``
    (also with ``name=``/``dom=`` keywords) both work."""
    kwargs.pop("span", None)
    if args and not isinstance(args[0], str):  # TVM's order: (dom, tag, name)
        keys = ("dom", "tag", "name")
    else:
        keys = ("tag", "name", "dom")
    if len(args) > 3:
        raise TypeError(f"thread_axis takes at most 3 positional arguments, got {len(args)}")
    got: dict[str, Any] = {}
    for k, v in zip(keys, args):
        got[k] = v
    for k, v in kwargs.items():
        if k not in ("dom", "tag", "name"):
            raise TypeError(f"thread_axis got an unexpected keyword argument {k!r}")
        if k in got:
            raise TypeError(f"thread_axis got multiple values for argument {k!r}")
        got[k] = v
    tag, name, dom = got.get("tag", ""), got.get("name", ""), got.get("dom")
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"thread_axis needs a tag such as 'threadIdx.x', got {tag!r}")
    r = _to_range(dom) if dom is not None else None
    return IterVar(r, AxisVar(name or tag, "int32"), IterVarKind.THREAD, tag)


# tensors and operations ---------------------------------------------------------------------


class Operation:
    """A node of the compute DAG producing one or more tensors."""

    name: str
    tag: str = ""
    attrs: dict[str, Any]

    @property
    def num_outputs(self) -> int:
        return 1

    def output(self, i: int) -> Tensor:
        return self.outputs[i]

    outputs: list[Tensor]

    @property
    def input_tensors(self) -> list[Tensor]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class Tensor(_ExprOps):
    """A value produced by an operation; indexing it (``A[i, j]``) yields an expression."""

    def __init__(self, shape: tuple[Expr, ...], dtype: str, op: Operation, value_index: int = 0):
        self.shape = shape
        self.dtype = dtype
        self.op = op
        self.value_index = value_index

    @property
    def name(self) -> str:
        n = self.op.name
        return n if self.op.num_outputs == 1 else f"{n}.v{self.value_index}"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: Any) -> Any:
        """``A[i, j]`` loads an element; ``A[i]`` of a 2-D tensor is a `TensorSlice` that
        ``A[i][j]`` completes (TVM's chained indexing)."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) > len(self.shape) or (not idx and self.shape):
            raise TecompError(
                f"tensor {self.name} has {len(self.shape)} dimensions but was indexed with "
                f"{len(idx)} indices"
            )
        exprs = []
        for k, i in enumerate(idx):
            e = to_expr(i)
            if not dt.is_int(e.dtype) or dt.lanes(e.dtype) != 1:
                raise TecompError(
                    f"index {k} of tensor {self.name} must be a scalar integer, got {e.dtype}"
                )
            exprs.append(e)
        if len(exprs) < len(self.shape):
            return TensorSlice(self, tuple(exprs))
        return ProducerLoad(self, tuple(exprs))

    def __call__(self, *indices: Any) -> Expr:
        """``A(i, j)`` is ``A[i, j]`` (TVM's call syntax, e.g. ``A(*i)`` in a lambda); unlike
        ``A[i]``, a call takes every index at once (no slice), as in TVM."""
        if len(indices) != len(self.shape):
            raise TecompError(
                f"tensor {self.name} has {len(self.shape)} dimensions but was called with "
                f"{len(indices)} indices")
        return self[indices]  # type: ignore[no-any-return]

    def as_expr(self) -> Expr:
        if self.shape:
            raise TecompError(f"tensor {self.name} of rank {len(self.shape)} used as a scalar")
        return ProducerLoad(self, ())

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape=({', '.join(map(str, self.shape))}), {self.dtype})"

    __str__ = __repr__


class TensorSlice(_ExprOps):
    """``A[i]`` of a tensor of higher rank (TVM's TensorSlice): index it further
    (``A[i][j]``) until every dimension has an index; using it as a value before that is an
    error naming the tensor."""

    def __init__(self, tensor: Tensor, indices: tuple[Expr, ...]) -> None:
        self.tensor = tensor
        self.indices = indices

    def __getitem__(self, idx: Any) -> Any:
        more = idx if isinstance(idx, tuple) else (idx,)
        have = len(self.indices) + len(more)
        if have > len(self.tensor.shape):
            raise TecompError(
                f"tensor {self.tensor.name} has {len(self.tensor.shape)} dimensions but was "
                f"indexed with {have} indices (chained indexing)")
        return self.tensor[(*self.indices, *more)]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    def as_expr(self) -> Expr:
        raise TecompError(
            f"tensor {self.tensor.name} has {len(self.tensor.shape)} dimensions but was indexed "
            f"with {len(self.indices)} indices where a value is needed (a partial index is a "
            f"slice: complete it, e.g. {self.tensor.name}[i][j])")

    def __repr__(self) -> str:
        return f"TensorSlice({self.tensor.name}, {len(self.indices)} of {len(self.tensor.shape)} indices)"


class PlaceholderOp(Operation):
    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: str) -> None:
        self.name = name
        self.attrs = {}
        self.shape = shape
        self.dtype = dtype
        self.outputs = [Tensor(shape, dtype, self, 0)]


class ComputeOp(Operation):
    """``out[axis] = body`` for every point of the axis domain (body may be a Reduce)."""

    def __init__(
        self,
        name: str,
        axis: list[IterVar],
        body: list[Expr],
        tag: str = "",
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.axis = axis
        self.body = body
        self.reduce_axis: list[IterVar] = list(body[0].axis) if isinstance(body[0], Reduce) else []
        shape = tuple(iv.dom.extent for iv in axis if iv.dom is not None)
        self.outputs = [Tensor(shape, b.dtype, self, k) for k, b in enumerate(body)]

    @property
    def num_outputs(self) -> int:
        return len(self.body)

    @property
    def input_tensors(self) -> list[Tensor]:
        found: list[Tensor] = []
        seen: set[int] = set()

        class _V(ExprVisitor):
            def visit_ProducerLoad(self, e: ProducerLoad) -> None:
                t = e.producer
                key = id(t.op) * 64 + t.value_index
                if key not in seen:
                    seen.add(key)
                    found.append(t)
                super().visit_ProducerLoad(e)

        v = _V()
        for b in self.body:
            v.visit(b)
        return found


def placeholder(shape: Sequence[ExprLike] | ExprLike, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of ``shape`` (ints or symbolic `te.var`s)."""
    seq_shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    dims = tuple(_dim(s, name, k) for k, s in enumerate(seq_shape))
    return PlaceholderOp(name, dims, dt.canonical(dtype)).output(0)


def _dim(s: Any, name: str, k: int) -> Expr:
    e = to_expr(s)
    if not dt.is_int(e.dtype):
        raise TecompError(f"dimension {k} of {name} must be an integer, got {e}")
    if isinstance(e, IntImm) and e.value < 0:
        raise TecompError(f"dimension {k} of {name} is negative ({e.value})")
    return e


def compute(
    shape: Sequence[ExprLike] | ExprLike,
    fcompute: Callable[..., Any],
    name: str = "compute",
    tag: str = "",
    attrs: dict[str, Any] | None = None,
) -> Any:
    """Declare ``out[i, j, ...] = fcompute(i, j, ...)`` over ``shape``.

    Returns one Tensor, or a list of Tensors when ``fcompute`` returns a tuple (e.g. argmax
    with a tuple comm_reducer).
    """
    seq_shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    dims = tuple(_dim(s, name, k) for k, s in enumerate(seq_shape))
    params = list(inspect.signature(fcompute).parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        names = [f"i{k}" for k in range(len(dims))]
    else:
        names = [p.name for p in params]
        if len(names) != len(dims):
            raise TecompError(
                f"compute {name}: fcompute takes {len(names)} arguments but the shape has "
                f"{len(dims)} dimensions"
            )
    axis = [
        IterVar(Range(const(0, d.dtype), d), AxisVar(n, d.dtype if d.dtype != "int32" else "int32"),
                IterVarKind.DATA_PAR)
        for n, d in zip(names, dims)
    ]
    out = fcompute(*[iv.var for iv in axis])
    bodies = list(out) if isinstance(out, (tuple, list)) else [out]
    body = [to_expr(b) for b in bodies]
    _check_body(name, axis, body)
    op = ComputeOp(name, axis, body, tag, attrs)
    return op.outputs if len(body) > 1 else op.output(0)


def _check_body(name: str, axis: list[IterVar], body: list[Expr]) -> None:
    """Reject reads that use another compute's axes, or a reduce axis outside its reduction."""
    own = {iv.var for iv in axis}
    if any(isinstance(b, Reduce) for b in body):
        if not all(isinstance(b, Reduce) for b in body):
            raise TecompError(f"compute {name}: a reduction must be the whole body of every output")
        first = body[0]
        for b in body[1:]:
            if b.axis != first.axis or b.combiner is not first.combiner:  # type: ignore[attr-defined]
                raise TecompError(f"compute {name}: all outputs must share one reduction")

    class _Check(ExprVisitor):
        def __init__(self) -> None:
            self.allowed = set(own)

        def visit_Var(self, e: Var) -> None:
            if isinstance(e, AxisVar) and e not in self.allowed:
                raise TecompError(
                    f"compute {name}: expression uses axis '{e.name}' that is neither an axis of "
                    f"{name} nor a reduce axis of an enclosing reduction"
                )

        def visit_Reduce(self, e: Reduce) -> None:
            saved = set(self.allowed)
            self.allowed |= {iv.var for iv in e.axis}
            for iv in e.axis:
                self.visit(iv.dom.min)
                self.visit(iv.dom.extent)
            super().visit_Reduce(e)
            self.allowed = saved

    class _Nested(ExprVisitor):
        def visit_Reduce(self, e: Reduce) -> None:
            raise TecompError(
                f"compute {name}: a reduction must be the whole body (te.sum(...) / n is not "
                "allowed); compute the reduction in its own te.compute and divide in another"
            )

    for b in body:
        if isinstance(b, Reduce):
            for x in (*b.source, b.condition):
                _Nested().visit(x)
        else:
            _Nested().visit(b)
    c = _Check()
    for b in body:
        c.visit(b)
    _check_nested_reduce(name, body)


def _check_nested_reduce(name: str, body: list[Expr]) -> None:
    class _N(ExprVisitor):
        depth = 0

        def visit_Reduce(self, e: Reduce) -> None:
            if self.depth > 0:
                raise TecompError(f"compute {name}: nested reductions are not supported; use two computes")
            self.depth += 1
            super().visit_Reduce(e)
            self.depth -= 1

    for b in body:
        if isinstance(b, Reduce):
            n = _N()
            n.depth = 1
            for s in b.source:
                n.visit(s)
        else:
            _N().visit(b)
