"""Insert block barriers where threads communicate through shared memory (TVM's thread sync).

A thread may read a shared element another thread wrote only after a barrier between the two,
and may overwrite one another thread still has to read only after a barrier too. As in TVM
(src/tir/transforms/thread_storage_sync.cc), every statement sequence is planned from the
summaries of its statements: the shared accesses a statement makes before its first barrier
(its *head*), whether all threads pass a barrier inside it, and the accesses after its last
barrier (its *tail*). Walking a sequence, the accesses since the last barrier are *pending*:

* a statement whose head conflicts with a pending access gets a barrier before it;
* a serial loop whose body's tail conflicts with the body's head (this iteration's accesses
  against the next one's) gets a barrier at the end of its body.

Two accesses of one shared buffer conflict unless neither writes or it is proven that they
can touch a common element only from the same thread (`_Prover`): a thread reading back its
own writes (a shared stage's init and reduce loops, ``S[tx] = S[tx] + ...``) needs no barrier,
which TVM decides by comparing the two index expressions; here the indices are compared as
linear forms over thread terms, loop terms and uniform terms, and what cannot be proven keeps
the barrier (the emulator's race detector is the referee).

A barrier can only go where every thread of the block arrives; a place under a condition that
depends on threadIdx, in a loop whose trip count does, or in a thread loop narrower than the
block is a `LoweringError` naming the buffer. blockIdx and the symbolic sizes are the same for
every thread of a block, so conditions and trip counts over them are uniform.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..arith.evaluate import evaluate
from ..arith.interval import const_bounds
from ..arith.simplify import Simplifier
from ..errors import LoweringError, TecompError
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import (
    EQ,
    GE,
    GT,
    LE,
    LT,
    NE,
    Add,
    And,
    BinaryOp,
    Broadcast,
    BufferLoad,
    Call,
    Cast,
    CmpOp,
    Div,
    Expr,
    FloorDiv,
    FloorMod,
    IntImm,
    Let,
    Max,
    Min,
    Mul,
    Not,
    Or,
    ProducerLoad,
    Ramp,
    Reduce,
    Select,
    Sub,
    Var,
    const,
)
from ..ir.functor import ExprVisitor, StmtVisitor, free_vars, substitute
from ..ir.printer import expr_str
from ..ir.stmt import (
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    barrier,
    is_barrier,
    seq,
    thread_tag,
)

THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True, eq=False)
class _Acc:
    """One shared-memory access: ``index`` is the flat scalar element offset with thread loop
    variables replaced by one canonical variable per threadIdx tag (None: not understood, it
    conflicts with every access of the buffer); ``local`` are the loops inside the summarised
    statement it sits in, whose values differ from one access to another (two threads need not
    be in the same iteration of a loop without a barrier); ``threads`` bounds the threadIdx
    values (x, y, z) of the threads that run it (thread loops narrower than the block)."""

    buf: Var
    write: bool
    index: Expr | None
    local: tuple[Var, ...]
    threads: tuple[int, int, int]  # the threads that can make it: threadIdx < these extents
    key: str


def _acc(buf: Var, write: bool, index: Expr | None, local: tuple[Var, ...],
         threads: tuple[int, int, int]) -> _Acc:
    # printed forms are not unique (loops of one name): the key also has the variables' ids
    text = "?" if index is None else expr_str(index) + "|" + ",".join(
        sorted(str(id(v)) for v in free_vars(index)))
    key = f"{id(buf)}|{int(write)}|{text}|{','.join(str(id(v)) for v in local)}|{threads}"
    return _Acc(buf, write, index, local, threads, key)


@dataclass
class _Summary:
    """What a statement exposes to the statements around it (see the module docstring)."""

    head: list[_Acc]
    sync: bool  # every thread passes a barrier inside it (then `tail` follows the last one)
    tail: list[_Acc]

    def all(self) -> list[_Acc]:
        return self.head if not self.sync else _merge(self.head, self.tail)


_EMPTY = _Summary([], False, [])


def _merge(a: Iterable[_Acc], b: Iterable[_Acc]) -> list[_Acc]:
    out: dict[str, _Acc] = {}
    for x in itertools.chain(a, b):
        out.setdefault(x.key, x)
    return list(out.values())


class _Shared(StmtVisitor):
    def __init__(self) -> None:
        self.bufs: dict[Var, Buffer] = {}

    def visit_Allocate(self, s: Allocate) -> None:
        if s.buffer.scope == "shared":
            self.bufs[s.buffer.data] = s.buffer
        super().visit_Allocate(s)


class _Loads(ExprVisitor):
    """The shared-buffer loads in an expression (also inside the indices of other loads)."""

    def __init__(self, shared: set[Var]) -> None:
        self.shared = shared
        self.found: list[BufferLoad] = []

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        if e.buffer.data in self.shared:
            self.found.append(e)
        super().visit_BufferLoad(e)


class _Impure(ExprVisitor):
    """Finds what makes an expression more than a function of its variables."""

    def __init__(self) -> None:
        self.found = False

    def visit(self, e: Expr) -> None:
        if isinstance(e, (BufferLoad, ProducerLoad, Call, Reduce, Let)):
            self.found = True
        elif not self.found:
            super().visit(e)


def _impure(e: Expr) -> bool:
    """True when ``e`` reads memory or calls something: not a function of its variables."""
    v = _Impure()
    v.visit(e)
    return v.found


# the same-thread proof ---------------------------------------------------------------------------


@dataclass
class _Term:
    """``coef * z`` in the difference of two indices, with ``lo <= z <= hi`` (None: unbounded).
    ``atom`` is set for ``z = u(T1) - u(T2)`` of a thread term ``u`` (zero when both threads
    are the same one)."""

    coef: int
    lo: int | None
    hi: int | None
    atom: int | None = None


class _Prover:
    """Proves that two accesses of one buffer touch a common element only from one thread.

    Both indices are linear forms (the simplifier's) over terms of three kinds:

    * thread terms, functions of the threadIdx values only (``tx``, ``ty * 17``, ``tx // 8``),
      evaluated for every thread of the block (at most 1024);
    * uniform terms, over blockIdx, the sizes and the loops both accesses are in the same
      iteration of: the same value on both sides;
    * the others: over loops the two accesses may be in different iterations of (renamed
      apart, one copy per side), over per-thread loop variables, or mixing thread values with
      other variables (``(io*64 + tx) // 5``); bounded by the loop ranges.

    ``index_a(T1) == index_b(T2)`` becomes ``sum coef * z + K == 0``, with ``z = u(T1) - u(T2)``
    for a term ``u`` on both sides (coefficient difference aside), otherwise z a term's value.
    A thread term's z is forced to 0 when the other terms cannot reach a non-zero multiple of
    its coefficient (`_forced`): the rest's range lies strictly inside ``(-|coef|, |coef|)``, or,
    modulo the gcd of the other coefficients and K, only 0 is in its own range (mixed-radix
    digits: ``ty*177 + a*59 + tx`` with ``tx < 59`` and ``a < 3`` is one element per (ty, a,
    tx)). If the thread terms forced equal tell every two threads of the block apart, T1 == T2.
    Loads in an index are not understood: not proven.
    """

    def __init__(self, thread_vars: dict[Var, str], per_thread: set[Var],
                 ranges: dict[Var, tuple[Expr, Expr]]) -> None:
        self.thread_vars = thread_vars
        self.per_thread = per_thread
        self.ranges = ranges
        self.simp = Simplifier()
        # the threads of the two accesses compared: a box (x, y, z) of threadIdx extents
        self.grid: list[tuple[int, ...]] = []  # (threadIdx.x, .y, .z) of each thread
        self.box = (1, 1, 1)
        self._grids: dict[tuple[int, int, int], list[tuple[int, ...]]] = {}
        self._values: dict[tuple[int, tuple[int, int, int]], tuple[int, ...] | None] = {}
        self._bounds: dict[int, tuple[int | None, int | None]] = {}
        self._memo: dict[tuple[str, str, tuple[int, ...]], bool] = {}
        self._copies: dict[tuple[Var, str], Var] = {}

    def same_thread(self, a: _Acc, b: _Acc, extra: tuple[Var, ...] = ()) -> bool:
        box = (max(a.threads[0], b.threads[0]), max(a.threads[1], b.threads[1]),
               max(a.threads[2], b.threads[2]))
        if math.prod(box) <= 1:
            return True  # one thread cannot race with itself
        if a.index is None or b.index is None:
            return False
        key = (a.key, b.key, tuple(id(v) for v in extra))
        r = self._memo.get(key)
        if r is None:
            self.box = box
            self.grid = self._grids.get(box) or self._grids.setdefault(
                box, list(itertools.product(*(range(e) for e in box))))
            try:
                r = self._prove(a, b, extra) or self._enumerated(a, b, extra)
            except (TecompError, ZeroDivisionError, OverflowError, ValueError, TypeError):
                r = False  # an index the evaluator cannot take: not proven
            self._memo[key] = r
        return r

    def _side(self, acc: _Acc, extra: tuple[Var, ...], tag: str) -> tuple[dict[int, tuple[Expr, int, str]], int]:
        """The index as ``{term key: (term, coef, kind)}`` and a constant; kind is "thread",
        "uniform" or "other" (see the class docstring). Keys are the terms with the side's
        copies of loop variables mapped back, so one loop term has one key on both sides."""
        assert acc.index is not None
        local = set(acc.local) | set(extra) | (free_vars(acc.index) & self.per_thread)
        ren: dict[Var, Expr] = {v: self._copy(v, tag) for v in local}
        back: dict[Var, Expr] = {c: v for v, c in ren.items()}  # type: ignore[misc]
        idx = self.simp(substitute(acc.index, ren)) if ren else acc.index
        if not dt.is_int(idx.dtype) or dt.lanes(idx.dtype) != 1:
            raise ValueError("not a scalar integer index")
        terms, k = self.simp.linear(idx)
        out: dict[int, tuple[Expr, int, str]] = {}
        for t, c in terms.values():
            if _impure(t):
                raise ValueError("an index that reads memory")
            fv = free_vars(t)
            th = fv.intersection(self.thread_vars)
            if th and th == fv:
                kind = "thread"
            elif th or fv.intersection(back):
                kind = "other"
            else:
                kind = "uniform"
            # structurally equal terms are one key (variables by identity, not by name)
            key = id(self.simp.intern(substitute(t, back) if kind == "other" else t))
            prev = out.get(key)
            out[key] = (t, c + (prev[1] if prev else 0), kind)
        return out, k

    def _copy(self, v: Var, tag: str) -> Var:
        """One fixed copy of a loop variable per side, with the loop's range."""
        key = (v, tag)
        c = self._copies.get(key)
        if c is None:
            c = self._copies[key] = Var(f"{v.name}'{tag}", v.dtype)
            if v in self.ranges:
                self.ranges[c] = self.ranges[v]
        return c

    def _prove(self, a: _Acc, b: _Acc, extra: tuple[Var, ...]) -> bool:
        sa, ka = self._side(a, extra, "a")
        sb, kb = self._side(b, extra, "b")
        terms: list[_Term] = []
        thread_atoms: dict[int, Expr] = {}
        for key in sa.keys() | sb.keys():
            ta, tb = sa.get(key), sb.get(key)
            ca = ta[1] if ta else 0
            cb = tb[1] if tb else 0
            if ta is not None and tb is not None and ta[2] == tb[2] == "uniform":
                # the same value on both sides: only the difference of the coefficients counts
                if ca != cb:
                    terms.append(_Term(ca - cb, *self._bound(ta[0])))
            elif ta is not None and tb is not None and ta[2] == tb[2]:
                # ca*u_a - cb*u_b = ca*(u_a - u_b) + (ca - cb)*u_b
                lo: int | None
                hi: int | None
                if ta[2] == "thread":
                    vals = self._thread_values(ta[0])
                    if vals is None:
                        return False
                    lo, hi = min(vals), max(vals)
                    thread_atoms[key] = ta[0]
                else:
                    lo, hi = _hull(self._bound(ta[0]), self._bound(tb[0]))
                span = None if lo is None or hi is None else hi - lo
                terms.append(_Term(ca, None if span is None else -span, span,
                                   key if ta[2] == "thread" else None))
                if ca != cb:
                    terms.append(_Term(ca - cb, lo, hi))
            else:  # on one side only, or of another kind on each side: two unrelated values
                if ta is not None:
                    terms.append(_Term(ca, *self._side_bound(ta)))
                if tb is not None:
                    terms.append(_Term(-cb, *self._side_bound(tb)))
        terms = [t for t in terms if t.coef != 0]
        k = ka - kb
        forced: list[int] = []
        changed = True
        while changed:
            changed = False
            for i, t in enumerate(terms):
                if t.atom is None:
                    continue
                rest = terms[:i] + terms[i + 1:]
                if _forced(t, rest, k):
                    forced.append(t.atom)
                    terms = rest
                    changed = True
                    break
        return self._separates([thread_atoms[n] for n in forced])

    def _enumerated(self, a: _Acc, b: _Acc, extra: tuple[Var, ...]) -> bool:
        """The fallback for terms the linear proof does not take apart (``(fo*2 + tx) // 3 % 12``
        with a loop ``fo``): every value of the variables left once equal uniform terms cancel,
        where all of them have constant ranges and there are at most `ENUM_LIMIT` points a side.
        Variables of both sides (uniform) take one value at a time; the two sides' loop copies
        and threads take all of theirs. Not proven when some element is touched on the two
        sides by different threads."""
        sa, ka = self._side(a, extra, "a")
        sb, kb = self._side(b, extra, "b")

        def rest(mine: dict[int, tuple[Expr, int, str]], other: dict[int, tuple[Expr, int, str]],
                 k: int) -> Expr:
            keep = [(t, c) for key, (t, c, kind) in mine.items()
                    if not (kind == "uniform" and key in other and other[key][1] == c)]
            return self.simp.rebuild(keep, k, "int64")

        ea, eb = rest(sa, sb, ka), rest(sb, sa, kb)
        fa, fb = free_vars(ea), free_vars(eb)
        ax = [v for v in self.thread_vars if v in fa | fb]
        copies = set(self._copies.values())
        common = [v for v in (fa | fb) - set(ax) if v not in copies]
        la = [v for v in fa - set(ax) if v in copies]
        lb = [v for v in fb - set(ax) if v in copies]
        dom: dict[Var, np.ndarray] = {}
        for v in [*common, *la, *lb]:
            lo, hi = self._bound(v)
            if lo is None or hi is None or hi - lo + 1 > ENUM_LIMIT:
                return False
            dom[v] = np.arange(lo, hi + 1, dtype=np.int64)
        n_c = math.prod(len(dom[v]) for v in common)
        n_t = len(self.grid)
        if n_c * n_t * max(math.prod(len(dom[v]) for v in la), math.prod(len(dom[v]) for v in lb)) \
                > ENUM_LIMIT:
            return False
        threads = np.array(self.grid, dtype=np.int64).reshape(n_t, 3)

        def points(e: Expr, local: list[Var]) -> tuple[np.ndarray, np.ndarray]:
            """(common-point index * span + element, thread index) of every access on a side."""
            order = [*common, None, *local]  # None: the thread axis
            env: dict[Var, np.ndarray] = {}
            for i, v in enumerate(order):
                shape = [1] * len(order)
                if v is None:
                    shape[i] = n_t
                    for t in ax:
                        env[t] = threads[:, THREAD_TAGS.index(self.thread_vars[t])].reshape(shape)
                else:
                    shape[i] = len(dom[v])
                    env[v] = dom[v].reshape(shape)
            full = tuple(n_t if v is None else len(dom[v]) for v in order)
            elem = np.broadcast_to(_np_eval(e, env), full).reshape(n_c, n_t, -1)
            ci = np.broadcast_to(np.arange(n_c).reshape(n_c, 1, 1), elem.shape)
            ti = np.broadcast_to(np.arange(n_t).reshape(1, n_t, 1), elem.shape)
            return np.stack([ci.ravel(), elem.ravel()]), ti.ravel()

        pa, ta = points(ea, la)
        pb, tb = points(eb, lb)
        keys, inv = np.unique(np.concatenate([pa, pb], axis=1), axis=1, return_inverse=True)
        inv = inv.reshape(-1)
        side = np.concatenate([np.zeros(len(ta), bool), np.ones(len(tb), bool)])
        t = np.concatenate([ta, tb])
        n = keys.shape[1]
        on_a, on_b = np.zeros(n, bool), np.zeros(n, bool)
        on_a[inv[~side]] = True
        on_b[inv[side]] = True
        first, last = np.full(n, n_t, np.int64), np.full(n, -1, np.int64)
        np.minimum.at(first, inv, t)
        np.maximum.at(last, inv, t)
        return not bool(np.any(on_a & on_b & (first != last)))

    def _side_bound(self, t: tuple[Expr, int, str]) -> tuple[int | None, int | None]:
        if t[2] == "thread":
            vals = self._thread_values(t[0])
            return (None, None) if vals is None else (min(vals), max(vals))
        return self._bound(t[0])

    def _thread_values(self, atom: Expr) -> tuple[int, ...] | None:
        """The term's value in every thread compared (it depends on threadIdx only)."""
        key = (id(self.simp.intern(atom)), self.box)
        if key not in self._values:
            fv = free_vars(atom)
            axes = [(v, THREAD_TAGS.index(tag)) for v, tag in self.thread_vars.items() if v in fv]
            try:
                vals: tuple[int, ...] | None = tuple(
                    int(evaluate(atom, {v: p[i] for v, i in axes}))  # type: ignore[arg-type]
                    for p in self.grid)
            except (TecompError, ZeroDivisionError, OverflowError, ValueError, TypeError):
                vals = None
            self._values[key] = vals
        return self._values[key]

    def _separates(self, atoms: Sequence[Expr]) -> bool:
        """Do these thread terms take a different tuple of values in every thread?"""
        cols = [self._thread_values(a) for a in atoms]
        if not cols or any(c is None for c in cols):
            return False
        return len(set(zip(*cols))) == len(self.grid)  # type: ignore[arg-type]

    def _bound(self, e: Expr) -> tuple[int | None, int | None]:
        key = id(self.simp.intern(e))
        if key not in self._bounds:
            self._bounds[key] = const_bounds(e, self.ranges)
        return self._bounds[key]


ENUM_LIMIT = 1 << 18  # points per side the enumeration fallback may evaluate


def _np_eval(e: Expr, env: dict[Var, np.ndarray]) -> np.ndarray:
    """An integer index expression over arrays of variable values (ValueError: not taken)."""
    if isinstance(e, IntImm):
        return np.asarray(e.value, dtype=np.int64)
    if isinstance(e, Var):
        if e not in env:
            raise ValueError(f"no values for {e.name}")
        return env[e]
    if isinstance(e, Cast) and dt.is_int(e.dtype) and dt.is_int(e.value.dtype):
        return _np_eval(e.value, env)
    if isinstance(e, Select):
        return np.where(_np_eval(e.cond, env), _np_eval(e.t, env), _np_eval(e.f, env))
    if isinstance(e, Not):
        return np.logical_not(_np_eval(e.a, env))
    if isinstance(e, (And, Or)):
        fn = np.logical_and if isinstance(e, And) else np.logical_or
        return fn(_np_eval(e.a, env), _np_eval(e.b, env))  # type: ignore[no-any-return]
    if isinstance(e, (BinaryOp, CmpOp)):
        x, y = _np_eval(e.a, env), _np_eval(e.b, env)
        op = _NP_OPS.get(type(e))
        if op is None:
            raise ValueError(f"no numpy form for {type(e).__name__}")
        if isinstance(e, (FloorDiv, FloorMod, Div)) and np.any(y == 0):
            raise ValueError("division by zero")
        return op(x, y)  # type: ignore[no-any-return]
    raise ValueError(f"no numpy form for {type(e).__name__}")


def _trunc_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q)


_NP_OPS: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Add: np.add, Sub: np.subtract, Mul: np.multiply, FloorDiv: np.floor_divide,
    FloorMod: np.mod, Div: _trunc_div, Min: np.minimum, Max: np.maximum,
    EQ: np.equal, NE: np.not_equal, LT: np.less, LE: np.less_equal, GT: np.greater,
    GE: np.greater_equal,
}


def _hull(a: tuple[int | None, int | None], b: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return lo, hi


def _forced(t: _Term, rest: Sequence[_Term], k: int) -> bool:
    """``t.coef * z + sum(rest) + k == 0`` with ``t.lo <= z <= t.hi``: is z always 0?"""
    c = abs(t.coef)
    # (1) the rest cannot reach a non-zero multiple of the coefficient
    lo, hi = k, k
    for r in rest:
        if r.lo is None or r.hi is None:
            lo = hi = None  # type: ignore[assignment]
            break
        a, b = r.coef * r.lo, r.coef * r.hi
        lo, hi = lo + min(a, b), hi + max(a, b)
    if lo is not None and hi is not None and -c < lo and hi < c:
        return True
    # (2) modulo g (the gcd of the other coefficients and k): coef * z == 0 (mod g)
    g = 0
    for r in rest:
        g = math.gcd(g, r.coef)
    g = math.gcd(g, k)
    if g == 0:
        return True  # coef * z == 0
    step = g // math.gcd(c, g)  # z is a multiple of step
    if t.lo is None or t.hi is None:
        return False
    return -step < t.lo and t.hi < step


# the pass ----------------------------------------------------------------------------------------


class ThreadSync:
    def __init__(self, shared: dict[Var, Buffer], launch: dict[str, Expr]) -> None:
        self.shared = shared
        self.vars = set(shared)
        self.launch = launch
        self.divergent: list[str] = []  # why the current point is not reached by all threads
        # analysis view of the variables: thread loop vars -> one canonical var per tag,
        # loops with a thread-dependent start -> start + iteration count, lets -> value
        self.subst: dict[Var, Expr] = {}
        self.canon: dict[tuple[str, str], Var] = {}
        self.thread_vars: dict[Var, str] = {}  # canonical threadIdx vars -> tag
        # loop variables whose value differs between threads in one iteration (the loop starts
        # at a thread-dependent value): never the same value on two sides of a comparison
        self.per_thread: set[Var] = set()
        self.ranges: dict[Var, tuple[Expr, Expr]] = {}
        extents: dict[str, int] = {}
        for tag in THREAD_TAGS:
            e = launch.get(tag)
            extents[tag] = e.value if isinstance(e, IntImm) else 1
        self.prover = _Prover(self.thread_vars, self.per_thread, self.ranges)
        # the box of threads that run the current statement (narrowed by thread loops)
        self.threads: tuple[int, int, int] = (extents[THREAD_TAGS[0]], extents[THREAD_TAGS[1]],
                                              extents[THREAD_TAGS[2]])

    # helpers ---------------------------------------------------------------------------------
    def _view(self, e: Expr) -> Expr:
        return substitute(e, self.subst) if self.subst else e

    def _set_range(self, var: Var, mn: Expr, ext: Expr) -> None:
        """The loop's range, as constants where they are known: the bounds of ``min`` and of
        ``min + extent - 1`` (simplified together, so a partitioned piece ``[m1, m2)`` is within
        ``m2``'s bounds), tighter than the bounds of ``min`` and ``extent`` one by one."""
        lo = const_bounds(mn, self.ranges)[0]
        hi = const_bounds(mn + ext - 1, self.ranges)[1]
        if lo is not None and hi is not None:
            self.ranges[var] = (const(lo, var.dtype), const(max(hi - lo + 1, 1), var.dtype))
        else:
            self.ranges[var] = (mn, ext)

    def _varying(self, e: Expr) -> bool:
        """Does the (analysis view of the) expression differ between threads of a block?"""
        fv = free_vars(e)
        return bool(fv.intersection(self.thread_vars) or fv & self.per_thread)

    def _thread_dependent(self, e: Expr) -> bool:
        return self._varying(self._view(e))

    def _index(self, indices: Sequence[Expr]) -> tuple[Expr | None, tuple[Var, ...]]:
        """The analysed flat scalar index: a vector access is its lanes as one more loop."""
        if len(indices) != 1:
            return None, ()
        idx = self._view(indices[0])
        if isinstance(idx, Broadcast):
            idx = idx.value
        local: tuple[Var, ...] = ()
        if isinstance(idx, Ramp):
            lane = Var("lane", idx.base.dtype)
            self.ranges[lane] = (const(0, lane.dtype), const(idx.lanes, lane.dtype))
            idx = idx.base + idx.stride * lane
            local = (lane,)
        if not dt.is_int(idx.dtype) or dt.lanes(idx.dtype) != 1:
            return None, ()
        return idx, local

    def _reads(self, exprs: Iterable[Expr | None]) -> list[_Acc]:
        out: list[_Acc] = []
        for e in exprs:
            if e is None:
                continue
            v = _Loads(self.vars)
            v.visit(e)
            for ld in v.found:
                idx, local = self._index(ld.indices)
                out.append(_acc(ld.buffer.data, False, idx, local, self.threads))
        return out

    def _narrowed_by(self, cond: Expr) -> tuple[int, int, int]:
        """The thread box under ``cond``: its conjuncts ``threadIdx.* < c`` (or ``<= c``) cut
        the box; any other conjunct leaves it as it is (a box too large is only less precise)."""
        box = list(self.threads)
        todo = [cond]
        while todo:
            c = todo.pop()
            if isinstance(c, And):
                todo += [c.a, c.b]
                continue
            if not isinstance(c, (LT, LE)) or not isinstance(c.b, IntImm):
                continue
            v = self._view(c.a)
            tag = self.thread_vars.get(v) if isinstance(v, Var) else None
            if tag is None or tag not in THREAD_TAGS:
                continue
            at = THREAD_TAGS.index(tag)
            box[at] = max(min(box[at], c.b.value + (1 if isinstance(c, LE) else 0)), 0)
        return (box[0], box[1], box[2])

    def _conflict(self, pending: Sequence[_Acc], accs: Sequence[_Acc],
                  extra: tuple[Var, ...] = ()) -> set[Var]:
        """The shared buffers on which an access of ``accs`` may race with one of ``pending``."""
        out: set[Var] = set()
        for a in pending:
            for b in accs:
                if a.buf is not b.buf or not (a.write or b.write) or a.buf in out:
                    continue
                if not self.prover.same_thread(a, b, extra):
                    out.add(a.buf)
        return out

    def _barrier(self, why: set[Var]) -> Stmt:
        if self.divergent:
            names = ", ".join(sorted(self.shared[v].name for v in why))
            raise LoweringError(
                f"threads exchange data through shared buffer {names} where not every thread of "
                f"the block arrives ({self.divergent[-1]}), so no barrier can go there; compute "
                "the shared stage at a loop outside that condition / thread loop")
        return barrier()

    # statements ------------------------------------------------------------------------------
    def visit(self, s: Stmt) -> tuple[Stmt, _Summary]:
        if isinstance(s, SeqStmt):
            return self.visit_seq(s.seq, s)
        if isinstance(s, For):
            return self.visit_For(s)
        if isinstance(s, IfThenElse):
            return self.visit_IfThenElse(s)
        if isinstance(s, BufferStore):
            accs = self._reads([s.value, *s.indices, s.predicate])
            if s.buffer.data in self.vars:
                idx, local = self._index(s.indices)
                accs.append(_acc(s.buffer.data, True, idx, local, self.threads))
            accs = _merge(accs, [])
            return s, _Summary(accs, False, accs)
        if isinstance(s, Evaluate):
            if is_barrier(s):
                return s, _Summary([], True, [])
            accs = _merge(self._reads([s.value]), [])
            return s, _Summary(accs, False, accs)
        if isinstance(s, Allocate):
            body, summ = self.visit(s.body)
            return (s if body is s.body else Allocate(s.buffer, body)), summ
        if isinstance(s, AttrStmt):
            body, summ = self.visit(s.body)
            return (s if body is s.body else AttrStmt(s.key, s.value, body)), summ
        if isinstance(s, LetStmt):
            reads = self._reads([s.value])
            self.subst[s.var] = self._view(s.value)
            try:
                body, summ = self.visit(s.body)
            finally:
                del self.subst[s.var]
            summ = _Summary(_merge(reads, summ.head), summ.sync,
                            summ.tail if summ.sync else _merge(reads, summ.head))
            return (s if body is s.body else LetStmt(s.var, s.value, body)), summ
        return s, _EMPTY

    def visit_seq(self, items: Sequence[Stmt], orig: Stmt | None) -> tuple[Stmt, _Summary]:
        out: list[Stmt] = []
        head: list[_Acc] = []
        pending: list[_Acc] = []  # accesses since the last barrier
        synced = False
        changed = False
        for x in items:
            nx, xs = self.visit(x)
            changed |= nx is not x
            if is_barrier(nx):
                synced, pending = True, []
                out.append(nx)
                continue
            why = self._conflict(pending, xs.head)
            if why:
                out.append(self._barrier(why))
                changed = True
                synced, pending = True, []
            if not synced:
                head = _merge(head, xs.head)
            if xs.sync:
                synced, pending = True, list(xs.tail)
            else:
                pending = _merge(pending, xs.head)
            out.append(nx)
        new = orig if not changed and orig is not None else seq(*out)
        return new, _Summary(head, synced, pending if synced else head)

    def visit_For(self, s: For) -> tuple[Stmt, _Summary]:
        tag = thread_tag(s)
        if tag is not None:
            return self._thread_loop(s, tag)
        mn, ext = self._view(s.min), self._view(s.extent)
        narrowed = self._varying(ext)
        if narrowed:
            self.divergent.append(f"loop '{s.var.name}' runs a thread-dependent number of times")
        # the variable the accesses see: a fresh one per loop (a variable object may stand for
        # several loops after unrolling or partitioning, with other ranges)
        prev = self.subst.get(s.var)
        var = Var(s.var.name, s.var.dtype)
        self.subst[s.var] = var
        self._set_range(var, mn, ext)
        if self._varying(mn):
            self.per_thread.add(var)
        bounds = self._reads([s.min, s.extent])
        try:
            body, bs = self.visit(s.body)
            body, bs = self._loop_carried(body, bs, var)
        finally:
            if prev is None:
                self.subst.pop(s.var, None)
            else:
                self.subst[s.var] = prev
            if narrowed:
                self.divergent.pop()

        def up(accs: list[_Acc]) -> list[_Acc]:
            return _merge((x if x.index is None or var not in free_vars(x.index)
                           else _acc(x.buf, x.write, x.index, (*x.local, var), x.threads)
                           for x in accs), [])

        # a barrier in the body orders what is around the loop only if the loop runs
        runs = bs.sync and Simplifier(self.ranges).prove(GE(ext, const(1, ext.dtype)))
        if runs:
            summ = _Summary(_merge(bounds, up(bs.head)), True, up(bs.tail))
        else:
            every = _merge(bounds, up(bs.all()))
            summ = _Summary(every, False, every)
        new = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        return new, summ

    def _thread_loop(self, s: For, tag: str) -> tuple[Stmt, _Summary]:
        full = self.launch.get(tag)
        key = (tag, s.var.dtype)
        cv = self.canon.get(key)
        if cv is None:
            cv = self.canon[key] = Var(tag, s.var.dtype)
            if full is not None:
                self.ranges[cv] = (const(0, cv.dtype), full)
            if tag.startswith("threadIdx"):
                self.thread_vars[cv] = tag
        prev = self.subst.get(s.var)
        self.subst[s.var] = cv
        narrowed = tag.startswith("threadIdx") and str(full if full is not None else 1) != str(s.extent)
        if narrowed:
            self.divergent.append(f"loop '{s.var.name}' bound to {tag} covers {s.extent} of "
                                  f"{full} threads")
        outer = self.threads
        if tag in THREAD_TAGS and isinstance(s.extent, IntImm):
            at = THREAD_TAGS.index(tag)
            self.threads = tuple(min(e, s.extent.value) if i == at else e  # type: ignore[assignment]
                                 for i, e in enumerate(outer))
        try:
            body, summ = self.visit(s.body)
        finally:
            self.threads = outer
            if narrowed:
                self.divergent.pop()
            if prev is None:
                del self.subst[s.var]
            else:
                self.subst[s.var] = prev
        new = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        return new, summ

    def _loop_carried(self, body: Stmt, bs: _Summary, var: Var) -> tuple[Stmt, _Summary]:
        """A barrier at the end of a serial loop's body whose last accesses (after its last
        barrier) may race with the first ones (before its first barrier) of the next iteration."""
        why = self._conflict(bs.tail, bs.head, (var,))
        if not why:
            return body, bs
        items: Sequence[Stmt] = body.seq if isinstance(body, SeqStmt) else (body,)
        new = seq(*items, self._barrier(why))
        return new, _Summary(bs.head, True, [])

    def visit_IfThenElse(self, s: IfThenElse) -> tuple[Stmt, _Summary]:
        dep = self._thread_dependent(s.cond)
        reads = self._reads([s.cond])
        if dep:
            self.divergent.append(f"the condition {s.cond}")
        outer = self.threads
        try:
            # the then branch runs only on the threads the condition keeps: a guard
            # ``threadIdx.x < 20`` of a 26-thread loop makes ``S[ty * 20 + tx]`` one element per
            # thread there, so a shared stage's own reduce loop needs no barrier inside it
            self.threads = self._narrowed_by(s.cond)
            try:
                t, ts = self.visit(s.then_case)
            finally:
                self.threads = outer
            if s.else_case is not None:
                f, fs = self.visit(s.else_case)
            else:
                f, fs = None, _EMPTY
        finally:
            if dep:
                self.divergent.pop()
        if ts.sync and fs.sync:
            summ = _Summary(_merge(reads, _merge(ts.head, fs.head)), True, _merge(ts.tail, fs.tail))
        else:
            every = _merge(reads, _merge(ts.all(), fs.all()))
            summ = _Summary(every, False, every)
        new = s if t is s.then_case and f is s.else_case else IfThenElse(s.cond, t, f)
        return new, summ


def thread_sync(func: PrimFunc) -> PrimFunc:
    """Insert the barriers a GPU kernel's shared-memory traffic needs (no-op on CPU code)."""
    finder = _Shared()
    finder.visit_stmt(func.body)
    if not finder.bufs:
        return func
    launch = dict(func.attrs.get("launch") or {})
    body, _ = ThreadSync(finder.bufs, launch).visit(func.body)
    if body is func.body:
        return func
    return PrimFunc(func.name, func.params, body, func.dim_vars, dict(func.attrs))


__all__ = ["thread_sync"]
