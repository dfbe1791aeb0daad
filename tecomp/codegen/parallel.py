"""PARALLEL loops: outline the body and run it on libgomp's thread team.

``for i in parallel(min, extent): body`` becomes, in the kernel,

    closure = {err, buffer pointers (+ extents in debug builds), captured vars, min, extent}
    GOMP_parallel(thunk, &closure, 0 /* all threads */, 0)

and two internal functions:

* ``thunk(ptr closure)`` runs on every thread: it takes a static contiguous chunk of the
  iteration space from ``omp_get_thread_num()/omp_get_num_threads()`` and calls
* ``worker(ptr noalias A, ..., vars..., i64 lo, i64 hi)``, the body as an ordinary loop.

The worker receives the buffers as ``noalias`` parameters and is always inlined into the thunk,
so LLVM turns that promise into alias scopes: pointers reloaded from a closure would otherwise
lose the kernel's noalias facts and block vectorisation. Errors (allocation failure, debug
out-of-bounds) are written to the kernel's error slot through the closure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.functor import StmtVisitor
from .llvm_common import I32, I64, PTR, VOID, cast, declare, opaque
from .memory import BufBinding

if TYPE_CHECKING:
    from .llvm_cpu import CodegenCPU


class _Uses(StmtVisitor):
    """Vars and buffer data vars a statement refers to, in first-use order (deterministic IR)."""

    def __init__(self) -> None:
        self.vars: dict[E.Var, None] = {}
        self.bufs: dict[E.Var, None] = {}

    def visit_Var(self, e: E.Var) -> None:
        self.vars[e] = None

    def visit_BufferLoad(self, e: E.BufferLoad) -> None:
        self.bufs[e.buffer.data] = None
        super().visit_BufferLoad(e)

    def visit_BufferStore(self, s: S.BufferStore) -> None:
        self.bufs[s.buffer.data] = None
        super().visit_BufferStore(s)

    def visit_Allocate(self, s: S.Allocate) -> None:
        for x in (*s.buffer.shape, *s.buffer.strides):  # dynamic sizes use outer vars
            self.visit(x)
        super().visit_Allocate(s)


def emit_parallel_for(cg: CodegenCPU, loop: S.For) -> None:
    """Generate ``loop`` (kind PARALLEL) as a GOMP_parallel call at the builder's position."""
    cg.uses_openmp = True
    outer = cg.st
    uses = _Uses()
    uses.visit_stmt(loop.body)
    vars_ = [v for v in uses.vars if v in outer.vars and v is not loop.var]
    bufs = [(d, outer.bufs[d]) for d in uses.bufs if d in outer.bufs]
    bufs += [(v, outer.bufs[v]) for v in uses.vars if v in outer.bufs and v not in uses.bufs]
    debug = cg.debug

    # closure layout: err, buffer ptrs, [buffer extents], vars, begin, extent
    field_types: list[ir.Type] = [PTR] + [PTR] * len(bufs)
    if debug:
        field_types += [I64] * len(bufs)
    field_types += [outer.vars[v].type for v in vars_] + [I64, I64]
    closure_ty = ir.LiteralStructType(field_types)

    worker = _emit_worker(cg, loop, vars_, bufs)
    thunk = _emit_thunk(cg, closure_ty, worker, n_bufs=len(bufs), n_vars=len(vars_))

    b = cg.b
    begin = cast(b, cg.expr(loop.min), loop.min.dtype, "int64")
    extent = cast(b, cg.expr(loop.extent), loop.extent.dtype, "int64")
    closure = opaque(outer.entry.alloca(closure_ty, name="closure"))
    values: list[ir.Value] = [outer.err] + [bb.ptr for _, bb in bufs]
    if debug:
        values += [bb.size for _, bb in bufs]  # type: ignore[misc]
    values += [outer.vars[v] for v in vars_] + [begin, extent]
    for k, v in enumerate(values):
        b.store(v, b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)],
                         source_etype=closure_ty))
    gomp = declare(cg.module, "GOMP_parallel", ir.FunctionType(VOID, [PTR, PTR, I32, I32]))
    # num_threads=0: the OpenMP default (OMP_NUM_THREADS or every core); flags=0.
    b.call(gomp, [thunk, closure, ir.Constant(I32, 0), ir.Constant(I32, 0)])


def _emit_worker(cg: CodegenCPU, loop: S.For, vars_: list[E.Var],
                 bufs: list[tuple[E.Var, BufBinding]]) -> ir.Function:
    outer = cg.st
    debug = cg.debug
    arg_types: list[ir.Type] = [PTR] + [PTR] * len(bufs)
    if debug:
        arg_types += [I64] * len(bufs)
    arg_types += [outer.vars[v].type for v in vars_] + [I64, I64]
    fn = cg.new_internal_function("par", ir.FunctionType(VOID, arg_types))
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    args = list(fn.args)
    err = args.pop(0)
    ptrs = [args.pop(0) for _ in bufs]
    sizes = [args.pop(0) for _ in bufs] if debug else [None] * len(bufs)
    for p, (_, bb) in zip(ptrs, bufs, strict=True):
        p.name = bb.name
        p.add_attribute("noalias")
    st = cg.begin_function(fn, err=err, in_parallel=True)
    for (d, bb), p, sz in zip(bufs, ptrs, sizes, strict=True):
        st.bufs[d] = BufBinding(bb.name, p, sz, bb.id, bb.dtype)
    for v in vars_:
        a = args.pop(0)
        a.name = v.name
        st.vars[v] = a
    lo, hi = args
    lo_v = cast(st.builder, lo, "int64", loop.var.dtype)
    hi_v = cast(st.builder, hi, "int64", loop.var.dtype)
    cg.serial_loop(loop.var, lo_v, hi_v, lambda: cg.stmt(loop.body))
    cg.b.ret_void()
    cg.end_function()
    return fn


def _emit_thunk(cg: CodegenCPU, closure_ty: ir.LiteralStructType, worker: ir.Function,
                n_bufs: int, n_vars: int) -> ir.Function:
    fn = cg.new_internal_function("par_thunk", ir.FunctionType(VOID, [PTR]))
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    closure = fn.args[0]
    fields = [b.load(b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)],
                           source_etype=closure_ty), typ=t)
              for k, t in enumerate(closure_ty.elements)]
    begin, extent = fields[-2], fields[-1]
    i32_fn = ir.FunctionType(I32, [])
    tid = b.sext(b.call(declare(cg.module, "omp_get_thread_num", i32_fn), []), I64)
    nth = b.sext(b.call(declare(cg.module, "omp_get_num_threads", i32_fn), []), I64)
    # Static schedule: thread t runs [begin + t*chunk, min(begin + (t+1)*chunk, end)).
    chunk = b.sdiv(b.add(extent, b.sub(nth, ir.Constant(I64, 1))), nth)
    lo = b.add(begin, b.mul(tid, chunk))
    end = b.add(begin, extent)
    hi = b.add(lo, chunk)
    hi = b.select(b.icmp_signed("<", hi, end), hi, end)
    with b.if_then(b.icmp_signed("<", lo, hi)):
        b.call(worker, fields[:-2] + [lo, hi])
    b.ret_void()
    return fn


__all__ = ["emit_parallel_for"]
