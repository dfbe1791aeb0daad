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
can touch a common element only from the same thread (`Prover`): a thread reading back its
own writes (a shared stage's init and reduce loops, ``S[tx] = S[tx] + ...``) needs no barrier,
which TVM decides by comparing the two index expressions; here the indices are compared as
linear forms over thread terms, loop terms and uniform terms, and what cannot be proven keeps
the barrier (the emulator's race detector is the referee). A vector access is analysed lane by
lane (its index and mask as functions of a lane variable), and each access carries the
conditions it is made under, the enclosing branches' and its own mask's: where the linear proof
fails, the prover enumerates the points of both accesses and leaves out those whose conditions
are false, so a guarded-off thread or a masked-off lane touches nothing
(`thread_sync_prover.py`).

A barrier can only go where every thread of the block arrives; a place under a condition that
depends on threadIdx, in a loop whose trip count does, or in a thread loop narrower than the
block is a `LoweringError` naming the buffer. blockIdx and the symbolic sizes are the same for
every thread of a block, so conditions and trip counts over them are uniform.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..arith.interval import const_bounds
from ..arith.simplify import Simplifier
from ..errors import LoweringError
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import (
    GE,
    LE,
    LT,
    And,
    BufferLoad,
    Expr,
    IntImm,
    Not,
    Var,
    const,
)
from ..ir.functor import ExprVisitor, StmtVisitor, free_vars, substitute
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
from .thread_sync_prover import THREAD_TAGS, Acc, Prover, conjuncts, lanewise, make_acc


@dataclass
class _Summary:
    """What a statement exposes to the statements around it (see the module docstring)."""

    head: list[Acc]
    sync: bool  # every thread passes a barrier inside it (then `tail` follows the last one)
    tail: list[Acc]

    def all(self) -> list[Acc]:
        return self.head if not self.sync else _merge(self.head, self.tail)


_EMPTY = _Summary([], False, [])


def _merge(a: Iterable[Acc], b: Iterable[Acc]) -> list[Acc]:
    out: dict[str, Acc] = {}
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
        self.prover = Prover(self.thread_vars, self.per_thread, self.ranges)
        # the conditions of the enclosing IfThenElse branches (analysis view, ``not c`` in an
        # else branch): every access below them is made only where they hold
        self.guards: list[Expr] = []
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

    def _access(self, buf: Var, write: bool, indices: Sequence[Expr], predicate: Expr | None
                ) -> Acc:
        """The analysed access: a flat scalar index, a vector access's lanes as one more loop
        (its index and mask taken lane by lane), and the enclosing guards with its own mask as
        predicates, so that the prover leaves masked-off lanes out (fuzzer finding L: a fused
        index that is one element per thread only where the vector store's mask holds)."""
        lanes = max([dt.lanes(i.dtype) for i in indices] +
                    [dt.lanes(predicate.dtype) if predicate is not None else 1])
        local: tuple[Var, ...] = ()
        lane: Var | None = None
        if lanes > 1:
            lane = Var("lane", "int32")
            self.ranges[lane] = (const(0, "int32"), const(lanes, "int32"))
            local = (lane,)
        idx: Expr | None = None
        if len(indices) == 1:
            idx = self._view(indices[0])
            if lane is not None:
                idx = lanewise(idx, lane)
            if idx is not None and (not dt.is_int(idx.dtype) or dt.lanes(idx.dtype) != 1):
                idx = None
        pred = list(self.guards)
        if predicate is not None:
            own = self._view(predicate)
            own_lane = lanewise(own, lane) if lane is not None else own
            if own_lane is not None:  # otherwise every lane is assumed live
                pred += conjuncts(own_lane)
        return make_acc(buf, write, idx, local, self.threads,
                        tuple(c for c in pred if dt.lanes(c.dtype) == 1))

    def _reads(self, exprs: Iterable[Expr | None]) -> list[Acc]:
        out: list[Acc] = []
        for e in exprs:
            if e is None:
                continue
            v = _Loads(self.vars)
            v.visit(e)
            for ld in v.found:
                out.append(self._access(ld.buffer.data, False, ld.indices, ld.predicate))
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

    def _conflict(self, pending: Sequence[Acc], accs: Sequence[Acc],
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
                accs.append(self._access(s.buffer.data, True, s.indices, s.predicate))
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
        head: list[Acc] = []
        pending: list[Acc] = []  # accesses since the last barrier
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

        def up(accs: list[Acc]) -> list[Acc]:
            return _merge((make_acc(x.buf, x.write, x.index, (*x.local, var), x.threads, x.pred)
                           if _uses(x, var) else x for x in accs), [])

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
            cond = self._view(s.cond)
            self.guards.append(cond)
            try:
                t, ts = self.visit(s.then_case)
            finally:
                self.threads = outer
                self.guards.pop()
            if s.else_case is not None:
                self.guards.append(Not(cond))
                try:
                    f, fs = self.visit(s.else_case)
                finally:
                    self.guards.pop()
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


def _uses(x: Acc, var: Var) -> bool:
    """Does the access's index or one of its predicates depend on ``var``?"""
    return (x.index is not None and var in free_vars(x.index)) or any(
        var in free_vars(c) for c in x.pred)


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
