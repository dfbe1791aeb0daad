"""Insert block barriers where threads communicate through shared memory (TVM's thread sync).

A thread may read a shared element another thread wrote only after a barrier between the two,
and may overwrite one another thread still has to read only after a barrier too. The pass
works on each statement sequence inside the kernel's thread loops (a stage computed at a loop
puts its nest and its consumer's body side by side in such a sequence):

* before a statement that reads or writes a shared buffer written earlier in the sequence
  since the last barrier (read-after-write, write-after-write), a barrier goes in;
* in a loop whose body writes a shared buffer and reads it afterwards, the next iteration's
  writes race with this iteration's reads (write-after-read), so a barrier also goes at the
  end of the body, unless the reads are already followed by one.

It is conservative: it does not prove that a thread only touches its own elements, so a
shared buffer used that way still gets barriers (correct, a little slower). A barrier can only
go where every thread of the block arrives; a place under a thread-dependent condition or in
a thread loop narrower than the block is a `LoweringError` naming the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import LoweringError
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Var
from ..ir.functor import StmtMutator, StmtVisitor, free_vars
from ..ir.stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    barrier,
    is_barrier,
    seq,
    thread_tag,
)


class _Access(StmtVisitor):
    """Shared buffers a statement reads and writes (anywhere inside it)."""

    def __init__(self, shared: set[Var]) -> None:
        self.shared = shared
        self.reads: set[Var] = set()
        self.writes: set[Var] = set()
        self.has_barrier = False

    def visit_BufferStore(self, s: BufferStore) -> None:
        if s.buffer.data in self.shared:
            self.writes.add(s.buffer.data)
        super().visit_BufferStore(s)

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        if e.buffer.data in self.shared:
            self.reads.add(e.buffer.data)
        super().visit_BufferLoad(e)

    def visit_Evaluate(self, s: Evaluate) -> None:
        if is_barrier(s):
            self.has_barrier = True
        super().visit_Evaluate(s)


def _access(s: Stmt, shared: set[Var]) -> _Access:
    a = _Access(shared)
    a.visit_stmt(s)
    return a


class _Shared(StmtVisitor):
    def __init__(self) -> None:
        self.bufs: dict[Var, Buffer] = {}

    def visit_Allocate(self, s: Allocate) -> None:
        if s.buffer.scope == "shared":
            self.bufs[s.buffer.data] = s.buffer
        super().visit_Allocate(s)


class ThreadSync(StmtMutator):
    def __init__(self, shared: dict[Var, Buffer], launch: dict[str, object]) -> None:
        self.shared = shared
        self.vars = set(shared)
        self.launch = launch
        self.thread_vars: set[Var] = set()
        self.divergent: list[str] = []  # why the current point is not reached by all threads

    # where a barrier may go ------------------------------------------------------------------
    def visit_For(self, s: For) -> Stmt:
        tag = thread_tag(s)
        narrowed = False
        if tag is not None:
            self.thread_vars.add(s.var)
            full = self.launch.get(tag)
            narrowed = tag.startswith("threadIdx") and str(full) != str(s.extent)
            if narrowed:
                self.divergent.append(f"loop '{s.var.name}' bound to {tag} covers {s.extent} of "
                                      f"{full} threads")
        elif free_vars(s.extent) & self.thread_vars:
            narrowed = True
            self.divergent.append(f"loop '{s.var.name}' runs a thread-dependent number of times")
        try:
            body = self.visit_stmt(s.body)
            if tag is None and s.kind != ForKind.THREAD_BINDING:
                body = self._loop_carried(s, body)
        finally:
            if narrowed:
                self.divergent.pop()
        return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        dep = bool(free_vars(s.cond) & self.thread_vars)
        if dep:
            self.divergent.append(f"the condition {s.cond}")
        try:
            return super().visit_IfThenElse(s)
        finally:
            if dep:
                self.divergent.pop()

    # the two rules ---------------------------------------------------------------------------
    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        items = [self.visit_stmt(x) for x in s.seq]
        out: list[Stmt] = []
        dirty: set[Var] = set()  # shared buffers written since the last barrier
        for x in items:
            if is_barrier(x):
                dirty.clear()
                out.append(x)
                continue
            a = _access(x, self.vars)
            if dirty & (a.reads | a.writes):
                out.append(self._barrier(dirty & (a.reads | a.writes)))
                dirty.clear()
            if a.has_barrier:
                dirty.clear()  # a barrier inside x (at its end, at worst) orders what follows
            dirty |= a.writes
            out.append(x)
        if len(out) == len(s.seq) and all(o is i for o, i in zip(out, s.seq)):
            return s
        return seq(*out)

    def _loop_carried(self, loop: For, body: Stmt) -> Stmt:
        """A barrier at the end of a serial loop's body whose later reads of a shared buffer
        race with the writes of the next iteration."""
        items: Sequence[Stmt] = body.seq if isinstance(body, SeqStmt) else (body,)
        written = set().union(*(_access(x, self.vars).writes for x in items))
        if not written:
            return body
        # reads of a written buffer after the last barrier of the body
        pending: set[Var] = set()
        for x in items:
            if is_barrier(x):
                pending.clear()
                continue
            a = _access(x, self.vars)
            pending |= a.reads & written
        if not pending:
            return body
        return seq(*items, self._barrier(pending))

    def _barrier(self, why: set[Var]) -> Stmt:
        if self.divergent:
            names = ", ".join(sorted(self.shared[v].name for v in why))
            raise LoweringError(
                f"threads exchange data through shared buffer {names} where not every thread of "
                f"the block arrives ({self.divergent[-1]}), so no barrier can go there; compute "
                "the shared stage at a loop outside that condition / thread loop")
        return barrier()


def thread_sync(func: PrimFunc) -> PrimFunc:
    """Insert the barriers a GPU kernel's shared-memory traffic needs (no-op on CPU code)."""
    finder = _Shared()
    finder.visit_stmt(func.body)
    if not finder.bufs:
        return func
    launch = {k: v for k, v in (func.attrs.get("launch") or {}).items()}
    body = ThreadSync(finder.bufs, launch).visit_stmt(func.body)
    if body is func.body:
        return func
    return PrimFunc(func.name, func.params, body, func.dim_vars, dict(func.attrs))


__all__ = ["thread_sync"]
