"""A numpy interpreter of the loop-nest IR: the executable definition of its semantics.

Compiled code is differential-tested against this module, so every choice here is a contract
the code generators must honour. The IR is first turned into a tree of Python closures (one
per node, specialised on the node's dtype), then run; that keeps dispatch out of the hot loop.

Values: scalar ints are Python ints kept in the dtype's range; scalar floats are numpy
scalars of the exact dtype (float32 rounds after every op); vectors are 1-D numpy arrays; a
buffer's ``data`` var and ``address_of`` evaluate to a `Pointer`.

Semantics the backends must match:
  * int Add/Sub/Mul wrap; Div truncates toward zero; FloorDiv/FloorMod follow Python; a zero
    divisor raises ZeroDivisionError; INT_MIN / -1 wraps (LLVM: undefined).
  * float Div is IEEE (x/0 is inf or nan); FloorDiv is ``floor(a / b)`` and FloorMod is
    ``a - floor(a / b) * b``, each op rounded to the dtype.
  * Min(a, b) = ``a < b ? a : b``, Max(a, b) = ``a > b ? a : b`` (TVM's lowering; with a NaN
    operand the result is ``b``). Intrinsics ``fmin``/``fmax`` ignore NaN like C.
  * Comparisons are IEEE: ordered, except ``!=`` which is true for NaN.
  * And/Or evaluate both sides (no short-circuit); only Select is lazy. A scalar Select
    evaluates the chosen side; a vector Select evaluates both sides lane-masked: loads and
    integer divisions in lanes the condition does not pick are not performed (they yield 0).
  * Casts: float->int truncates toward zero and saturates: values beyond the int dtype's
    range (and +-inf) give its min/max, negative values to an unsigned dtype give 0, NaN
    gives 0 (``llvm.fptosi.sat``/``fptoui.sat``, Rust/WebAssembly semantics). Anything->bool
    is ``!= 0`` (NaN is True). int->float rounds to nearest even once.
  * ``round`` rounds half to even, like ``np.round`` (codegen uses ``llvm.roundeven``);
    ``nearbyint``/``rint`` are the same. ``fma`` is computed in float64 and rounded once more (exact for float16/32 inputs
    up to a double rounding, approximate for float64).
  * Bit intrinsics (shifts take the amount modulo the width), ``reinterpret``, ``exp10``
    and ``ldexp``: `tecomp.arith.intrin_eval`, shared with the GPU emulator.
  * VectorReduce folds the lanes left to right with the scalar semantics above (an ordered
    reduction, like ``llvm.vector.reduce.fadd`` without reassociation).
  * Every loop kind runs sequentially in order; AttrStmt is ignored.
  * Every out-of-bounds access (any axis of a multi-dimensional access, or the flat storage)
    raises IndexError naming the buffer and the index; masked lanes are never checked.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..arith import intrin_eval
from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from . import interp_args
from . import interp_ops as ops
from .interp_args import Pointer
from .interp_ops import saturating_float_to_int  # noqa: F401  (public: tests and users call interp.saturating_float_to_int)

Env = dict[Any, Any]
ExprFn = Callable[[Env], Any]
StmtFn = Callable[[Env], None]

_MISSING = object()


def run(
    func: S.PrimFunc,
    *args: np.ndarray | int,
    max_steps: int | None = None,
    externs: dict[str, Callable[..., Any]] | None = None,
    poison: bool = False,
) -> None:
    """Run ``func`` in place on numpy arrays, one per ``func.params`` buffer, in order.

    Symbolic dims are bound from the array shapes; ints after the arrays (one per
    ``func.dim_vars`` entry) give them explicitly. ``externs`` maps the symbols of
    ``Call(..., extern=True)`` to Python callables. ``poison=True`` fills every ``Allocate`` with
    NaN (floats) or 0x5A bytes (ints) so reads of uninitialised memory show up in results.
    ``max_steps`` bounds the statements executed (each Stmt node counts every time it runs;
    a TecompError past it).

    >>> from tecomp.ir import Buffer, BufferStore, BufferLoad, For, ForKind, PrimFunc, Var, const
    >>> A, B = Buffer("A", (const(4),), "float32"), Buffer("B", (const(4),), "float32")
    >>> i = Var("i")
    >>> f = PrimFunc("double", [A, B], For(i, const(0), const(4), ForKind.SERIAL,
    ...     BufferStore(B, BufferLoad(A, (i,)) * 2.0, (i,))))
    >>> a, b = np.arange(4, dtype="float32"), np.zeros(4, "float32")
    >>> run(f, a, b); b.tolist()
    [0.0, 2.0, 4.0, 6.0]
    """
    env, copy_back = bind_args(func, args)
    compiler = _Compiler(externs or {}, poison, max_steps)
    compiler.by_name.update((b.name, env[b.data]) for b in func.params)
    body = compiler.stmt(func.body)
    try:
        with np.errstate(all="ignore"):
            body(env)
    finally:
        for user, work in copy_back:
            user[...] = work


def bind_args(func: S.PrimFunc, args: Sequence[Any]) -> tuple[Env, list[tuple[np.ndarray, np.ndarray]]]:
    """`interp_args.bind_args` with this interpreter evaluating shape expressions: the env of
    ``func`` called with ``args`` and the (user array, working copy) pairs to copy back.
    The GPU emulator binds its arguments through this too."""
    return interp_args.bind_args(func, args, lambda e, env: _Compiler({}, False, None).expr(e)(env))


# helpers --------------------------------------------------------------------------------------


def _restore(env: dict[Any, Any], key: Any, old: Any) -> None:
    """Undo a scoped binding (loop var, let, allocation) so shadowed outer bindings return."""
    if old is _MISSING:
        env.pop(key, None)
    else:
        env[key] = old


def _nothing(env: Env) -> None:
    """The missing else branch."""


def _oob(buf: Buffer, node: object, what: str) -> IndexError:
    return IndexError(f"out-of-bounds access to buffer '{buf.name}': {what} in {node}")


def _lane_mask(mask: np.ndarray | None, lanes: int) -> np.ndarray | None:
    """The enclosing vector-Select mask as seen by ``lanes`` lanes; a mask of another width
    cannot apply per lane, so it only says whether any lane needs the value at all."""
    if mask is None or mask.shape[0] == lanes:
        return mask
    return None if mask.any() else np.zeros(lanes, bool)


# the compiler --------------------------------------------------------------------------------


class _Compiler:
    """Turns IR nodes into closures ``fn(env)``; options are baked in at compile time."""

    def __init__(
        self, externs: dict[str, Callable[..., Any]], poison: bool, max_steps: int | None
    ) -> None:
        self.externs = externs
        self.poison = poison
        self.max_steps = max_steps
        self.steps = [0]
        # The lane mask of the innermost vector Select being evaluated (None outside one), and
        # how many vector-Select branches enclose the node being compiled: only nodes inside
        # one pay for looking at the mask.
        self.mask: list[np.ndarray | None] = [None]
        self.masked_depth = 0
        # Storage looked up by buffer name when a pass made a Buffer with a fresh data var.
        self.by_name: dict[str, Pointer] = {}

    # statements ---------------------------------------------------------------------------

    def stmt(self, s: S.Stmt) -> StmtFn:
        method = _STMT.get(type(s))
        if method is None:
            raise TecompError(f"the interpreter cannot execute {type(s).__name__}: {s}")
        fn: StmtFn = method(self, s)
        if self.max_steps is None:
            return fn
        steps, limit, inner = self.steps, self.max_steps, fn
        def counted(env: Env) -> None:
            steps[0] += 1
            if steps[0] > limit:
                raise TecompError(f"max_steps={limit} exceeded (at {type(s).__name__})")
            inner(env)
        return counted

    def _for(self, s: S.For) -> StmtFn:
        v, fmin, fext, body = s.var, self.expr(s.min), self.expr(s.extent), self.stmt(s.body)
        def run_for(env: Env) -> None:
            old = env.get(v, _MISSING)
            lo = fmin(env)
            for i in range(lo, lo + fext(env)):
                env[v] = i
                body(env)
            _restore(env, v, old)
        return run_for

    def _seq(self, s: S.SeqStmt) -> StmtFn:
        fns = tuple(self.stmt(x) for x in s.seq)
        def run_seq(env: Env) -> None:
            for f in fns:
                f(env)
        return run_seq

    def _if(self, s: S.IfThenElse) -> StmtFn:
        if dt.lanes(s.cond.dtype) != 1:
            raise TecompError(f"IfThenElse condition must be scalar, got {s.cond.dtype}: {s.cond}")
        cond, then = self.expr(s.cond), self.stmt(s.then_case)
        other = self.stmt(s.else_case) if s.else_case is not None else _nothing
        return lambda env: (then if cond(env) else other)(env)

    def _evaluate(self, s: S.Evaluate) -> StmtFn:
        return self.expr(s.value)  # run for its effect; the value is dropped

    def _attr(self, s: S.AttrStmt) -> StmtFn:
        return self.stmt(s.body)

    def _allocate(self, s: S.Allocate) -> StmtFn:
        buf, body, by_name = s.buffer, self.stmt(s.body), self.by_name
        npd = dt.storage_numpy(buf.dtype)
        shape = [self.expr(x) for x in buf.shape]
        strides = [self.expr(x) for x in buf.strides]
        poison, data = self.poison, buf.data
        def run_alloc(env: Env) -> None:
            dims = [f(env) for f in shape]
            if strides:
                size = 1 + sum((n - 1) * st(env) for n, st in zip(dims, strides, strict=True))
                size = size if all(n > 0 for n in dims) else 0
            else:
                size = math.prod(dims)
            if size < 0:
                raise TecompError(f"allocation of {buf.name} has negative size {dims}")
            flat = np.zeros(size, npd)
            if poison:  # NaN for floats, True for bools, 0x5A5A... for ints
                flat.view(np.uint8 if npd.kind in "iu" else npd).fill(ops.POISON[npd.kind])
            p = Pointer(flat, 0)
            old, old_name = env.get(data, _MISSING), by_name.get(buf.name, _MISSING)
            env[data] = by_name[buf.name] = p
            try:
                body(env)
            finally:
                _restore(env, data, old)
                _restore(by_name, buf.name, old_name)
        return run_alloc

    def _store(self, s: S.BufferStore) -> StmtFn:
        buf = s.buffer
        if dt.element(s.value.dtype) != dt.element(buf.dtype):
            raise TecompError(f"storing {s.value.dtype} into {buf.dtype} buffer {buf.name}: {s}")
        lanes = max([dt.lanes(s.value.dtype)] + [dt.lanes(i.dtype) for i in s.indices])
        # a predicated vector store's value is evaluated lane-masked, as a vector Select's
        # sides are: its masked-off lanes (a vector tail) may divide by a zero nobody stores
        masked_value = lanes > 1 and s.predicate is not None
        self.masked_depth += masked_value
        try:
            value = self.expr(s.value)
        finally:
            self.masked_depth -= masked_value
        storage = self._storage(buf)
        npd = dt.value_numpy(buf.dtype)
        if dt.element(buf.dtype) == "bfloat16":  # float32 values -> bits (RNE) on store
            v32 = value
            value = lambda env: dt.f32_to_bf16_bits(v32(env))  # noqa: E731
            npd = np.dtype(np.uint16)
        if lanes == 1 and s.predicate is None:
            offset = self._scalar_offset(buf, s.indices, s)
            def store(env: Env) -> None:
                v = value(env)
                flat = storage(env)
                o = offset(env, flat)
                try:
                    flat[o] = v
                except IndexError:
                    raise _oob(buf, s, f"flat index {o} >= storage size {flat.shape[0]}") from None
            return store
        offsets = self._vector_offsets(buf, s.indices, lanes, s)
        pred = self.expr(s.predicate) if s.predicate is not None else None
        mcell = self.mask
        def vstore(env: Env) -> None:
            m = None if pred is None else np.broadcast_to(np.asarray(pred(env), bool), (lanes,))
            if m is None:
                v = np.broadcast_to(np.asarray(value(env), npd), (lanes,))
            else:
                old = mcell[0]
                outer = _lane_mask(old, lanes)  # None outside a vector Select (statement level)
                mcell[0] = m if outer is None else m & outer
                try:
                    v = np.broadcast_to(np.asarray(value(env), npd), (lanes,))
                finally:
                    mcell[0] = old
            flat = storage(env)
            o = offsets(env, flat, m)
            sel = slice(None) if m is None else m
            flat[o[sel]] = v[sel]
        return vstore

    # memory access --------------------------------------------------------------------------

    def _storage(self, buf: Buffer) -> Callable[[Env], np.ndarray]:
        """The flat storage of ``buf`` viewed as its dtype (storage may be shared/reinterpreted)."""
        data, npd, by_name = buf.data, dt.storage_numpy(buf.dtype), self.by_name
        def storage(env: Env) -> np.ndarray:
            p = env.get(data) or by_name.get(buf.name)
            if p is None:
                raise TecompError(f"buffer {buf.name} is neither a parameter nor allocated")
            flat = p.array if p.offset == 0 else p.array[p.offset:]
            return flat if flat.dtype is npd else flat.view(npd)
        return storage

    def _dims(
        self, buf: Buffer, nidx: int, node: object
    ) -> Callable[[Env, np.ndarray], list[tuple[int, int]]]:
        """(extent, stride) per index: the buffer's axes, or the whole storage for one flat index."""
        if nidx == 1 and buf.ndim != 1:
            return lambda env, flat: [(flat.shape[0], 1)]
        if nidx != buf.ndim:
            raise TecompError(f"{node}: {nidx} indices into {buf.ndim}-d buffer {buf.name}")
        if all(isinstance(x, E.IntImm) for x in (*buf.shape, *buf.strides)):
            ext = [x.value for x in buf.shape]  # type: ignore[attr-defined]
            st = [x.value for x in buf.strides] or [math.prod(ext[k + 1:]) for k in range(len(ext))]  # type: ignore[attr-defined]
            const = list(zip(ext, st, strict=True))
            return lambda env, flat: const
        shape = [self.expr(x) for x in buf.shape]
        strides = [self.expr(x) for x in buf.strides]
        def sym_dims(env: Env, flat: np.ndarray) -> list[tuple[int, int]]:
            ext = [f(env) for f in shape]
            st = [f(env) for f in strides] or [math.prod(ext[k + 1:]) for k in range(len(ext))]
            return list(zip(ext, st, strict=True))
        return sym_dims

    def _scalar_offset(
        self, buf: Buffer, indices: tuple[E.Expr, ...], node: object
    ) -> Callable[[Env, np.ndarray], int]:
        """Flat element offset of a scalar access, checked on every axis."""
        idx = [self.expr(i) for i in indices]
        dims = self._dims(buf, len(indices), node)
        if len(idx) == 1 and buf.ndim == 1 and isinstance(buf.shape[0], E.IntImm):
            (f0,), n0 = idx, buf.shape[0].value  # the common flat case, without the loop
            def off1(env: Env, flat: np.ndarray) -> int:
                i = f0(env)
                if 0 <= i < n0:
                    return i  # type: ignore[no-any-return]
                raise _oob(buf, node, f"index {i} not in [0, {n0})")
            return off1
        def offn(env: Env, flat: np.ndarray) -> int:
            o = 0
            for axis, (f, (n, st)) in enumerate(zip(idx, dims(env, flat), strict=True)):
                i = f(env)
                if not 0 <= i < n:
                    raise _oob(buf, node, f"index {i} on axis {axis} not in [0, {n})")
                o += i * st
            return o
        return offn

    def _vector_offsets(
        self, buf: Buffer, indices: tuple[E.Expr, ...], lanes: int, node: object
    ) -> Callable[[Env, np.ndarray, np.ndarray | None], np.ndarray]:
        """Flat offsets of each lane (int64), checked on the lanes ``mask`` lets through."""
        idx = [self.expr(i) for i in indices]
        dims = self._dims(buf, len(indices), node)
        def offsets(env: Env, flat: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
            o = np.zeros(lanes, np.int64)
            for axis, (f, (n, st)) in enumerate(zip(idx, dims(env, flat), strict=True)):
                i = np.broadcast_to(np.asarray(f(env), np.int64), (lanes,))
                live = i if mask is None else i[mask]
                if live.size and (live.min() < 0 or live.max() >= n):
                    bad = live[(live < 0) | (live >= n)][0]
                    raise _oob(buf, node, f"lane index {bad} on axis {axis} not in [0, {n})")
                o += i * st
            live = o if mask is None else o[mask]
            if live.size and live.max() >= flat.shape[0]:
                raise _oob(buf, node, f"flat index {live.max()} >= storage size {flat.shape[0]}")
            return o
        return offsets

    def _load(self, e: E.BufferLoad) -> ExprFn:
        buf = e.buffer
        if dt.element(e.dtype) != dt.element(buf.dtype):
            raise TecompError(f"loading {e.dtype} from {buf.dtype} buffer {buf.name}: {e}")
        raw = self._raw_load(e)
        if not dt.is_half(buf.dtype):
            return raw
        # 16-bit storage, float32 values (exact widening)
        if dt.element(buf.dtype) == "bfloat16":
            if dt.lanes(e.dtype) > 1:
                return lambda env: dt.bf16_bits_to_f32(raw(env))
            return lambda env: dt.bf16_bits_to_f32(raw(env))[()]
        if dt.lanes(e.dtype) > 1:
            return lambda env: np.asarray(raw(env), np.float32)
        return lambda env: np.float32(raw(env))

    def _raw_load(self, e: E.BufferLoad) -> ExprFn:
        buf = e.buffer
        storage = self._storage(buf)
        npd = dt.storage_numpy(buf.dtype)
        lanes = max([dt.lanes(e.dtype)] + [dt.lanes(i.dtype) for i in e.indices])
        masked, mcell = self.masked_depth > 0, self.mask
        if lanes == 1 and e.predicate is None:
            offset = self._scalar_offset(buf, e.indices, e)
            zero = npd.type(0)
            py = npd.kind != "f"  # ints and bools travel as Python scalars
            def load(env: Env) -> Any:
                flat = storage(env)
                o = offset(env, flat)
                try:
                    return flat.item(o) if py else flat[o]
                except IndexError:
                    raise _oob(buf, e, f"flat index {o} >= storage size {flat.shape[0]}") from None
            if not masked:
                return load
            def masked_load(env: Env) -> Any:
                m = mcell[0]
                if m is not None and not m.any():
                    return zero.item() if py else zero
                return load(env)
            return masked_load
        offsets = self._vector_offsets(buf, e.indices, lanes, e)
        pred = self.expr(e.predicate) if e.predicate is not None else None
        def vload(env: Env) -> Any:
            flat = storage(env)
            m = None if pred is None else np.broadcast_to(np.asarray(pred(env), bool), (lanes,))
            if masked:
                outer = _lane_mask(mcell[0], lanes)
                if outer is not None:
                    m = outer if m is None else (m & outer)
            o = offsets(env, flat, m)
            if m is None:
                return flat[o]
            out = np.zeros(lanes, npd)
            out[m] = flat[o[m]]
            return out
        return vload

    def _address_of(self, e: E.Call) -> ExprFn:
        (load,) = e.args
        if not isinstance(load, E.BufferLoad) or dt.lanes(load.dtype) != 1:
            raise TecompError(f"address_of takes one scalar BufferLoad, got {e}")
        buf, storage = load.buffer, self._storage(load.buffer)
        idx = [self.expr(i) for i in load.indices]
        dims = self._dims(buf, len(idx), e)
        def address(env: Env) -> Pointer:
            flat = storage(env)
            o = sum(f(env) * st for f, (_, st) in zip(idx, dims(env, flat), strict=True))
            if not 0 <= o <= flat.shape[0]:  # one past the end is a valid C pointer
                raise _oob(buf, e, f"address offset {o} outside [0, {flat.shape[0]}]")
            return Pointer(flat, o)
        return address

    # expressions ----------------------------------------------------------------------------

    def expr(self, e: E.Expr) -> ExprFn:
        method = _EXPR.get(type(e))
        if method is None:
            raise TecompError(f"the interpreter cannot evaluate {type(e).__name__}: {e} (lower it first)")
        return method(self, e)  # type: ignore[no-any-return]

    def _imm(self, e: E.IntImm | E.FloatImm | E.StringImm) -> ExprFn:
        v: Any = e.value
        if isinstance(e, E.FloatImm) and dt.is_half(e.dtype):
            v = dt.round_to(np.float64(v), e.dtype)[()]  # a 16-bit value, computed as float32
        elif isinstance(e, E.FloatImm):
            v = dt.to_numpy(e.dtype).type(v)
        elif dt.is_bool(e.dtype):
            v = bool(v)
        return lambda env: v

    def _var(self, e: E.Var) -> ExprFn:
        def var(env: Env) -> Any:
            try:
                return env[e]
            except KeyError:
                raise TecompError(f"variable {e.name} is used outside its scope") from None
        return var

    def _binary(self, e: E.BinaryOp) -> ExprFn:
        fa, fb = self.expr(e.a), self.expr(e.b)
        op = type(e)
        if dt.lanes(e.dtype) > 1:
            return self._vector_binary(e, fa, fb)
        if dt.is_float(e.dtype):
            fn = ops.FLOAT_SCALAR[op]
            return lambda env: fn(fa(env), fb(env))
        fn, (lo, hi) = ops.INT_SCALAR[op], ops.int_range(e.dtype)
        if op is E.Min or op is E.Max:
            return lambda env: fn(fa(env), fb(env))
        if op is E.Add or op is E.Sub or op is E.Mul:
            m = hi - lo
            def arith(env: Env) -> int:
                r = fn(fa(env), fb(env))
                return r if lo <= r < hi else (r - lo) % m + lo  # type: ignore[no-any-return]
            return arith
        wrap = ops.wrapper(e.dtype)
        masked, mcell = self.masked_depth > 0, self.mask
        def div(env: Env) -> int:
            x, y = fa(env), fb(env)
            if y == 0:
                if masked and mcell[0] is not None and not mcell[0].any():
                    return 0
                raise ZeroDivisionError(f"integer division by zero in {e}")
            return wrap(fn(x, y))
        return div

    def _vector_binary(self, e: E.BinaryOp, fa: ExprFn, fb: ExprFn) -> ExprFn:
        op, lanes = type(e), dt.lanes(e.dtype)
        if dt.is_float(e.dtype):
            vfn = ops.FLOAT_VECTOR[op]
            return lambda env: vfn(fa(env), fb(env))
        vfn = ops.INT_VECTOR[op]
        if op not in (E.Div, E.FloorDiv, E.FloorMod):
            return lambda env: vfn(fa(env), fb(env))
        masked, mcell = self.masked_depth > 0, self.mask
        def vdiv(env: Env) -> Any:
            x, y = fa(env), np.broadcast_to(fb(env), (lanes,))
            zero = y == 0
            if zero.any():
                live = _lane_mask(mcell[0], lanes) if masked else None
                if live is None or (zero & live).any():
                    raise ZeroDivisionError(f"integer division by zero in {e}")
                y = np.where(zero, np.ones_like(y), y)  # lanes nobody reads
                return np.where(zero, np.zeros_like(y), vfn(x, y))
            return vfn(x, y)
        return vdiv

    def _cmp(self, e: E.CmpOp) -> ExprFn:
        fa, fb, fn = self.expr(e.a), self.expr(e.b), ops.CMP[type(e)]
        return lambda env: fn(fa(env), fb(env))

    def _logic(self, e: E.And | E.Or) -> ExprFn:
        fa, fb = self.expr(e.a), self.expr(e.b)
        sfn, vfn = ops.LOGIC[type(e)]
        fn = vfn if dt.lanes(e.dtype) > 1 else sfn
        return lambda env: fn(fa(env), fb(env))  # both operands run: no short-circuit

    def _not(self, e: E.Not) -> ExprFn:
        fa = self.expr(e.a)
        if dt.lanes(e.dtype) > 1:
            return lambda env: np.logical_not(fa(env))
        return lambda env: not fa(env)

    def _select(self, e: E.Select) -> ExprFn:
        cond = self.expr(e.cond)
        if dt.lanes(e.cond.dtype) == 1:
            ft, ff = self.expr(e.t), self.expr(e.f)
            return lambda env: ft(env) if cond(env) else ff(env)
        self.masked_depth += 1
        try:
            ft, ff = self.expr(e.t), self.expr(e.f)
        finally:
            self.masked_depth -= 1
        mcell = self.mask
        def vselect(env: Env) -> Any:
            m = np.asarray(cond(env), bool)
            old = mcell[0]
            try:
                mcell[0] = m if old is None else (m & old)
                tv = ft(env)
                mcell[0] = ~m if old is None else (~m & old)
                fv = ff(env)
            finally:
                mcell[0] = old
            return np.where(m, tv, fv)
        return vselect

    def _cast(self, e: E.Cast) -> ExprFn:
        fv, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        if src == dst:
            return fv
        if dt.is_half(dst):  # one correct rounding to 16 bits, held as float32
            if dt.lanes(dst) > 1:
                return lambda env: dt.round_to(fv(env), dst)
            if dt.is_float(src):
                return lambda env: dt.round_to(fv(env), dst)[()]
            return lambda env: dt.round_to(np.float64(int(fv(env))), dst)[()]
        if dt.is_half(src):  # its value is a float32
            src = dt.compute_dtype(src)
            if src == dst:
                return fv
        npd = dt.to_numpy(dst)
        if dt.lanes(dst) > 1:
            if dt.is_bool(dst):
                return lambda env: np.asarray(fv(env)) != 0
            if dt.is_float(src) and not dt.is_float(dst):
                return lambda env: ops.saturating_float_to_int(fv(env), npd)
            return lambda env: np.asarray(fv(env)).astype(npd)
        if dt.is_bool(dst):
            return lambda env: bool(fv(env))
        if dt.is_float(dst):
            t = npd.type
            if dt.is_float(src):
                return lambda env: t(fv(env))
            def int_to_float(env: Env) -> Any:
                v = int(fv(env))
                if -(2**53) <= v <= 2**53:
                    return t(v)  # exact in double, so this rounds once
                return np.array(v, np.int64 if v < 0 else np.uint64).astype(npd)[()]
            return int_to_float
        lo, hi = ops.int_range(dst)
        wrap = ops.wrapper(dst)
        if not dt.is_float(src):
            return lambda env: wrap(int(fv(env)))
        def float_to_int(env: Env) -> int:
            f = float(fv(env))
            if lo - 1 < f < hi:  # Python compares floats and ints exactly
                return int(f)  # truncates toward zero
            if f != f:
                return 0  # NaN
            return lo if f < 0 else hi - 1  # saturates (+-inf too)
        return float_to_int

    def _let(self, e: E.Let | S.LetStmt) -> ExprFn:
        v, value = e.var, self.expr(e.value)
        body = self.expr(e.body) if isinstance(e, E.Let) else self.stmt(e.body)
        def let(env: Env) -> Any:
            old = env.get(v, _MISSING)
            env[v] = value(env)
            try:
                return body(env)
            finally:
                _restore(env, v, old)
        return let

    def _ramp(self, e: E.Ramp) -> ExprFn:
        fb, fs = self.expr(e.base), self.expr(e.stride)
        iota = np.arange(e.lanes).astype(dt.to_numpy(e.dtype))
        return lambda env: iota * fs(env) + fb(env)

    def _broadcast(self, e: E.Broadcast) -> ExprFn:
        fv, lanes, npd = self.expr(e.value), e.lanes, dt.value_numpy(e.dtype)
        return lambda env: np.full(lanes, fv(env), npd)

    def _shuffle(self, e: E.Shuffle) -> ExprFn:
        fns, idx = [self.expr(v) for v in e.vectors], np.asarray(e.indices)
        return lambda env: np.concatenate([np.atleast_1d(f(env)) for f in fns])[idx]

    def _vector_reduce(self, e: E.VectorReduce) -> ExprFn:
        fv, op = self.expr(e.value), ops.REDUCE_OPS.get(e.op)
        if op is None:
            raise TecompError(f"unknown VectorReduce op {e.op!r}: {e}")
        if dt.is_float(e.dtype):  # numpy scalars: every step rounds to the dtype, in lane order
            ffn = ops.FLOAT_SCALAR[op]
            return lambda env: functools.reduce(ffn, fv(env))
        ifn, wrap = ops.INT_SCALAR[op], ops.wrapper(e.dtype)
        return lambda env: wrap(functools.reduce(ifn, fv(env).tolist()))

    def _call(self, e: E.Call) -> ExprFn:
        if e.name == "address_of":
            return self._address_of(e)
        if e.name == "debug_oob_axis":  # passes/bounds_check.py: an index outside its axis
            _, name, axis, index, extent = e.args
            fi, fx = self.expr(index), self.expr(extent)

            def oob(env: Env) -> Any:
                raise IndexError(f"out-of-bounds access to buffer {name.value!r}: index "  # type: ignore[attr-defined]
                                 f"{fi(env)} on axis {axis.value} not in [0, {fx(env)})")  # type: ignore[attr-defined]

            return oob
        args = [self.expr(a) for a in e.args]
        if e.name == "prefetch":
            return lambda env: 0
        if e.name == "likely":  # a branch hint: the value passes through
            return args[0]
        if e.extern:
            fn = self.externs.get(e.name)
            if fn is None:  # te.register_extern: Python implementations of C symbols
                from ..te.extern import PY_EXTERNS

                fn = PY_EXTERNS.get(e.name)
            if fn is None and e.name.startswith("llvm."):  # te.call_llvm_intrin
                from ..te.intrin import LLVM_EQUIVALENTS, llvm_equivalent

                same = llvm_equivalent(e.name)
                if same is None:
                    raise TecompError(
                        f"the interpreter cannot run the LLVM intrinsic {e.name!r} in {e}: it "
                        f"knows llvm.{{{', '.join(LLVM_EQUIVALENTS)}}} (give it a Python "
                        "implementation with te.register_extern, or build for the CPU)")
                return self._call(E.Call(e.dtype, same, e.args))
            if fn is None:
                raise TecompError(f"extern symbol {e.name!r} is not provided (pass externs=... "
                                  "or register it with te.register_extern)")
            if dt.lanes(e.dtype) > 1:  # a scalar C function the vectorizer widened
                return self._extern_per_lane(e.dtype, fn, args)
            conv = self._converter(e.dtype)
            return lambda env: conv(fn(*[a(env) for a in args]))
        if e.name == "reinterpret":
            return self._reinterpret(e, args[0])
        if e.name in ops.PREDICATES:
            pfn = ops.PREDICATES[e.name]
            if dt.lanes(e.dtype) > 1:
                return lambda env: pfn(*[a(env) for a in args])
            return lambda env: bool(pfn(*[a(env) for a in args]))
        if not dt.is_float(e.dtype):
            return self._int_call(e, args)
        ffn = ops.float_fns(dt.value_numpy(e.dtype)).get(e.name)
        if ffn is None:
            raise TecompError(f"unknown intrinsic {e.name!r} in {e}")
        if len(args) == 1:
            (a0,) = args
            return lambda env: ffn(a0(env))
        return lambda env: ffn(*[a(env) for a in args])

    def _reinterpret(self, e: E.Call, a0: ExprFn) -> ExprFn:
        src, dst, vec = e.args[0].dtype, e.dtype, dt.lanes(e.dtype) > 1
        if not dt.is_half(src) and not dt.is_half(dst):
            rfn = intrin_eval.reinterpret_fn(src, dst, vec)
            return lambda env: rfn(a0(env))
        # 16-bit floats: their bits are those of the value rounded to 16 bits
        def bits16(v: Any) -> np.ndarray:
            if not dt.is_half(src):
                return np.asarray(v).astype(dt.to_numpy(src)).view(np.uint16)
            if dt.element(src) == "bfloat16":
                return dt.f32_to_bf16_bits(v)
            return np.asarray(v, np.float32).astype(np.float16).view(np.uint16)
        def from_bits(u: np.ndarray) -> Any:
            if dt.element(dst) == "bfloat16":
                r: Any = dt.bf16_bits_to_f32(u)
            elif dt.element(dst) == "float16":
                r = u.view(np.float16).astype(np.float32)
            else:
                r = u.view(dt.to_numpy(dst))
                return r if vec else r[()].item()
            return r if vec else r[()]
        return lambda env: from_bits(np.asarray(bits16(a0(env))))

    def _int_call(self, e: E.Call, args: list[ExprFn]) -> ExprFn:
        if e.name in intrin_eval.INT_NAMES:  # bits: see tecomp/arith/intrin_eval.py
            src = e.args[0].dtype
            fn = (intrin_eval.int_vector_fn(e.name, src, e.dtype) if dt.lanes(e.dtype) > 1
                  else intrin_eval.int_scalar_fn(e.name, src))
            assert fn is not None
            return lambda env: fn(*[a(env) for a in args])
        if e.name not in ("abs", "fabs", "floor", "ceil", "round", "trunc", "nearbyint", "rint"):
            raise TecompError(f"unknown intrinsic {e.name!r} for {e.dtype} in {e}")
        (a0,) = args
        if e.name not in ("abs", "fabs"):
            return a0  # rounding an integer is the identity
        if dt.lanes(e.dtype) > 1:
            return lambda env: np.abs(a0(env))  # wraps INT_MIN like the hardware
        wrap = ops.wrapper(e.dtype)
        return lambda env: wrap(abs(a0(env)))

    def _extern_per_lane(self, dtype: str, fn: Callable[..., Any], args: list[ExprFn]) -> ExprFn:
        """A widened extern call (`passes.vectorize`): the Python implementation of a scalar
        C function is called once per lane with scalars, as the compiled code calls the C
        function, so it need not accept arrays."""
        lanes = dt.lanes(dtype)
        conv = self._converter(dt.element(dtype))
        npd = dt.value_numpy(dt.element(dtype))

        def per_lane(env: Env) -> Any:
            vals = [a(env) for a in args]
            cols = [np.broadcast_to(np.asarray(v), (lanes,)) for v in vals]
            out = [conv(fn(*[c[k].item() if c.dtype.kind in "iub" else c[k] for c in cols]))
                   for k in range(lanes)]
            return np.asarray(out, npd)

        return per_lane

    def _converter(self, dtype: str) -> Callable[[Any], Any]:
        """Bring an extern callable's return value into the interpreter's representation."""
        if dtype in ("handle", "void") or dt.lanes(dtype) > 1:
            return lambda r: r
        npd = dt.value_numpy(dtype)
        def conv(r: Any) -> Any:  # C conversion of the return value; None reads as 0
            v = np.asarray(0 if r is None else r).astype(npd)[()]
            return v if npd.kind == "f" else v.item()
        return conv


_C = _Compiler
_EXPR: dict[type, Callable[[_Compiler, Any], ExprFn]] = {
    E.IntImm: _C._imm, E.FloatImm: _C._imm, E.StringImm: _C._imm, E.Var: _C._var,
    **{k: _C._binary for k in ops.INT_SCALAR}, **{k: _C._cmp for k in ops.CMP},
    E.And: _C._logic, E.Or: _C._logic, E.Not: _C._not, E.Select: _C._select, E.Cast: _C._cast,
    E.Call: _C._call, E.Let: _C._let, E.Ramp: _C._ramp, E.Broadcast: _C._broadcast,
    E.VectorReduce: _C._vector_reduce, E.BufferLoad: _C._load, E.Shuffle: _C._shuffle,
}
_STMT: dict[type, Callable[[_Compiler, Any], StmtFn]] = {
    S.For: _C._for, S.SeqStmt: _C._seq, S.IfThenElse: _C._if, S.LetStmt: _C._let,
    S.Evaluate: _C._evaluate, S.AttrStmt: _C._attr, S.Allocate: _C._allocate,
    S.BufferStore: _C._store,
}
