"""Tensor expressions: declare computations and schedule them (classic TVM ``te`` names)."""

from ..ir.expr import Expr, Var
from .intrin import (
    abs,
    all,
    any,
    call_extern,
    ceil,
    cos,
    erf,
    exp,
    exp2,
    floor,
    if_then_else,
    log,
    log2,
    log10,
    logical_not,
    max_value,
    min_value,
    pow,
    power,
    round,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
    trunc,
)
from .reduction import CommReducer, comm_reducer, max, min, prod, sum
from .schedule import Schedule, Stage, create_schedule
from .tensor import (
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Range,
    Tensor,
    compute,
    placeholder,
    reduce_axis,
    size_var,
    thread_axis,
    var,
)
from .tensor_intrin import TensorIntrin, decl_tensor_intrin

__all__ = [
    "CommReducer", "ComputeOp", "Expr", "IterVar", "Operation", "PlaceholderOp", "Range",
    "Schedule", "Stage", "Tensor", "TensorIntrin", "Var", "abs", "all", "any", "call_extern",
    "ceil", "comm_reducer", "compute", "cos", "create_schedule", "decl_tensor_intrin", "erf",
    "exp", "exp2", "floor", "if_then_else", "log", "log2", "log10", "logical_not", "max",
    "max_value", "min", "min_value", "placeholder", "pow", "power", "prod", "reduce_axis",
    "round", "rsqrt", "sigmoid", "sin", "size_var", "sqrt", "sum", "tanh", "thread_axis",
    "trunc", "var",
]
