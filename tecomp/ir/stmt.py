"""Statement nodes of the loop-nest IR."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .buffer import Buffer
from .expr import Expr, Var


class ForKind(enum.Enum):
    SERIAL = "for"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    # GPU: the loop variable is the hardware index named by the ``thread_tag`` annotation
    # ("blockIdx.x", "threadIdx.y", ...); see `thread_tag`
    THREAD_BINDING = "thread_binding"


class Stmt:
    __slots__ = ()

    def __str__(self) -> str:
        from .printer import stmt_str

        return stmt_str(self)

    __repr__ = __str__


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class For(Stmt):
    """``for var in [min, min + extent)``; ``annotations`` carries pragmas (e.g. auto-unroll)."""

    var: Var
    min: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    annotations: tuple[tuple[str, Any], ...] = ()

    def annotation(self, key: str, default: Any = None) -> Any:
        for k, v in self.annotations:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class BufferStore(Stmt):
    buffer: Buffer
    value: Expr
    indices: tuple[Expr, ...]
    predicate: Expr | None = None


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class SeqStmt(Stmt):
    seq: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class IfThenElse(Stmt):
    cond: Expr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Allocate(Stmt):
    """Storage for ``buffer`` live while ``body`` runs."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class LetStmt(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Evaluate(Stmt):
    """Evaluate an expression for its side effect (extern calls, prefetch)."""

    value: Expr


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class AttrStmt(Stmt):
    """A key/value hint on a region (e.g. ``storage_alias`` used by storage rewrite)."""

    key: str
    value: Any
    body: Stmt


@dataclass(eq=False)
class PrimFunc:
    """A kernel: ordered parameters (buffers and symbolic dims) and a body."""

    name: str
    params: list[Buffer]
    body: Stmt
    dim_vars: list[Var] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        from .printer import func_str

        return func_str(self)

    __repr__ = __str__


THREAD_TAG = "thread_tag"
BARRIER = "syncthreads"
# AttrStmt key: the body is the producer of a shared buffer (``value``: its data Var) marked
# ``double_buffer()``; passes/inject_double_buffer.py rewrites the enclosing loop and drops it
DOUBLE_BUFFER_SCOPE = "double_buffer_scope"
# AttrStmt key: the body is the producer of a shared buffer marked ``pipeline(depth)``; ``value``
# is ``(data Var, depth)``. passes/inject_software_pipeline.py rewrites the enclosing loop into a
# ring of ``depth`` tiles loaded with cp.async and drops it
ASYNC_PIPELINE_SCOPE = "async_pipeline_scope"
# AttrStmt key (value 1): in the body, a BufferStore into shared memory whose value is a plain
# load of a global buffer of the same dtype, 4, 8 or 16 bytes per thread, is a ``cp.async``
# (asynchronous copy; its destination is undefined until the group holding it is waited for);
# other stores in the body are ordinary ones. See docs/gpu-ir.md, "Software pipelining".
ASYNC_COPY_SCOPE = "async_copy_scope"
# Evaluate(Call("int32", CP_ASYNC_COMMIT, ())): close this thread's open cp.async group
CP_ASYNC_COMMIT = "cp_async_commit_group"
# Evaluate(Call("int32", CP_ASYNC_WAIT, (IntImm n,))): wait until at most n of this thread's
# committed groups are still in flight (PTX cp.async.wait_group n)
CP_ASYNC_WAIT = "cp_async_wait_group"


def thread_tag(s: For) -> str | None:
    """The GPU index a THREAD_BINDING loop stands for ("blockIdx.x", "threadIdx.x", ...).

    Such a loop does not iterate: its variable *is* that index, and the launch gives the tag
    one extent per kernel. A loop whose extent is smaller than the launch extent runs its
    body only where ``var < extent``; loops of one tag may nest (a stage computed inside a
    consumer's thread loop, bound to the same thread) and then all name the same index.
    """
    if s.kind is not ForKind.THREAD_BINDING:
        return None
    return str(s.annotation(THREAD_TAG))


def barrier() -> Evaluate:
    """A block-wide barrier (``__syncthreads()``): every thread of the block reaches it before
    any goes on, and shared-memory writes before it are visible to reads after it."""
    from .expr import Call

    return Evaluate(Call("int32", BARRIER, ()))


def is_barrier(s: Stmt) -> bool:
    from .expr import Call

    return isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name == BARRIER


def seq(*stmts: Stmt | None) -> Stmt:
    """A SeqStmt with nested sequences flattened and Nones dropped."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            out.extend(s.seq)
        else:
            out.append(s)
    if len(out) == 1:
        return out[0]
    return SeqStmt(tuple(out))
