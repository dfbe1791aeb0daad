"""The IR: expressions, statements, buffers, visitors and the printer."""

from . import dtype
from .buffer import Buffer
from .expr import *  # noqa: F403
from .expr import Expr, Var, const
from .functor import (
    ExprMutator,
    ExprVisitor,
    StmtMutator,
    StmtVisitor,
    free_vars,
    post_order_visit,
    substitute,
)
from .stmt import (
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)
from .structural import structural_equal, structural_hash

__all__ = [
    "Allocate", "AttrStmt", "Buffer", "BufferStore", "Evaluate", "Expr", "ExprMutator",
    "ExprVisitor", "For", "ForKind", "IfThenElse", "LetStmt", "PrimFunc", "SeqStmt", "Stmt",
    "StmtMutator", "StmtVisitor", "Var", "const", "dtype", "free_vars", "post_order_visit",
    "seq", "structural_equal", "structural_hash", "substitute",
]
