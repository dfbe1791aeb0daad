"""Binding the arguments of an interpreted function: the arrays checked against the buffers
(dtype, rank, shape, strides), symbolic dims unified across arguments, scalar parameters
type-checked. Used by `interp.run`; split from it to keep that module to the closure compiler.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from .args import ParamSpec, check_scalar

Env = dict[Any, Any]


class Pointer(NamedTuple):
    """A handle into a buffer's flat storage: what extern callables receive for a pointer.

    ``array`` is the 1-D storage (writes through it reach the caller's array) and ``offset``
    the element index the pointer designates, so ``p.array[p.offset:]`` is the C view.
    """

    array: np.ndarray
    offset: int = 0


def bind_args(func: S.PrimFunc, args: Sequence[Any], evaluate: Callable[[E.Expr, Env], Any],
              ) -> tuple[Env, list[tuple[np.ndarray, np.ndarray]]]:
    """Check the arrays against the buffers, bind symbolic dims, build the initial env.

    A function with scalar parameters (``attrs["scalar_params"]``: te.vars in the argument
    list) takes them at their places among the arrays, as a compiled kernel does."""
    scalars: list[tuple[E.Var, Any]] = []
    spos = func.attrs.get("scalar_params")
    if spos:
        nuser = len(func.params) + len(spos)
        if len(args) < nuser:
            raise TypeError(f"{func.name} takes {nuser} arguments (arrays and scalars), got "
                            f"{len(args)}")
        at = {p for p, _ in spos}
        scalars = [(v, args[p]) for p, v in spos]
        args = [x for k, x in enumerate(args[:nuser]) if k not in at] + list(args[nuser:])
    nparam, ndim = len(func.params), len(func.dim_vars)
    if len(args) not in (nparam, nparam + ndim):
        raise TypeError(
            f"{func.name} takes {nparam} arrays (optionally followed by {ndim} dim values), "
            f"got {len(args)} arguments"
        )
    env: Env = {}
    for v, x in zip(func.dim_vars, args[nparam:], strict=False):
        env[v] = operator.index(x)  # TypeError for anything but an int
    deferred: list[tuple[E.Expr, int, str]] = []

    def unify(e: E.Expr, value: int, what: str) -> None:
        if isinstance(e, E.IntImm):
            if e.value != value:
                raise ValueError(f"{what} is {value}, expected {e.value}")
        elif isinstance(e, E.Var):
            prev = env.setdefault(e, value)
            if prev != value:
                raise ValueError(f"{what} is {value}, but {e.name} = {prev} from another argument")
        else:
            deferred.append((e, value, what))

    copy_back: list[tuple[np.ndarray, np.ndarray]] = []
    for k, (buf, arr) in enumerate(zip(func.params, args[:nparam], strict=False)):
        name = f"{func.name} argument {k} ({buf.name})"
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(arr).__name__}")
        el = dt.element(buf.dtype)
        if el == "bfloat16" and arr.dtype.name in ("bfloat16", "uint16"):
            arr = arr.view(np.uint16)  # computed from its bits: no ml_dtypes needed here
        elif arr.dtype.name != el:
            raise ValueError(f"{name}: dtype is {arr.dtype.name}, expected {buf.dtype}")
        if arr.ndim != buf.ndim:
            raise ValueError(f"{name}: has {arr.ndim} dims, expected {buf.ndim} {list(buf.shape)}")
        for axis, (e, n) in enumerate(zip(buf.shape, arr.shape, strict=True)):
            unify(e, n, f"{name} dim {axis}")
        if not buf.strides and not (arr.flags.c_contiguous and arr.dtype.isnative):
            # run on a compact native copy and write it back, like a C caller would have to
            work = np.ascontiguousarray(arr, arr.dtype.newbyteorder("="))
            copy_back.append((arr, work))
            arr = work
        if buf.strides:
            item = arr.itemsize
            for axis, (e, st) in enumerate(zip(buf.strides, arr.strides, strict=True)):
                if st % item or st < 0 or not arr.dtype.isnative:
                    why = ("is negative" if st < 0 else "is not a multiple of the item size "
                           f"({item})" if st % item else "is of a non-native byte order array")
                    raise ValueError(f"{name}: byte stride {st} of dim {axis} {why}; a strided "
                                     "argument needs non-negative strides in whole elements")
                if arr.shape[axis] <= 1 and not isinstance(e, E.Var):
                    continue  # never addresses anything (numpy's strides there are arbitrary)
                unify(e, st // item, f"{name} stride {axis} (elements)")
            span = 1 + sum((n - 1) * (st // item) for n, st in zip(arr.shape, arr.strides, strict=True))
            flat = np.lib.stride_tricks.as_strided(arr, (span if arr.size else 0,), (item,))
        else:
            flat = arr.reshape(-1)
        env[buf.data] = Pointer(flat, 0)
    for v, x in scalars:
        val = check_scalar(f"{func.name} scalar argument {v.name}",
                           ParamSpec(v.name, dt.element(v.dtype), (), scalar=True), x)
        if dt.is_float(v.dtype):
            val = dt.to_numpy(v.dtype).type(val)
        prev = env.setdefault(v, val)
        if prev != val:
            raise ValueError(f"{func.name} scalar argument {v.name} is {val}, but {v.name} = "
                             f"{prev} from the argument shapes")
    for e, value, what in deferred:
        try:
            got = evaluate(e, env)
        except TecompError as err:
            raise ValueError(f"{what}: cannot evaluate {e}: {err}") from None
        if got != value:
            raise ValueError(f"{what} is {value}, expected {e} = {got}")
    for v in func.dim_vars:
        if v not in env:
            raise ValueError(f"{func.name}: symbolic dim {v.name} appears in no argument shape")
    return env, copy_back
