"""The LLVM code generator shared by the CPU (`llvm_cpu`) and NVIDIA GPU (`llvm_nvptx`) backends.

`CodegenLLVM` turns statements and expressions of a lowered `PrimFunc` into llvmlite IR:
arithmetic (with the integer division/modulo semantics of tecomp/runtime/interp.py), casts,
compares, short-circuit logic and lazy selects, loads and stores (through `memory.MemoryMixin`,
including vector Ramp accesses and predicates), lets, serial/unrolled loops and ifs.

What differs between targets is left to a subclass through these hooks:

* `add_function`: the calling convention and kernel signature (CPU: a C-ABI function returning
  an int32 `ErrorCode`; GPU: a ``ptx_kernel`` returning void);
* `data_layout`: the layout string of the target's TargetMachine;
* `parallel_for` / `thread_binding_for`: PARALLEL loops (CPU: libgomp) and THREAD_BINDING loops
  (GPU: hardware indices); each backend rejects the kind it does not have;
* `_allocate`: where an `Allocate` lives (CPU: stack or heap; GPU: shared or local memory);
* `math_call`: math functions (CPU: vecmath and libm; GPU: libdevice);
* `target_call`: calls only a target knows (GPU: the barrier);
* `extern_call`: calls to external symbols;
* `new_error_slot` / `report_error`: where a runtime error code (division by zero) goes.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llvmlite import ir

from ..errors import CodegenError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from .llvm_common import (
    I1,
    I32,
    MATH_NAMES,
    VOID,
    call_intrinsic,
    cast,
    concat_vectors,
    const,
    declare,
    llvm_type,
    opaque,
    set_half_conversions,
    shuffle_mask,
    splat,
)
from .memory import BufBinding, MemoryMixin
from .target import Target

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Pure intrinsics beyond llvm_common.MATH_NAMES; each backend's `math_call` emits them.
EXTRA_MATH = frozenset({"nextafter", "ldexp"})


class ErrorCode(enum.IntEnum):
    """What a kernel reports; the runtime turns nonzero codes into exceptions."""

    OK = 0
    OUT_OF_BOUNDS = 1  # debug build: details in the module's out-of-bounds record
    ALLOC_FAILED = 2  # a heap-allocated local buffer could not be allocated
    DIV_BY_ZERO = 3  # an integer division or modulo by a zero divisor (data, not a constant)


@dataclass
class FnState:
    """Everything that belongs to the LLVM function being generated (swapped when outlining)."""

    fn: ir.Function
    builder: ir.IRBuilder
    entry: ir.IRBuilder  # positioned in the entry block, for allocas
    err: ir.Value  # ptr to the i32 error slot
    in_parallel: bool
    vars: dict[E.Var, ir.Value] = field(default_factory=dict)
    bufs: dict[E.Var, BufBinding] = field(default_factory=dict)
    prev: FnState | None = None  # the function being generated around this one (outlining)


class CodegenLLVM(MemoryMixin):
    """Target-independent half of the LLVM code generators (see the module docstring)."""

    backend_name: ClassVar[str] = "LLVM"  # in error messages: "the CPU backend cannot ..."

    def __init__(self, target: Target, debug: bool = False, module_name: str = "tecomp") -> None:
        self.target = target
        self.debug = debug
        self.module = ir.Module(name=module_name)
        self.module.triple = target.triple
        self.module.data_layout = self.data_layout()
        set_half_conversions(self.module, *target.half_conversions)
        self.debug_buffers: list[str] = []
        self.oob_record_name = "__tecomp_oob_" + re.sub(r"\W", "_", module_name)
        self._st: FnState | None = None
        self._mask: ir.Value | None = None  # active lanes while evaluating a vector Select side
        self._branchy: dict[E.Expr, bool] = {}
        self._unroll_md: ir.MDValue | None = None
        self._n_outlined = 0
        self._expr_fns: dict[type, Callable[[Any], ir.Value]] = {
            E.IntImm: self._imm, E.FloatImm: self._imm, E.StringImm: self._string,
            E.Var: self._var, E.Cast: self._cast, E.Not: self._not, E.Select: self._select,
            E.And: self._logic, E.Or: self._logic, E.Call: self._call, E.Let: self._let,
            E.Ramp: self._ramp, E.Broadcast: self._broadcast,
            E.VectorReduce: self._vector_reduce, E.BufferLoad: self.emit_load,
            E.Shuffle: self._shuffle,
        }
        for op in (E.Add, E.Sub, E.Mul, E.Div, E.FloorDiv, E.FloorMod, E.Min, E.Max):
            self._expr_fns[op] = self._arith
        for cmp in (E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE):
            self._expr_fns[cmp] = self._compare
        self._stmt_fns: dict[type, Callable[[Any], None]] = {
            S.For: self._for, S.SeqStmt: self._seq, S.IfThenElse: self._if,
            S.LetStmt: self._let_stmt, S.Allocate: self._allocate, S.BufferStore: self.emit_store,
            S.Evaluate: self._evaluate, S.AttrStmt: self._attr,
        }

    # hooks ----------------------------------------------------------------------------------
    def data_layout(self) -> str:
        """The data layout string of ``self.target``'s TargetMachine."""
        raise NotImplementedError

    def add_function(self, func: S.PrimFunc) -> ir.Function:
        """Generate ``func`` as a kernel of the module."""
        raise NotImplementedError

    def new_error_slot(self, entry: ir.IRBuilder) -> ir.Value:
        """A pointer to the i32 error slot of a new kernel (``entry``: its entry block)."""
        raise NotImplementedError

    def report_error(self, code: ErrorCode) -> None:
        """Record ``code`` in the error slot; atomic because threads may report at once."""
        self.b.atomic_rmw("xchg", self.st.err, ir.Constant(I32, code), "monotonic")

    def parallel_for(self, s: S.For) -> bool:
        """Emit a PARALLEL loop; False lets the caller emit it as a serial loop."""
        raise CodegenError(f"the {self.backend_name} backend cannot run loop '{s.var.name}' "
                           "in parallel")

    def thread_binding_for(self, s: S.For) -> None:
        """Emit a THREAD_BINDING loop (its variable is a hardware thread/block index)."""
        raise CodegenError(
            f"loop '{s.var.name}' is bound to {S.thread_tag(s)}, but the {self.backend_name} "
            "backend has no GPU threads; build for a 'cuda' target"
        )

    def _allocate(self, s: S.Allocate) -> None:
        raise NotImplementedError

    def math_call(self, name: str, args: list[ir.Value], dtypes: list[str],
                  ret_dtype: str) -> ir.Value:
        """Emit the pure math/bit function ``name`` on evaluated operands."""
        raise NotImplementedError

    def target_call(self, e: E.Call) -> ir.Value | None:
        """A non-extern call only this target knows (None: not one of those)."""
        return None

    def extern_call(self, e: E.Call) -> ir.Value:
        """A call to the external symbol ``e.name`` (declared from the operand types)."""
        args, types = [], []
        for a in e.args:
            v = self.expr(a)
            args.append(v)
            types.append(v.type)
        void = e.dtype in ("void", "")
        ret = VOID if void else llvm_type(e.dtype)
        fn = declare(self.module, e.name, ir.FunctionType(ret, types))
        r = self.b.call(fn, args)
        return ir.Constant(I32, 0) if void else r

    # function frame -------------------------------------------------------------------------
    @property
    def st(self) -> FnState:
        assert self._st is not None, "no function is being generated"
        return self._st

    @property
    def b(self) -> ir.IRBuilder:
        return self.st.builder

    def check_kernel(self, func: S.PrimFunc) -> None:
        """Reject names that are no C/PTX identifier or are taken, and non-Buffer params."""
        if not IDENT.match(func.name):
            raise CodegenError(f"kernel name {func.name!r} is not a valid C identifier")
        if func.name in self.module.globals:
            raise CodegenError(f"two kernels named {func.name!r} in one module")
        for i, buf in enumerate(func.params):
            if not isinstance(buf, Buffer):
                raise CodegenError(f"parameter {i} of {func.name} is not a Buffer: {buf!r}")

    def name_params(self, func: S.PrimFunc, fn: ir.Function) -> None:
        """Name the buffer arguments; mark them noalias unless ``attrs["noalias"]`` is False.

        Buffers never overlap (the runtime rejects outputs that overlap another argument),
        and saying so lets LLVM vectorise and hoist without runtime alias checks.
        """
        noalias = func.attrs.get("noalias", True)
        for arg, buf in zip(fn.args, func.params, strict=False):
            arg.name = buf.name
            if noalias:
                arg.add_attribute("noalias")

    def bind_params(self, func: S.PrimFunc, fn: ir.Function) -> None:
        """Bind buffers to the leading arguments, ``dim_vars`` to the i64 ones after them and
        scalar parameters (`c_scalar_params`) to the trailing ones, each of its own type."""
        st = self.st
        nb, nd = len(func.params), len(func.dim_vars)
        for v, arg in zip(func.dim_vars, fn.args[nb:nb + nd], strict=True):
            arg.name = v.name
            st.vars[v] = arg if v.dtype == "int64" else cast(st.builder, arg, "int64", v.dtype)
        for v, arg in zip(c_scalar_params(func), fn.args[nb + nd:], strict=True):
            arg.name = v.name
            st.vars[v] = arg
        for arg, buf in zip(fn.args, func.params, strict=False):
            size = self.buffer_extent(buf) if self.debug else None
            self.bind_buffer(buf, arg, size)

    def begin_function(self, fn: ir.Function, err: ir.Value | None, in_parallel: bool) -> FnState:
        """Start generating ``fn``: an entry block for allocas, then the body block.

        ``err`` is the error slot pointer; None makes a fresh one (`new_error_slot`).
        Returns the new state; the previous one is restored by `end_function`.
        """
        entry_bb = fn.append_basic_block("entry")
        body_bb = fn.append_basic_block("body")
        entry = ir.IRBuilder(entry_bb)
        if err is None:
            err = self.new_error_slot(entry)
        st = FnState(fn, ir.IRBuilder(body_bb), entry, err, in_parallel, prev=self._st)
        self._st = st
        return st

    def end_function(self) -> None:
        st = self.st
        st.entry.branch(st.fn.basic_blocks[1])
        self._st = st.prev

    def bind_var(self, var: E.Var, value: ir.Value) -> ir.Value | None:
        """Bind ``var`` for the scope being generated; returns what it shadows."""
        prev = self.st.vars.get(var)
        self.st.vars[var] = value
        return prev

    def unbind_var(self, var: E.Var, prev: ir.Value | None) -> None:
        if prev is None:
            del self.st.vars[var]
        else:
            self.st.vars[var] = prev

    def new_internal_function(self, suffix: str, fnty: ir.FunctionType) -> ir.Function:
        # "__" names are reserved in C, so they cannot clash with a kernel's name.
        self._n_outlined += 1
        fn = ir.Function(self.module, fnty, f"__{self.st.fn.name}_{suffix}{self._n_outlined}")
        fn.linkage = "internal"
        return fn

    # statements -----------------------------------------------------------------------------
    def stmt(self, s: S.Stmt) -> None:
        fn = self._stmt_fns.get(type(s))
        if fn is None:
            raise CodegenError(
                f"the {self.backend_name} backend cannot generate statement {type(s).__name__}")
        fn(s)

    def _seq(self, s: S.SeqStmt) -> None:
        for x in s.seq:
            self.stmt(x)

    def _attr(self, s: S.AttrStmt) -> None:
        self.stmt(s.body)

    def _evaluate(self, s: S.Evaluate) -> None:
        self.expr(s.value)

    def _let_stmt(self, s: S.LetStmt) -> None:
        prev = self.bind_var(s.var, self.expr(s.value))
        self.stmt(s.body)
        self.unbind_var(s.var, prev)

    def _if(self, s: S.IfThenElse) -> None:
        if dt.lanes(s.cond.dtype) != 1:
            raise CodegenError(f"IfThenElse needs a scalar condition, got {s.cond.dtype}: {s.cond}")
        cond = self.as_i1(s.cond)
        if s.else_case is None:
            with self.b.if_then(cond):
                self.stmt(s.then_case)
            return
        with self.b.if_else(cond) as (then, otherwise):
            with then:
                self.stmt(s.then_case)
            with otherwise:
                self.stmt(s.else_case)

    def _for(self, s: S.For) -> None:
        if s.kind is S.ForKind.THREAD_BINDING:
            self.thread_binding_for(s)
            return
        if s.kind is S.ForKind.PARALLEL and self.parallel_for(s):
            return
        # VECTORIZED loops should have been rewritten by the vectorize pass; a PARALLEL loop
        # the backend declined (e.g. nested in a parallel body) runs serially.
        lo = cast(self.b, self.expr(s.min), s.min.dtype, s.var.dtype)
        ext = cast(self.b, self.expr(s.extent), s.extent.dtype, s.var.dtype)
        hi = self.b.add(lo, ext, flags=("nsw",))
        self.serial_loop(s.var, lo, hi, lambda: self.stmt(s.body),
                         unroll=s.kind is S.ForKind.UNROLLED)

    def serial_loop(self, var: E.Var, lo: ir.Value, hi: ir.Value, body: Callable[[], None],
                    unroll: bool = False) -> None:
        """``for var in [lo, hi)`` with ``var`` bound to the induction variable in ``body``."""
        b = self.b
        pre = b.block
        head = b.append_basic_block("for.head")
        loop = b.append_basic_block("for.body")
        done = b.append_basic_block("for.end")
        b.branch(head)
        b.position_at_end(head)
        iv = b.phi(lo.type, name=var.name)
        iv.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", iv, hi), loop, done)
        b.position_at_end(loop)
        prev = self.bind_var(var, iv)
        body()
        self.unbind_var(var, prev)
        b = self.b
        nxt = b.add(iv, ir.Constant(iv.type, 1), flags=("nsw",))
        latch = b.branch(head)
        if unroll:
            latch.set_metadata("llvm.loop", self._unroll_metadata())
        iv.add_incoming(nxt, b.block)
        b.position_at_end(done)

    def _unroll_metadata(self) -> ir.MDValue:
        if self._unroll_md is None:
            full = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.unroll.full")])
            md = self.module.add_metadata([full, full])
            md.operands = (md, full)  # a loop ID must name itself first
            self._unroll_md = md
        return self._unroll_md

    # expressions ----------------------------------------------------------------------------
    def expr(self, e: E.Expr) -> ir.Value:
        fn = self._expr_fns.get(type(e))
        if fn is None:
            raise CodegenError(
                f"the {self.backend_name} backend cannot generate {type(e).__name__} ({e}); "
                "te-level nodes must be lowered first"
            )
        return fn(e)

    def as_i1(self, e: E.Expr) -> ir.Value:
        v = self.expr(e)
        if dt.is_bool(e.dtype):
            return v
        return cast(self.b, v, e.dtype, dt.with_lanes("bool", dt.lanes(e.dtype)))

    def _imm(self, e: E.IntImm | E.FloatImm) -> ir.Value:
        return const(e.dtype, e.value)

    def _string(self, e: E.StringImm) -> ir.Value:
        data = bytearray(e.value.encode()) + b"\0"
        ty = ir.ArrayType(ir.IntType(8), len(data))
        g = opaque(ir.GlobalVariable(self.module, ty, self.module.get_unique_name(".str")))
        g.linkage, g.global_constant, g.initializer = "private", True, ir.Constant(ty, data)
        return g

    def _var(self, e: E.Var) -> ir.Value:
        v = self.st.vars.get(e)
        if v is not None:
            return v
        buf = self.st.bufs.get(e)
        if buf is not None:  # a buffer's data pointer, e.g. passed to an extern function
            return buf.ptr
        raise CodegenError(f"variable '{e.name}' is used but not defined in this kernel")

    def _let(self, e: E.Let) -> ir.Value:
        prev = self.bind_var(e.var, self.expr(e.value))
        v = self.expr(e.body)
        self.unbind_var(e.var, prev)
        return v

    def _operands(self, e: E.BinaryOp | E.CmpOp) -> tuple[ir.Value, ir.Value]:
        a, b = self.expr(e.a), self.expr(e.b)
        la, lb = dt.lanes(e.a.dtype), dt.lanes(e.b.dtype)
        if la != lb:  # tolerate a scalar operand of a vector op
            a = splat(self.b, a, lb) if la == 1 else a
            b = splat(self.b, b, la) if lb == 1 else b
        return a, b

    def _arith(self, e: E.BinaryOp) -> ir.Value:
        a, b = self._operands(e)
        d, bld, k = e.dtype, self.b, type(e)
        if dt.is_float(d):
            # `contract` lets LLVM fuse a*b+c into FMA; nothing else is relaxed.
            fl = ("contract",)
            if k is E.Add:
                return bld.fadd(a, b, flags=fl)
            if k is E.Sub:
                return bld.fsub(a, b, flags=fl)
            if k is E.Mul:
                return bld.fmul(a, b, flags=fl)
            if k is E.Div:
                return bld.fdiv(a, b, flags=fl)
            if k is E.Min:
                return bld.select(bld.fcmp_ordered("<", a, b), a, b)
            if k is E.Max:
                return bld.select(bld.fcmp_ordered(">", a, b), a, b)
            q = self.math_call("floor", [bld.fdiv(a, b)], [d], d)
            return q if k is E.FloorDiv else bld.fsub(a, bld.fmul(q, b, flags=fl), flags=fl)
        if dt.is_bool(d):
            if k in (E.Min, E.Mul):
                return bld.and_(a, b)
            if k is E.Max:
                return bld.or_(a, b)
            raise CodegenError(f"{k.__name__} is not defined on bool: {e}")
        signed = not dt.is_uint(d)
        # Index arithmetic is int32/int64; promising no signed wrap lets LLVM widen induction
        # variables. Narrow ints are data and keep numpy's wrap-around.
        nsw = ("nsw",) if signed and dt.bits(d) >= 32 else ()
        if k is E.Add:
            return bld.add(a, b, flags=nsw)
        if k is E.Sub:
            return bld.sub(a, b, flags=nsw)
        if k is E.Mul:
            return bld.mul(a, b, flags=nsw)
        if k is E.Min or k is E.Max:
            op = "<" if k is E.Min else ">"
            c = bld.icmp_signed(op, a, b) if signed else bld.icmp_unsigned(op, a, b)
            return bld.select(c, a, b)
        return self._int_division(k, a, b, e, signed)

    def _int_division(self, k: type, a: ir.Value, b: ir.Value, e: E.BinaryOp,
                      signed: bool) -> ir.Value:
        bld, d = self.b, e.dtype
        c = const_int(e.b)
        if c == 0:
            raise CodegenError(f"integer division by zero in {e}")
        if c is None and self._mask is not None and lanes_of(self._mask) == dt.lanes(d):
            # Masked-off lanes of a vector Select side may hold a zero divisor: x86 traps.
            b = bld.select(self._mask, b, const(d, 1))
        if c is None:
            b = self._checked_divisor(a, b, d, signed)
        if not signed:
            return bld.udiv(a, b) if k in (E.Div, E.FloorDiv) else bld.urem(a, b)
        if k is E.Div:
            return bld.sdiv(a, b)
        if c is not None and c > 0:
            # Positive constant divisor (the common index case): shifts/masks for powers of
            # two, otherwise truncating division corrected by one when the remainder < 0.
            if c & (c - 1) == 0:
                sh = c.bit_length() - 1
                return bld.ashr(a, const(d, sh)) if k is E.FloorDiv else bld.and_(a, const(d, c - 1))
            r = bld.srem(a, b)
            neg = bld.icmp_signed("<", r, const(d, 0))
            if k is E.FloorDiv:
                return bld.add(bld.sdiv(a, b), bld.sext(neg, a.type))
            return bld.select(neg, bld.add(r, b), r)
        r = bld.srem(a, b)
        # Round toward -inf when the remainder is nonzero and its sign differs from b's.
        adj = bld.and_(bld.icmp_signed("!=", r, const(d, 0)),
                       bld.icmp_signed("<", bld.xor(r, b), const(d, 0)))
        if k is E.FloorDiv:
            return bld.add(bld.sdiv(a, b), bld.sext(adj, a.type))
        return bld.select(adj, bld.add(r, b), r)

    def _checked_divisor(self, a: ir.Value, b: ir.Value, d: str, signed: bool) -> ir.Value:
        # x86 traps on a zero divisor and on INT_MIN / -1, killing the whole process (a GPU
        # gives garbage). Report a zero divisor through the error slot (ZeroDivisionError) and
        # divide by 1 instead; INT_MIN / 1 is also the wrapped result of INT_MIN / -1.
        bld = self.b
        zero = bld.icmp_unsigned("==", b, const(d, 0))
        fix = zero
        if signed:
            lo = -(1 << (dt.bits(d) - 1))
            fix = bld.or_(zero, bld.and_(bld.icmp_signed("==", a, const(d, lo)),
                                         bld.icmp_signed("==", b, const(d, -1))))
        n = lanes_of(zero)
        any_zero = zero if n == 1 else bld.icmp_unsigned(
            "!=", bld.bitcast(zero, ir.IntType(n)), ir.Constant(ir.IntType(n), 0))
        with bld.if_then(any_zero, likely=False):
            self.report_error(ErrorCode.DIV_BY_ZERO)
        return bld.select(fix, const(d, 1), b)

    def _compare(self, e: E.CmpOp) -> ir.Value:
        a, b = self._operands(e)
        op = {E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">="}[type(e)]
        d = e.a.dtype
        if dt.is_float(d):
            # Ordered comparisons are false on NaN, != is true on NaN (as in C and numpy).
            return self.b.fcmp_unordered(op, a, b) if op == "!=" else self.b.fcmp_ordered(op, a, b)
        if dt.is_uint(d) or dt.is_bool(d):
            return self.b.icmp_unsigned(op, a, b)
        return self.b.icmp_signed(op, a, b)

    def _not(self, e: E.Not) -> ir.Value:
        return self.b.not_(self.as_i1(e.a))

    def _logic(self, e: E.And | E.Or) -> ir.Value:
        is_and = isinstance(e, E.And)
        a = self.as_i1(e.a)
        if not self.is_branchy(e.b):
            b = self.as_i1(e.b)
            return self.b.and_(a, b) if is_and else self.b.or_(a, b)
        # Short-circuit: `i < n && A[i] > 0` must not read A[i] when i >= n.
        if dt.lanes(e.dtype) > 1:
            b = self.with_mask(a if is_and else self.b.not_(a), lambda: self.as_i1(e.b))
            return self.b.and_(a, b) if is_and else self.b.or_(a, b)
        go = a if is_and else self.b.not_(a)
        return self.if_value(go, lambda: self.as_i1(e.b), lambda: ir.Constant(I1, not is_and))

    def _select(self, e: E.Select) -> ir.Value:
        b = self.b
        if dt.lanes(e.cond.dtype) == 1:
            c = self.as_i1(e.cond)
            if self.is_branchy(e.t) or self.is_branchy(e.f):
                return self.if_value(c, lambda: self.expr(e.t), lambda: self.expr(e.f))
            return b.select(c, self.expr(e.t), self.expr(e.f))
        c = self.as_i1(e.cond)
        # Both sides are computed for a vector select; loads inside each are masked to the
        # lanes that side is chosen for, so the unused side never touches memory.
        t = self.with_mask(c, lambda: self.expr(e.t)) if self.is_branchy(e.t) else self.expr(e.t)
        f = (self.with_mask(self.b.not_(c), lambda: self.expr(e.f))
             if self.is_branchy(e.f) else self.expr(e.f))
        return self.b.select(c, t, f)

    def with_mask(self, mask: ir.Value, fn: Callable[[], ir.Value]) -> ir.Value:
        """Evaluate ``fn`` with only ``mask``'s lanes active (and-ed with the enclosing mask)."""
        outer = self._mask
        if outer is not None and outer.type == mask.type:
            mask = self.b.and_(outer, mask)
        self._mask = mask
        try:
            return fn()
        finally:
            self._mask = outer

    def if_value(self, cond: ir.Value, then: Callable[[], ir.Value],
                 otherwise: Callable[[], ir.Value]) -> ir.Value:
        """``cond ? then() : otherwise()`` with branches, so only one side runs."""
        b = self.b
        with b.if_else(cond) as (t_blk, f_blk):
            with t_blk:
                tv = then()
                t_end = self.b.block
            with f_blk:
                fv = otherwise()
                f_end = self.b.block
        phi = self.b.phi(tv.type)
        phi.add_incoming(tv, t_end)
        phi.add_incoming(fv, f_end)
        return phi

    def is_branchy(self, e: E.Expr) -> bool:
        """Whether evaluating ``e`` eagerly could fault or have effects (loads, calls, x/y)."""
        hit = self._branchy.get(e)
        if hit is None:
            if isinstance(e, (E.BufferLoad, E.Call)):
                hit = True
            elif isinstance(e, (E.Div, E.FloorDiv, E.FloorMod)) and not dt.is_float(e.dtype):
                hit = const_int(e.b) is None or self.is_branchy(e.a)
            elif isinstance(e, (E.IntImm, E.FloatImm, E.Var, E.StringImm)):
                hit = False
            else:
                hit = any(self.is_branchy(c) for c in expr_children(e))
            self._branchy[e] = hit
        return hit

    def _cast(self, e: E.Cast) -> ir.Value:
        return cast(self.b, self.expr(e.value), e.value.dtype, e.dtype)

    def _ramp(self, e: E.Ramp) -> ir.Value:
        n, d = e.lanes, e.dtype
        base = splat(self.b, self.expr(e.base), n)
        s = const_int(e.stride)
        if s is not None:
            offs: ir.Value = ir.Constant(llvm_type(d), [i * s for i in range(n)])
        else:
            iota = ir.Constant(llvm_type(d), list(range(n)))
            offs = self.b.mul(splat(self.b, self.expr(e.stride), n), iota)
        return self.b.add(base, offs)

    def _broadcast(self, e: E.Broadcast) -> ir.Value:
        return splat(self.b, self.expr(e.value), e.lanes)

    def _shuffle(self, e: E.Shuffle) -> ir.Value:
        """One ``shufflevector`` for one or two inputs of a type (a transpose's steps); more
        inputs, or inputs of different widths, are laid end to end first."""
        b = self.b
        vals = [self.expr(v) for v in e.vectors]
        vals = [v if isinstance(v.type, ir.VectorType) else splat(b, v, 1) for v in vals]
        if len(vals) == 2 and vals[0].type == vals[1].type:
            return b.shuffle_vector(vals[0], vals[1], shuffle_mask(e.indices))
        cur, pos = vals[0], list(range(vals[0].type.count))  # logical lane -> lane of cur
        for v in vals[1:]:
            m = max(cur.type.count, v.type.count)

            def widen(x: ir.Value, m: int = m) -> ir.Value:
                n = x.type.count
                return x if n == m else b.shuffle_vector(x, ir.Constant(x.type, ir.Undefined),
                                                         shuffle_mask([*range(n)] + [0] * (m - n)))
            pos += [m + j for j in range(v.type.count)]
            cur = concat_vectors(b, widen(cur), widen(v))
        return b.shuffle_vector(cur, ir.Constant(cur.type, ir.Undefined), shuffle_mask(pos[i] for i in e.indices))

    def _vector_reduce(self, e: E.VectorReduce) -> ir.Value:
        v, d, b = self.expr(e.value), e.value.dtype, self.b
        if dt.lanes(d) == 1:
            return v
        if dt.is_float(d):
            if e.op in ("add", "mul"):
                # reassoc permits a tree reduction; without it LLVM must go lane by lane.
                start = const(dt.element(d), 0.0 if e.op == "add" else 1.0)
                fn = "vector.reduce.f" + e.op
                return call_intrinsic(b, fn, [start, v], ret=start.type, overloads=(v.type,),
                                      fastmath=("reassoc",))
            name = {"min": "vector.reduce.fmin", "max": "vector.reduce.fmax"}.get(e.op)
        elif dt.is_bool(d):
            name = {"add": "vector.reduce.or", "max": "vector.reduce.or",
                    "min": "vector.reduce.and", "mul": "vector.reduce.and"}.get(e.op)
        else:
            u = dt.is_uint(d)
            name = {"add": "vector.reduce.add", "mul": "vector.reduce.mul",
                    "min": "vector.reduce.umin" if u else "vector.reduce.smin",
                    "max": "vector.reduce.umax" if u else "vector.reduce.smax"}.get(e.op)
        if name is None:
            raise CodegenError(f"unknown VectorReduce op {e.op!r}; expected add, mul, min or max")
        return call_intrinsic(b, name, [v], ret=llvm_type(dt.element(d)))

    def _call(self, e: E.Call) -> ir.Value:
        if e.name == "address_of":
            return self.address_of(e)
        if e.name == "prefetch" and not e.extern:
            return self.emit_prefetch(e)
        if e.name == "debug_oob_axis" and not e.extern:
            return self.emit_axis_oob(e)
        if e.extern:
            return self.extern_call(e)
        special = self.target_call(e)
        if special is not None:
            return special
        if e.name not in MATH_NAMES and e.name not in EXTRA_MATH:
            raise CodegenError(f"unknown intrinsic {e.name!r} in {e}; use extern=True for C symbols")
        lanes = max(dt.lanes(a.dtype) for a in e.args) if e.args else 1
        args, dtypes = [], []
        for a in e.args:  # pow(x_vec, 2.0): scalar operands join the vector ones
            v = self.expr(a)
            if lanes > 1 and dt.lanes(a.dtype) == 1:
                v = splat(self.b, v, lanes)
            args.append(v)
            dtypes.append(dt.with_lanes(a.dtype, lanes))
        if e.name in ("shift_left", "shift_right") and dt.is_int(dtypes[0]):
            # The amount is taken modulo the width (tecomp/arith/intrin_eval.py): LLVM makes a
            # shift by >= bits poison, and x86 and PTX disagree on what it gives.
            args[1] = self.b.and_(args[1], const(dtypes[1], dt.bits(dtypes[1]) - 1))
        r = self.math_call(e.name, args, dtypes, e.dtype)
        if e.name == "clz" and dtypes[0] != dt.with_lanes(e.dtype, lanes):  # ctlz: operand's width
            r = cast(self.b, r, dtypes[0], dt.with_lanes(e.dtype, lanes))
        return r


