"""The same-thread proof of thread_sync (`thread_sync.py`): can two shared-memory accesses touch
one element from two different threads of a block?

An access (`Acc`) is a flat scalar index over canonical threadIdx variables, loop variables and
uniform ones, with the box of threads that make it and a predicate: the conjunction of the
enclosing guards and the access's own mask (a vector access's predicate taken lane by lane),
so that masked-off lanes touch nothing. `Prover.same_thread` first tries a linear proof over
the indices alone (sound without the predicates: it only ever sees more accesses than happen);
where that fails it enumerates the points of both accesses with their predicates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..arith.evaluate import evaluate
from ..arith.interval import const_bounds
from ..arith.simplify import Simplifier
from ..errors import TecompError
from ..ir import dtype as dt
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
)
from ..ir.functor import ExprVisitor, free_vars, substitute
from ..ir.printer import expr_str

THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True, eq=False)
class Acc:
    """One shared-memory access: ``index`` is the flat scalar element offset with thread loop
    variables replaced by one canonical variable per threadIdx tag (None: not understood, it
    conflicts with every access of the buffer); ``local`` are the loops inside the summarised
    statement it sits in, whose values differ from one access to another (two threads need not
    be in the same iteration of a loop without a barrier); ``threads`` bounds the threadIdx
    values (x, y, z) of the threads that run it (thread loops narrower than the block);
    ``pred`` are conditions over the same variables that all hold where the access is made
    (enclosing guards, the access's own mask lane by lane): a point where one is false touches
    nothing."""

    buf: Var
    write: bool
    index: Expr | None
    local: tuple[Var, ...]
    threads: tuple[int, int, int]  # the threads that can make it: threadIdx < these extents
    key: str
    pred: tuple[Expr, ...] = ()


def _text(e: Expr) -> str:
    # printed forms are not unique (loops of one name): the key also has the variables' ids
    return expr_str(e) + "|" + ",".join(sorted(str(id(v)) for v in free_vars(e)))


def make_acc(buf: Var, write: bool, index: Expr | None, local: tuple[Var, ...],
             threads: tuple[int, int, int], pred: tuple[Expr, ...] = ()) -> Acc:
    text = "?" if index is None else _text(index)
    conds = "&".join(_text(c) for c in pred)
    key = f"{id(buf)}|{int(write)}|{text}|{','.join(str(id(v)) for v in local)}|{threads}|{conds}"
    return Acc(buf, write, index, local, threads, key, pred)


def conjuncts(cond: Expr) -> list[Expr]:
    """The terms of a conjunction (``a && b && c`` -> [a, b, c])."""
    out, todo = [], [cond]
    while todo:
        c = todo.pop()
        if isinstance(c, And):
            todo += [c.b, c.a]
        else:
            out.append(c)
    return out


def lanewise(e: Expr, lane: Var) -> Expr | None:
    """The scalar value of lane ``lane`` of the vector expression ``e`` (a scalar one is its own
    value in every lane); None where that is not expressible here (a vector load, a shuffle):
    callers then know nothing about the lanes, never something wrong."""
    if dt.lanes(e.dtype) == 1:
        return e
    if isinstance(e, Ramp):
        if dt.lanes(e.base.dtype) != 1:
            return None
        return e.base + e.stride * Cast(e.base.dtype, lane) if lane.dtype != e.base.dtype \
            else e.base + e.stride * lane
    if isinstance(e, Broadcast):
        return e.value if dt.lanes(e.value.dtype) == 1 else None
    if isinstance(e, (BinaryOp, CmpOp, And, Or)):
        a, b = lanewise(e.a, lane), lanewise(e.b, lane)
        return None if a is None or b is None else type(e)(a, b)
    if isinstance(e, Not):
        a = lanewise(e.a, lane)
        return None if a is None else Not(a)
    if isinstance(e, Select):
        c, t, f = lanewise(e.cond, lane), lanewise(e.t, lane), lanewise(e.f, lane)
        return None if c is None or t is None or f is None else Select(c, t, f)
    if isinstance(e, Cast):
        v = lanewise(e.value, lane)
        return None if v is None else Cast(dt.element(e.dtype), v)
    return None


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


class Prover:
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
    Loads in an index are not understood: not proven. This proof ignores the accesses'
    predicates (it sees more accesses than are made, so what it proves holds); the enumeration
    (`_enumerated`) is where they leave masked-off points out.
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

    def same_thread(self, a: Acc, b: Acc, extra: tuple[Var, ...] = ()) -> bool:
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

    def _side(self, acc: Acc, extra: tuple[Var, ...], tag: str) -> tuple[dict[int, tuple[Expr, int, str]], int]:
        """The index as ``{term key: (term, coef, kind)}`` and a constant; kind is "thread",
        "uniform" or "other" (see the class docstring). Keys are the terms with the side's
        copies of loop variables mapped back, so one loop term has one key on both sides."""
        assert acc.index is not None
        ren = self._renaming(acc, extra, tag)
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

    def _renaming(self, acc: Acc, extra: tuple[Var, ...], tag: str) -> dict[Var, Expr]:
        """The side's copies of the variables whose value differs between the two accesses:
        their local loops, ``extra`` and per-thread loop variables (in the index or a
        predicate)."""
        used = free_vars(acc.index) if acc.index is not None else set()
        for c in acc.pred:
            used |= free_vars(c)
        local = set(acc.local) | set(extra) | (used & self.per_thread)
        return {v: self._copy(v, tag) for v in local}

    def _conds(self, acc: Acc, extra: tuple[Var, ...], tag: str) -> list[Expr]:
        """The access's predicates with the side's copies of its variables (impure ones, which
        no enumeration can evaluate, left out: the access is then assumed made there)."""
        ren = self._renaming(acc, extra, tag)
        return [substitute(c, ren) if ren else c for c in acc.pred if not _impure(c)]

    def _copy(self, v: Var, tag: str) -> Var:
        """One fixed copy of a loop variable per side, with the loop's range."""
        key = (v, tag)
        c = self._copies.get(key)
        if c is None:
            c = self._copies[key] = Var(f"{v.name}'{tag}", v.dtype)
            if v in self.ranges:
                self.ranges[c] = self.ranges[v]
        return c

    def _prove(self, a: Acc, b: Acc, extra: tuple[Var, ...]) -> bool:
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

    def _enumerated(self, a: Acc, b: Acc, extra: tuple[Var, ...]) -> bool:
        """The fallback for terms the linear proof does not take apart (``(fo*2 + tx) // 3 % 12``
        with a loop ``fo``): every value of the variables left once equal uniform terms cancel,
        where all of them have constant ranges and there are at most `ENUM_LIMIT` points a side.
        Variables of both sides (uniform) take one value at a time; the two sides' loop copies
        and threads take all of theirs. A side's points are those of the threads in its own box
        where its predicates hold (their variables enumerated too, while the budget allows). Not
        proven when some element is touched on the two sides by different threads."""
        sa, ka = self._side(a, extra, "a")
        sb, kb = self._side(b, extra, "b")

        def rest(mine: dict[int, tuple[Expr, int, str]], other: dict[int, tuple[Expr, int, str]],
                 k: int) -> Expr:
            keep = [(t, c) for key, (t, c, kind) in mine.items()
                    if not (kind == "uniform" and key in other and other[key][1] == c)]
            return self.simp.rebuild(keep, k, "int64")

        ea, eb = rest(sa, sb, ka), rest(sb, sa, kb)
        fa, fb = free_vars(ea), free_vars(eb)
        ax = set(self.thread_vars)
        copies = set(self._copies.values())
        common = [v for v in (fa | fb) - ax if v not in copies]
        la = [v for v in fa - ax if v in copies]
        lb = [v for v in fb - ax if v in copies]
        dom: dict[Var, np.ndarray] = {}
        for v in [*common, *la, *lb]:
            lo, hi = self._bound(v)
            if lo is None or hi is None or hi - lo + 1 > ENUM_LIMIT:
                return False
            dom[v] = np.arange(lo, hi + 1, dtype=np.int64)
        n_t = len(self.grid)

        def size() -> int:
            return math.prod(len(dom[v]) for v in common) * n_t * max(
                math.prod(len(dom[v]) for v in la), math.prod(len(dom[v]) for v in lb))

        if size() > ENUM_LIMIT:
            return False
        # the predicates whose variables can be enumerated too, within the budget (one left
        # out makes the side's set of points larger: never a wrong proof, only a weaker one)
        ca: list[Expr] = []
        cb: list[Expr] = []
        for cond, mine, keep in [*((c, la, ca) for c in self._conds(a, extra, "a")),
                                 *((c, lb, cb) for c in self._conds(b, extra, "b"))]:
            new = [v for v in free_vars(cond) - ax if v not in dom]
            grown: dict[Var, np.ndarray] = {}
            for v in new:
                lo, hi = self._bound(v)
                if lo is None or hi is None or hi - lo + 1 > ENUM_LIMIT:
                    break
                grown[v] = np.arange(lo, hi + 1, dtype=np.int64)
            else:
                dom.update(grown)
                added_c = [v for v in new if v not in copies]
                added_l = [v for v in new if v in copies]
                common += added_c
                mine += added_l
                if size() <= ENUM_LIMIT:
                    keep.append(cond)
                    continue
                del common[len(common) - len(added_c):]
                del mine[len(mine) - len(added_l):]
                for v in new:
                    del dom[v]
        n_c = math.prod(len(dom[v]) for v in common)
        threads = np.array(self.grid, dtype=np.int64).reshape(n_t, 3)

        def points(e: Expr, local: list[Var], conds: list[Expr], box: tuple[int, int, int]
                   ) -> tuple[np.ndarray, np.ndarray]:
            """(common-point index * span + element, thread index) of every access on a side:
            the points its thread box and predicates keep."""
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
            inside = np.all(threads < np.array(box, np.int64), axis=1)
            made = np.broadcast_to(inside.reshape(1, n_t, 1), elem.shape)
            for cond in conds:
                made = made & np.broadcast_to(_np_eval(cond, env) != 0, full).reshape(elem.shape)
            made = made.ravel()
            return np.stack([ci.ravel()[made], elem.ravel()[made]]), ti.ravel()[made]

        pa, ta = points(ea, la, ca, a.threads)
        pb, tb = points(eb, lb, cb, b.threads)
        if not len(ta) or not len(tb):
            return True  # one of them touches nothing
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
