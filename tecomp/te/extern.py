"""External operations (TVM's ``te.extern``): a stage whose body is code the user writes,
typically a call into a C library (``te.call_extern("int32", "cblas_sgemm", ...)``) that gets
the buffers as pointers (``buf.data`` / ``buf.access_ptr("r")``).

``decl_buffer`` (TVM's ``tvm.tir.decl_buffer``) declares the buffers the body sees; lowering
binds them to the real storage of the inputs and outputs (`bind_extern_body`). Intermediate
buffers are C-contiguous; a kernel argument bound (``binds=``) to a buffer with strides keeps
them (`arg_layout`): each symbolic stride (TVM's ``strides=[te.var("s"), 1]``) is an int64
kernel argument bound at call time from the array's strides, like a symbolic dim, so an extern
function gets the pointer and can be passed the stride (a BLAS ``lda``). An extern's declared
strides are unified with those of the storage it is bound to: a symbolic one takes the real
stride, a constant one must equal it, and a buffer declared without strides must be bound to
compact storage. The array is passed by its own data pointer, so elem_offset is 0 (a symbolic
one is bound to 0, and ``offset_factor`` promises nothing more than the element alignment
numpy gives).

For the interpreter (`tecomp.runtime.interp`), ``register_extern(name, fn)`` gives a C symbol
a Python implementation; it receives `interp.Pointer` values for pointers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..arith.simplify import simplify
from ..errors import LoweringError, TecompError
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Call, Expr, IntImm, Var, const, to_expr
from ..ir.functor import StmtMutator, substitute
from ..ir.stmt import BufferStore, Evaluate, Stmt, seq
from .tensor import Operation, Tensor, _dim

# Python implementations of extern symbols for the interpreter (name -> callable)
PY_EXTERNS: dict[str, Callable[..., Any]] = {}


def register_extern(name: str, fn: Callable[..., Any] | None = None) -> Any:
    """Give the extern symbol ``name`` a Python implementation that the interpreter calls
    (compiled code calls the C symbol). Usable as a decorator: ``@register_extern("f")``."""
    def reg(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TecompError(f"register_extern({name!r}): expected a callable, got {f!r}")
        PY_EXTERNS[name] = f
        return f

    if not isinstance(name, str) or not name:
        raise TecompError(f"register_extern: the symbol name must be a string, got {name!r}")
    return reg if fn is None else reg(fn)


def decl_buffer(
    shape: Sequence[Any] | Any,
    dtype: str = "float32",
    name: str = "buffer",
    data: Var | None = None,
    strides: Sequence[Any] | None = None,
    elem_offset: Any = None,
    scope: str = "",
    data_alignment: int = -1,
    offset_factor: int = 0,
    buffer_type: str = "",
    axis_separators: Any = None,
    span: Any = None,
) -> Buffer:
    """A buffer declaration (TVM's ``tvm.tir.decl_buffer``), for ``te.extern``'s
    ``in_buffers``/``out_buffers`` and ``build``/``lower``'s ``binds``."""
    seq_shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    dims = tuple(_dim(s, name, k) for k, s in enumerate(seq_shape))
    if data is not None and (not isinstance(data, Var) or data.dtype != "handle"):
        raise TecompError(f"decl_buffer {name}: data must be a handle Var, got {data!r}")
    st: tuple[Expr, ...] = ()
    if strides is not None and len(strides):
        if len(strides) != len(dims):
            raise TecompError(f"decl_buffer {name}: {len(strides)} strides for {len(dims)} "
                              "dimensions")
        st = tuple(to_expr(s) for s in strides)
    if elem_offset is None:
        # TVM: a free offset (a multiple of offset_factor) when offset_factor is given
        off: Expr = Var(f"{name}_elem_offset", "int32") if offset_factor else const(0)
    else:
        off = to_expr(elem_offset)
    if axis_separators:
        raise TecompError(f"decl_buffer {name}: axis_separators are not supported")
    align = data_alignment if data_alignment and data_alignment > 0 else 64
    return Buffer(name, dims, dt.canonical(dtype), data=data, strides=st,  # type: ignore[arg-type]
                  scope=scope or "global", align=align, elem_offset=off,
                  offset_factor=int(offset_factor or 0))


def _compact(shape: Sequence[Expr]) -> list[Expr]:
    out: list[Expr] = []
    acc: Expr = const(1)
    for d in reversed(shape):
        out.append(acc)
        acc = simplify(acc * d)
    return list(reversed(out))


def layout_vars(buf: Buffer, shape: Sequence[Expr], what: str,
                strides: Sequence[Expr] | None = ()) -> dict[Var, Expr]:
    """Values of ``buf``'s free layout variables (shape, strides, elem_offset) for the array
    of ``shape`` it stands for, C-contiguous unless ``strides`` (in elements) are given: those
    of the storage (a strided argument's, `arg_layout`). ``strides=None`` leaves ``buf``'s
    strides unchecked (an extern's declaration, checked against its storage at lowering).
    TecompError when ``buf`` cannot describe that array (a wrong rank, a constant extent,
    stride or offset that disagrees, no strides for strided storage)."""
    if len(buf.shape) != len(shape):
        raise TecompError(f"{what}: buffer {buf.name} has {len(buf.shape)} dimensions, the "
                          f"tensor has {len(shape)} ({', '.join(map(str, shape))})")
    vmap: dict[Var, Expr] = {}

    def unify(e: Expr, want: Expr, field: str) -> None:
        e = substitute(e, vmap) if vmap else e
        if isinstance(e, Var) and e.dtype != "handle":
            if e is not want:
                vmap[e] = want
            return
        a, b = simplify(e), simplify(want)
        if isinstance(a, IntImm) and isinstance(b, IntImm):
            if a.value != b.value:
                raise TecompError(f"{what}: {field} of buffer {buf.name} is {a.value}, but the "
                                  f"tensor needs {b.value}")
        elif str(a) != str(b):
            raise TecompError(f"{what}: {field} of buffer {buf.name} is {a}, expected {b}")

    for k, (d, want) in enumerate(zip(buf.shape, shape)):
        unify(d, want, f"dimension {k}")
    if strides and not buf.strides:
        # the extern function would address strided storage as if it were compact
        raise TecompError(
            f"{what}: buffer {buf.name} is declared without strides (C-contiguous), but it is "
            f"bound to strided storage (strides [{', '.join(map(str, strides))}]); declare it "
            f"with strides=[te.var(...), ...] and pass the stride to the extern function")
    if buf.strides and strides is not None:
        how = "strided storage" if strides else "C-contiguous storage"
        for k, (s, want) in enumerate(zip(buf.strides, strides or _compact(shape))):
            unify(s, want, f"stride {k} ({how})")
    unify(buf.elem_offset, const(0, buf.elem_offset.dtype), "elem_offset")
    return vmap


def arg_layout(buf: Buffer, shape: Sequence[Expr], what: str, gpu: bool = False) -> Buffer:
    """The kernel parameter for an argument of ``shape`` bound to ``buf`` (``binds=``).

    Its shape is the tensor's (``buf``'s free extents unified with it) and its elem_offset 0
    (the array comes by its own data pointer; a nonzero constant is refused). ``buf``'s
    strides are kept, their free vars becoming kernel dims the runtime binds from the array's
    strides; strides that work out to the compact ones are dropped, so the parameter is an
    ordinary C-contiguous one. The data Var is kept (extern bodies name ``buf.data``).
    ``gpu``: a cuda kernel, which takes compact arrays only (LoweringError otherwise)."""
    vmap = layout_vars(buf, shape, what, strides=None)
    strides: tuple[Expr, ...] = ()
    if buf.strides:
        strides = tuple(simplify(substitute(s, vmap) if vmap else s) for s in buf.strides)
        for k, s in enumerate(strides):
            if not dt.is_int(s.dtype) or dt.lanes(s.dtype) != 1:
                raise TecompError(f"{what}: stride {k} of buffer {buf.name} must be an integer "
                                  f"expression, got {s} ({s.dtype})")
            if isinstance(s, IntImm) and s.value < 0:
                raise TecompError(f"{what}: stride {k} of buffer {buf.name} is {s.value}; "
                                  "negative strides are not supported")
        compact = [simplify(c) for c in _compact(shape)]
        if all(str(a) == str(b) for a, b in zip(strides, compact)):
            strides = ()
    if strides and gpu:
        # the cuda launch path (runtime/gpu_module.py, cuda.py) passes no strides
        raise LoweringError(
            f"{what}: buffer {buf.name} has strides [{', '.join(map(str, buf.strides))}]; "
            "strided (non-contiguous) arguments are supported on CPU targets only, a cuda "
            "kernel takes C-contiguous arrays")
    return Buffer(buf.name, tuple(shape), buf.dtype, data=buf.data, strides=strides,
                  align=buf.align)


class ExternOp(Operation):
    """An operation whose body is a statement over declared buffers (TVM's ExternOp)."""

    def __init__(self, name: str, tag: str, attrs: dict[str, Any] | None, inputs: list[Tensor],
                 input_placeholders: list[Buffer], output_placeholders: list[Buffer],
                 body: Stmt) -> None:
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.inputs = inputs
        self.input_placeholders = input_placeholders
        self.output_placeholders = output_placeholders
        self.body = body
        self.outputs = [Tensor(tuple(b.shape), b.dtype, self, k)
                        for k, b in enumerate(output_placeholders)]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def input_tensors(self) -> list[Tensor]:
        return list(self.inputs)


def _as_stmt(res: Any, name: str) -> Stmt:
    if isinstance(res, Stmt):
        return res
    if isinstance(res, Expr):
        return Evaluate(res)
    if isinstance(res, (list, tuple)) and res:
        return seq(*[_as_stmt(r, name) for r in res])
    raise TecompError(f"extern {name}: fcompute returned {type(res).__name__}; it must return a "
                      "statement or an expression such as te.call_extern(...)")


def extern(
    shape: Any,
    inputs: Sequence[Tensor],
    fcompute: Callable[[list[Buffer], list[Buffer]], Any],
    name: str = "extern",
    dtype: str | Sequence[str] | None = None,
    in_buffers: Sequence[Buffer] | Buffer | None = None,
    out_buffers: Sequence[Buffer] | Buffer | None = None,
    tag: str = "",
    attrs: dict[str, Any] | None = None,
) -> Any:
    """Tensors computed by external code (TVM's ``te.extern``).

    ``shape`` is one output's shape or a list of shapes; ``fcompute(ins, outs)`` gets the
    input and output buffers and returns the body, e.g. ``te.call_extern("int32", "f",
    ins[0].data, outs[0].data, n)``. ``dtype`` defaults to the first input's.
    """
    shapes: list[Any]
    if isinstance(shape, (tuple, list)) and shape and all(isinstance(s, (tuple, list)) for s in shape):
        shapes = list(shape)
    else:
        shapes = [shape]
    inputs = list(inputs)
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TecompError(f"extern {name}: input {k} must be a te.Tensor, got "
                              f"{type(t).__name__}")
    if dtype is None:
        if not inputs:
            raise TecompError(f"extern {name}: give dtype= (there is no input to take it from)")
        dtypes = [inputs[0].dtype] * len(shapes)
    elif isinstance(dtype, str):
        dtypes = [dt.canonical(dtype)] * len(shapes)
    else:
        dtypes = [dt.canonical(d) for d in dtype]
        if len(dtypes) != len(shapes):
            raise TecompError(f"extern {name}: {len(dtypes)} dtypes for {len(shapes)} outputs")
    ins = _buffers(in_buffers, len(inputs), "in_buffers", name)
    if ins is None:
        ins = [decl_buffer(t.shape, t.dtype, t.op.name) for t in inputs]
    for k, (b, t) in enumerate(zip(ins, inputs)):
        if b.dtype != t.dtype:
            raise TecompError(f"extern {name}: in_buffers[{k}] ({b.name}) is {b.dtype}, input "
                              f"{t.name} is {t.dtype}")
        # strides are checked at lowering, against the storage the input ends up in
        layout_vars(b, t.shape, f"extern {name}: in_buffers[{k}]", strides=None)
    outs = _buffers(out_buffers, len(shapes), "out_buffers", name)
    if outs is None:
        outs = [decl_buffer(s, d, name if len(shapes) == 1 else f"{name}_v{k}")
                for k, (s, d) in enumerate(zip(shapes, dtypes))]
    else:
        for k, (b, s, d) in enumerate(zip(outs, shapes, dtypes)):
            want = tuple(_dim(x, name, j) for j, x in enumerate(s if isinstance(s, (tuple, list)) else (s,)))
            if b.dtype != d:
                raise TecompError(f"extern {name}: out_buffers[{k}] ({b.name}) is {b.dtype}, "
                                  f"the output is {d}")
            layout_vars(b, want, f"extern {name}: out_buffers[{k}]", strides=None)
    body = _as_stmt(fcompute(ins, outs), name)
    op = ExternOp(name, tag, attrs, inputs, list(ins), list(outs), body)
    return op.outputs[0] if len(op.outputs) == 1 else op.outputs


def _buffers(given: Any, n: int, what: str, name: str) -> list[Buffer] | None:
    if given is None:
        return None
    items = [given] if isinstance(given, Buffer) else list(given)
    if len(items) != n:
        raise TecompError(f"extern {name}: {len(items)} {what} for {n} tensors")
    for k, b in enumerate(items):
        if not isinstance(b, Buffer):
            raise TecompError(f"extern {name}: {what}[{k}] must be a buffer from "
                              f"tc.tir.decl_buffer, got {type(b).__name__}")
    return items


class _Rebind(StmtMutator):
    """The extern body with its declared buffers replaced by the real ones: loads/stores go
    to the real buffer, ``decl.data`` becomes the address of its first element (an address,
    not the data Var, so that it survives the passes that rebuild local buffers)."""

    def __init__(self, bufs: dict[Buffer, Buffer], vmap: dict[Var, Expr]) -> None:
        self.bufs = bufs
        self.data = {b.data: r for b, r in bufs.items()}
        self.vmap = vmap

    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        real = self.data.get(e)
        if real is not None:
            return Call("handle", "address_of", (BufferLoad(real, (const(0),)),))
        return self.vmap.get(e, e)

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        # one index on an N-d buffer is a flat offset (access_ptr), as flatten reads it
        return BufferLoad(self.bufs.get(e.buffer, e.buffer), idx, e.dtype)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        real = self.bufs.get(s.buffer, s.buffer)
        return BufferStore(real, self.visit(s.value), tuple(self.visit(i) for i in s.indices))


def bind_extern_body(op: ExternOp, real_inputs: list[Buffer], real_outputs: list[Buffer]) -> Stmt:
    """``op``'s body over the buffers that hold its inputs and outputs."""
    bufs: dict[Buffer, Buffer] = {}
    vmap: dict[Var, Expr] = {}
    pairs = list(zip(op.input_placeholders, op.inputs, real_inputs)) + [
        (b, t, r) for b, t, r in zip(op.output_placeholders, op.outputs, real_outputs)]
    for decl, t, real in pairs:
        # a strided argument's storage: the declaration's strides take (or must equal) its own
        vmap.update(layout_vars(decl, t.shape, f"extern {op.name}", strides=real.strides))
        bufs[decl] = real
    return _Rebind(bufs, vmap).visit_stmt(op.body)  # type: ignore[no-any-return]


__all__ = ["ExternOp", "PY_EXTERNS", "arg_layout", "bind_extern_body",
           "decl_buffer", "extern", "layout_vars", "register_extern"]