def c_scalar_params(func: S.PrimFunc) -> list[E.Var]:
    """The scalar parameters (``te.var`` arguments) that are C arguments of ``func``, in
    argument order: those that are not also a symbolic dim (a dim travels as an int64 dim
    argument; the runtime checks that an explicit value agrees with the shapes)."""
    dims = func.dim_vars
    return [v for _, v in func.attrs.get("scalar_params", ())
            if not any(v is d for d in dims)]


def const_int(e: E.Expr) -> int | None:
    """The value of an integer immediate or a broadcast of one, else None."""
    if isinstance(e, E.Broadcast):
        e = e.value
    if isinstance(e, E.IntImm) and not dt.is_bool(e.dtype):
        return e.value
    return None


def lanes_of(v: ir.Value) -> int:
    return v.type.count if isinstance(v.type, ir.VectorType) else 1


def expr_children(e: E.Expr) -> list[E.Expr]:
    out: list[E.Expr] = []
    for name in e.__dataclass_fields__:  # type: ignore[attr-defined]
        v = getattr(e, name)
        if isinstance(v, E.Expr):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, E.Expr))
    return out


def const_elements(buf: Buffer) -> int | None:
    """How many elements ``buf`` spans when its shape (and strides) are constants, else None."""
    n = 1
    for s in buf.shape:
        if not isinstance(s, E.IntImm):
            return None
        n *= s.value
    if buf.strides:
        if not all(isinstance(s, E.IntImm) for s in buf.strides):
            return None
        n = max([n] + [sh.value * st.value for sh, st in zip(buf.shape, buf.strides, strict=True)])  # type: ignore[attr-defined]
    return n


__all__ = ["CodegenLLVM", "ErrorCode", "FnState", "const_elements", "const_int", "expr_children",
           "lanes_of"]
