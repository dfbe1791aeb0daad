"""Checking kernel arguments and turning them into C call arguments.

A compiled kernel is ``int32_t f(T* A, ..., int64_t n, ...)``: it trusts its caller completely,
so every check happens here, once per call, with errors that name the argument: wrong count,
dtype, rank, shape (constants and symbolic dims bound consistently across arguments),
non-contiguous memory, read-only or overlapping outputs. A parameter with ``strides`` (a
buffer bound with ``binds=`` to a strided ``decl_buffer``) takes a non-contiguous array: its
symbolic strides are dims (int64 arguments, after the shape dims) bound from the array's
strides in elements, its constant strides must match them.

This module must not import llvmlite: libraries loaded from disk reuse it. Parameter
descriptions (`ParamSpec`) are plain data so they can be stored in a JSON manifest.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.functor import StmtVisitor


def _data_ptr_by_interface(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _fast_data_ptr() -> Any:
    """The fastest correct way to read an array's data pointer here. ``__array_interface__``
    builds a dict of shape, strides and type on every call: ~3 us per array on a 2-core VM,
    most of a small kernel's ~8 us call. The pointer is the first field after the object
    header of numpy's C array struct (``PyArray_DATA``, which every compiled extension reads,
    so numpy keeps it there); CPython's ``id`` is the object's address. Checked here on arrays
    of several kinds against ``__array_interface__``: where it does not hold (another Python,
    another layout) the slow way is used."""
    head = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)  # refcount, type
    read = ctypes.c_void_p.from_address

    def ptr(a: np.ndarray) -> int:
        return read(id(a) + head).value or 0

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    probes: list[np.ndarray] = [base, base[1:, 2:], base.T, np.zeros(0, np.int8), np.ones(3, np.complex128)[1:]]
    try:
        ok = all(ptr(x) == _data_ptr_by_interface(x) for x in probes)
    except (ValueError, OverflowError):
        ok = False
    return ptr if ok else _data_ptr_by_interface


_data_ptr = _fast_data_ptr()


@dataclass(frozen=True)
class ParamSpec:
    """One buffer parameter as the caller sees it.

    ``shape`` entries are ints, the name of a dim var, or a Python expression over dim names
    (``"n - 2"``, ``"(n + 3) // 4"``) for extents that are computed from dims.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    output: bool = False
    # a scalar parameter (a te.var in the argument list): passed by value, shape ()
    scalar: bool = False
    # a strided buffer: one stride per axis in elements, written like shape entries (an int,
    # a dim name, an expression over dims); None for a C-contiguous array
    strides: tuple[int | str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (library manifests, tuning records); `from_json` reads it back."""
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                               "output": self.output}
        if self.scalar:  # only then, so manifests of buffer-only kernels stay as they were
            out["scalar"] = True
        if self.strides is not None:  # likewise
            out["strides"] = list(self.strides)
        return out

    @staticmethod
    def from_json(data: Any) -> ParamSpec:
        """Validate and rebuild a spec written by `to_json`; ValueError names the bad field.

        Shape expressions are evaluated at every call, and the data may come from a file, so
        only arithmetic over names is accepted: no attribute access, strings or subscripts.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a parameter must be a JSON object, got {data!r}")
        name, dtype, shape = data.get("name"), data.get("dtype"), data.get("shape")
        output = data.get("output", False)
        if not isinstance(name, str) or not name:
            raise ValueError(f"parameter 'name' must be a non-empty string, got {name!r}")
        if not isinstance(dtype, str) or dtype not in dt.SCALAR_DTYPES:
            raise ValueError(f"parameter {name!r}: 'dtype' must be one of "
                             f"{', '.join(dt.SCALAR_DTYPES)}, got {dtype!r}")
        if not isinstance(shape, list):
            raise ValueError(f"parameter {name!r}: 'shape' must be a list, got {shape!r}")
        strides = data.get("strides")
        if strides is not None and (not isinstance(strides, list) or len(strides) != len(shape)):
            raise ValueError(f"parameter {name!r}: 'strides' must be a list of {len(shape)} "
                             f"entries, got {strides!r}")
        for s in [*shape, *(strides or [])]:
            ok = (isinstance(s, int) and not isinstance(s, bool) and s >= 0) or (
                isinstance(s, str) and _SHAPE_EXPR.match(s) is not None)
            if not ok:
                raise ValueError(f"parameter {name!r}: shape or stride entry {s!r} is neither "
                                 "an extent nor an arithmetic expression over dim names")
        if not isinstance(output, bool):
            raise ValueError(f"parameter {name!r}: 'output' must be true or false")
        scalar = data.get("scalar", False)
        if not isinstance(scalar, bool) or (scalar and (shape or output)):
            raise ValueError(f"parameter {name!r}: 'scalar' must be true or false, and a scalar "
                             "has shape [] and is no output")
        if scalar and strides is not None:
            raise ValueError(f"parameter {name!r}: a scalar has no strides")
        return ParamSpec(name, dtype, tuple(shape), output, scalar,
                         None if strides is None else tuple(strides))


_SHAPE_EXPR = re.compile(r"^[A-Za-z0-9_+\-*/%(), ]+$")

# C types of scalar parameters (by value); float16/bfloat16 have no portable C ABI
_SCALAR_CTYPES: dict[str, Any] = {
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32,
    "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64, "float32": ctypes.c_float,
    "float64": ctypes.c_double,
}


_DTYPE_HINT = {
    "bfloat16": " (an ml_dtypes.bfloat16 array, or uint16 bit patterns)",
    "float16": " (a numpy float16 array)",
}


def _array_dtype(dtype: str) -> np.dtype:
    """The numpy dtype an array argument of ``dtype`` must have."""
    try:
        return dt.to_numpy(dtype)
    except TecompError:  # bfloat16 without ml_dtypes: only uint16 bit patterns
        return np.dtype(np.uint16)


def scalar_ctype(p: ParamSpec) -> Any:
    """The ctypes type a scalar parameter is passed as."""
    t = _SCALAR_CTYPES.get(p.dtype)
    if t is None:
        raise TypeError(f"scalar parameter {p.name!r} has dtype {p.dtype}, which cannot be "
                        "passed by value")
    return t


def check_scalar(who: str, p: ParamSpec, v: object) -> int | float:
    """``v`` as a Python number for scalar parameter ``p``: TypeError for a value of the
    wrong kind (a float for an int parameter, a bool, an array), ValueError for an int out of
    the dtype's range."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{who}: expected a {p.dtype} scalar (a Python or numpy number), got "
                        f"{type(v).__name__}")
    if dt.is_int(p.dtype):
        if not isinstance(v, (int, np.integer)):
            raise TypeError(f"{who}: expected an integer for {p.dtype}, got "
                            f"{type(v).__name__} {v!r}")
        iv = int(v)
        info = np.iinfo(p.dtype)
        if not int(info.min) <= iv <= int(info.max):
            raise ValueError(f"{who}: {iv} is out of range for {p.dtype} "
                             f"[{info.min}, {info.max}]")
        return iv
    return float(v)
# the only names a shape expression may call (what _py_expr emits for Min/Max/Div)
_SHAPE_NS: dict[str, object] = {"__builtins__": {}, "min": min, "max": max, "int": int}
_CONST, _BIND, _CHECK = 0, 1, 2


class ArgChecker:
    """Validates ``(array, ...)`` against the params of one kernel and builds C arguments.

    All per-parameter work that does not depend on the arguments (dtype objects, which axes
    are constants, which bind a dim, compiled shape expressions) is done once here, so a call
    costs a few attribute reads per argument.
    """

    def __init__(self, func_name: str, params: Sequence[ParamSpec], dim_names: Sequence[str],
                 check_overlap: bool = True) -> None:
        self.func_name = func_name
        self.params = tuple(params)
        self.dim_names = tuple(dim_names)
        self.check_overlap = check_overlap
        self._n = len(self.params)
        self._np_dtypes = [_array_dtype(p.dtype) for p in self.params]
        # bfloat16 buffers also take uint16 arrays holding the bit patterns (as TVM does)
        self._alt_dtypes = [np.dtype(np.uint16) if dt.element(p.dtype) == "bfloat16" else None
                            for p in self.params]
        self._outputs = [i for i, p in enumerate(self.params) if p.output]
        dim_index = {n: i for i, n in enumerate(self.dim_names)}
        # scalar parameters: position -> the dim they give (a te.var that is both an explicit
        # argument and a symbolic dim; checked against the shapes), or None
        self._scalars: dict[int, int | None] = {
            i: dim_index.get(p.name) for i, p in enumerate(self.params) if p.scalar}
        self.ctypes_args: list[Any] = (
            [ctypes.c_void_p] * (self._n - len(self._scalars))
            + [ctypes.c_int64] * len(self.dim_names)
            + [scalar_ctype(self.params[i]) for i, d in self._scalars.items() if d is None])
        self._buf_pos = [i for i, p in enumerate(self.params) if not p.scalar]
        self._arr_index = {i: k for k, i in enumerate(self._buf_pos)}
        bound: set[int] = {d for d in self._scalars.values() if d is not None}
        by_scalar = set(bound)
        # per param: None when every extent is a constant (compare the shape tuple at once),
        # else a tuple of (axis, kind, payload) to walk.
        self._static: list[tuple[int, ...] | None] = []
        self._axes: list[tuple[tuple[int, int, Any], ...]] = []
        self._shape_text: list[str] = []
        self._checks: list[tuple[int, int, Any]] = []
        for i, p in enumerate(self.params):
            axes: list[tuple[int, int, Any]] = []
            for ax, s in enumerate(p.shape):
                if isinstance(s, (int, np.integer)):
                    axes.append((ax, _CONST, int(s)))
                elif s in dim_index and (dim_index[s] not in bound or dim_index[s] in by_scalar):
                    # a shape binds its dims (a scalar argument naming the dim is then checked
                    # against it)
                    by_scalar.discard(dim_index[s])
                    bound.add(dim_index[s])
                    axes.append((ax, _BIND, dim_index[s]))
                elif s in dim_index:
                    axes.append((ax, _CHECK, (dim_index[s], s)))
                else:
                    code = compile(s, f"<shape of {p.name}>", "eval")
                    axes.append((ax, _CHECK, (code, s)))
                    self._checks.append((i, ax, code))
            static = all(k == _CONST for _, k, _ in axes)
            self._static.append(tuple(v for _, _, v in axes) if static else None)
            self._axes.append(tuple(axes))
            self._shape_text.append("(" + ", ".join(str(s) for s in p.shape)
                                    + ("," if len(p.shape) == 1 else "") + ")")
        # strided params: (param, ((axis, kind, payload), ...)), walked after the shapes (a
        # stride may name a dim a later shape binds); a dim first seen in a stride is bound
        # from it. _stride_of[dim] = (param, axis) for messages.
        self._strided: list[tuple[int, tuple[tuple[int, int, Any], ...]]] = []
        self._stride_of: dict[int, tuple[int, int]] = {}
        for i, p in enumerate(self.params):
            if p.strides is None:
                continue
            saxes: list[tuple[int, int, Any]] = []
            for ax, s in enumerate(p.strides):
                if isinstance(s, (int, np.integer)):
                    saxes.append((ax, _CONST, int(s)))
                elif s in dim_index and dim_index[s] not in bound:
                    bound.add(dim_index[s])
                    self._stride_of[dim_index[s]] = (i, ax)
                    saxes.append((ax, _BIND, dim_index[s]))
                elif s in dim_index:
                    saxes.append((ax, _CHECK, (dim_index[s], s)))
                else:
                    saxes.append((ax, _CHECK, (compile(s, f"<strides of {p.name}>", "eval"), s)))
            self._strided.append((i, tuple(saxes)))
        missing = [n for i, n in enumerate(self.dim_names) if i not in bound]
        if missing:
            from ..errors import TecompError

            raise TecompError(
                f"{func_name}: symbolic dims {', '.join(missing)} cannot be inferred from "
                "argument shapes; some parameter must have each of them as a plain extent"
            )
        self._bound_by = {}  # dim index -> the param whose shape binds it (for messages)
        for i, axes_i in enumerate(self._axes):
            for _, k, v in axes_i:
                if k == _BIND:
                    self._bound_by[v] = i

    # errors ---------------------------------------------------------------------------------
    def _who(self, i: int) -> str:
        return f"argument {i} ('{self.params[i].name}') of {self.func_name}"

    def _count_error(self, n: int) -> TypeError:
        names = ", ".join(p.name for p in self.params)
        what = "arguments" if self._scalars else "array arguments"
        return TypeError(f"{self.func_name}() takes {self._n} {what} ({names}), got {n}")

    def _shape_error(self, i: int, shape: tuple[int, ...], dims: list[int | None]) -> ValueError:
        env = {n: d for n, d in zip(self.dim_names, dims, strict=True) if d is not None}
        want = self._shape_text[i]
        if env and self._static[i] is None:
            try:
                conc = tuple(s if isinstance(s, int) else eval(s, _SHAPE_NS, env)
                             for s in self.params[i].shape)
                want += f" = {conc}"
            except NameError:
                pass
        return ValueError(f"{self._who(i)}: expected shape {want}, got {tuple(shape)}")

    # conversion -----------------------------------------------------------------------------
    def _coerce(self, i: int, a: object) -> np.ndarray:
        if isinstance(a, np.ndarray):
            return a
        if hasattr(a, "__dlpack__"):
            try:
                return np.from_dlpack(a)
            except (TypeError, ValueError, BufferError, RuntimeError) as e:
                raise TypeError(f"{self._who(i)}: cannot import it through DLPack: {e}") from None
        raise TypeError(
            f"{self._who(i)}: expected a numpy array or an object with __dlpack__ "
            f"(e.g. a CPU torch.Tensor), got {type(a).__name__}"
        )

    def convert(self, args: Sequence[object]) -> tuple[list[np.ndarray], list[int]]:
        """Check ``args``; return the arrays (keep them alive during the call) and the C args
        (data pointers followed by the int64 dims)."""
        if len(args) != self._n:
            raise self._count_error(len(args))
        dims: list[int | None] = [None] * len(self.dim_names)
        arrays: list[np.ndarray] = []
        cargs: list[int] = []
        spans: list[int] = []  # bytes from each array's first element to the end of its last
        scalars = self._scalars
        for i, a in enumerate(args):
            if scalars and i in scalars:
                continue  # after the shapes: they may check a dim the shapes bind
            if type(a) is not np.ndarray:
                a = self._coerce(i, a)
            want = self._np_dtypes[i]
            alt = self._alt_dtypes[i]  # (np.dtype(x) == None compares with float64)
            if a.dtype is not want and a.dtype != want and (alt is None or a.dtype != alt):
                raise TypeError(f"{self._who(i)}: expected dtype {self.params[i].dtype}"
                                f"{_DTYPE_HINT.get(dt.element(self.params[i].dtype), '')}, "
                                f"got {a.dtype}")
            shape = a.shape
            static = self._static[i]
            if static is not None:
                if shape != static:
                    raise self._shape_error(i, shape, dims)
            else:
                if len(shape) != len(self._axes[i]):
                    raise self._shape_error(i, shape, dims)
                for ax, kind, v in self._axes[i]:
                    if kind == _BIND:
                        dims[v] = shape[ax]
                    elif kind == _CONST:
                        if shape[ax] != v:
                            raise self._shape_error(i, shape, dims)
                    elif isinstance(v[0], int):  # a dim bound earlier must agree
                        if shape[ax] != dims[v[0]]:
                            j = self._bound_by[v[0]]
                            raise ValueError(
                                f"{self._who(i)}: axis {ax} has extent {shape[ax]}, but "
                                f"{v[1]} = {dims[v[0]]} from the shape of {self._who(j)}"
                            )
            flags = a.flags
            if not flags.c_contiguous and self.params[i].strides is None:
                raise ValueError(f"{self._who(i)}: the array must be C-contiguous "
                                 "(use np.ascontiguousarray)")
            if not flags.writeable and self.params[i].output:
                raise ValueError(f"{self._who(i)}: the kernel writes this argument, but the "
                                 "array is read-only")
            arrays.append(a)
            cargs.append(_data_ptr(a))
            spans.append(_span_bytes(a))
        cscalars: list[int | float] = []
        if scalars:
            cscalars = self._convert_scalars(args, dims)
        if self._checks:  # extents computed from dims, e.g. (n - 2)
            env = dict(zip(self.dim_names, dims, strict=True))
            for i, ax, code in self._checks:
                shp = arrays[self._arr_index[i]].shape
                if shp[ax] != eval(code, _SHAPE_NS, env):
                    raise self._shape_error(i, shp, dims)
        if self._strided:
            self._bind_strides(arrays, dims)
        if self.check_overlap and self._outputs:
            self._check_overlap(arrays, cargs, spans)
        cargs.extend(dims)  # type: ignore[arg-type]
        cargs.extend(cscalars)  # type: ignore[arg-type]
        return arrays, cargs

    def _bind_strides(self, arrays: list[np.ndarray], dims: list[int | None]) -> None:
        """Bind or check the strides of the strided params against their arrays' strides."""
        for i, saxes in self._strided:
            a = arrays[self._arr_index[i]]
            item = a.itemsize
            for ax, bst in enumerate(a.strides):
                if bst < 0 or bst % item:
                    raise ValueError(
                        f"{self._who(i)}: byte stride {bst} of axis {ax} is "
                        f"{'negative' if bst < 0 else f'not a multiple of the item size ({item})'}"
                        "; a strided argument needs non-negative strides in whole elements "
                        "(use np.ascontiguousarray or a view without reversed axes)")
            want = self.params[i].strides
            env: dict[str, int | None] | None = None
            for ax, kind, v in saxes:
                got = a.strides[ax] // item
                if kind == _BIND:
                    dims[v] = got
                    continue
                if a.shape[ax] <= 1:
                    continue  # the stride of an axis of extent 0 or 1 never addresses anything
                if kind == _CONST:
                    exp, why = v, ""
                elif isinstance(v[0], int):
                    exp = dims[v[0]]
                    src = self._stride_of.get(v[0])
                    where = (f"the strides of {self._who(src[0])}" if src is not None
                             else f"the shape of {self._who(self._bound_by[v[0]])}"
                             if v[0] in self._bound_by else "a scalar argument")
                    why = f" ({v[1]} = {exp} from {where})"
                else:
                    if env is None:
                        env = dict(zip(self.dim_names, dims, strict=True))
                    exp, why = eval(v[0], _SHAPE_NS, env), f" ({v[1]})"
                if got != exp:
                    raise ValueError(
                        f"{self._who(i)}: axis {ax} has a stride of {got} elements "
                        f"({a.strides[ax]} bytes), but the kernel was built for strides "
                        f"[{', '.join(map(str, want or ()))}]: expected {exp}{why}")

    def _convert_scalars(self, args: Sequence[object], dims: list[int | None]) -> list[int | float]:
        """Check the scalar arguments; bind or check the dims they name; return the C ones."""
        out: list[int | float] = []
        for i, d in self._scalars.items():
            v = check_scalar(self._who(i), self.params[i], args[i])
            if d is None:
                out.append(v)
            elif dims[d] is None:
                dims[d] = int(v)
            elif dims[d] != v:
                j = self._bound_by.get(d)
                src = f"the shape of {self._who(j)}" if j is not None else "another argument"
                raise ValueError(f"{self._who(i)} is {v}, but {self.dim_names[d]} = {dims[d]} "
                                 f"from {src}")
        return out

    def _check_overlap(self, arrays: list[np.ndarray], ptrs: list[int], spans: list[int]) -> None:
        # Kernels are compiled assuming buffers do not alias (noalias); an output sharing
        # memory with another argument would silently compute garbage.
        pos = self._buf_pos  # arrays/ptrs/spans hold the buffer arguments only
        for o in self._outputs:
            i = self._arr_index[o]
            lo, n = ptrs[i], spans[i]
            if n == 0:
                continue
            for j, a in enumerate(arrays):
                m = spans[j]
                if j != i and m and lo < ptrs[j] + m and ptrs[j] < lo + n:
                    if not (arrays[i].flags.c_contiguous and a.flags.c_contiguous) and \
                            not _may_share(arrays[i], a):
                        continue  # interleaved strided views (e.g. column slices of one array)
                    raise ValueError(
                        f"{self._who(o)} overlaps the memory of {self._who(pos[j])}; outputs "
                        "must not share memory with other arguments (pass a separate array)"
                    )


def _span_bytes(a: np.ndarray) -> int:
    """Bytes from ``a``'s first element to the end of its last (strides checked >= 0)."""
    if a.flags.c_contiguous or a.size == 0:
        return int(a.nbytes)
    return int(a.itemsize + sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True)))


def _may_share(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays whose address ranges overlap share an element (exactly, within a
    bounded effort; too hard to tell counts as sharing)."""
    try:
        # numpy's stubs allow only -1/0, but any positive bound is documented and works
        return bool(np.shares_memory(a, b, max_work=100_000))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True


# construction from IR ---------------------------------------------------------------------

_PY_BIN: dict[type, str] = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.FloorDiv: "//", E.FloorMod: "%", E.Div: "//",
}


def _py_expr(e: E.Expr, names: dict[E.Var, str]) -> str:
    """A Python expression computing the shape extent ``e`` from dim names."""
    if isinstance(e, E.IntImm):
        return str(e.value)
    if isinstance(e, E.Var):
        if e not in names:
            raise ValueError(f"shape uses '{e.name}', which is not a dim var of the kernel")
        return names[e]
    if isinstance(e, E.Cast):
        return _py_expr(e.value, names)
    if isinstance(e, (E.Min, E.Max)):
        fn = "min" if isinstance(e, E.Min) else "max"
        return f"{fn}({_py_expr(e.a, names)}, {_py_expr(e.b, names)})"
    op = _PY_BIN.get(type(e))
    if op is None:
        raise ValueError(f"cannot check the shape extent {e} at call time")
    a, b = _py_expr(e.a, names), _py_expr(e.b, names)  # type: ignore[attr-defined]
    if isinstance(e, E.Div):  # C division truncates toward zero
        return f"int({a} / {b})"
    return f"({a} {op} {b})"


class _Written(StmtVisitor):
    def __init__(self) -> None:
        self.data: set[E.Var] = set()

    def visit_BufferStore(self, s: S.BufferStore) -> None:
        self.data.add(s.buffer.data)
        super().visit_BufferStore(s)

    def visit_Call(self, e: E.Call) -> None:
        # An extern call may write through any pointer it is given.
        if e.extern:
            for a in e.args:
                if isinstance(a, E.Call) and a.name == "address_of":
                    self.data.add(a.args[0].buffer.data)  # type: ignore[attr-defined]
                elif isinstance(a, E.Var):
                    self.data.add(a)
        super().visit_Call(e)


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel as its callers see it: its C (or PTX) signature is the buffer
    ``params``, then ``dims`` (int64 extents of the symbolic dims), then the scalar ``params``
    that name no dim, by value; ``check_overlap`` says whether calls must reject
    outputs that overlap other arguments (the kernel promised LLVM they do not)."""

    name: str
    params: tuple[ParamSpec, ...]
    dims: tuple[str, ...]
    check_overlap: bool = True

    @staticmethod
    def of(func: S.PrimFunc) -> KernelSpec:
        specs, dims = specs_from_primfunc(func)
        return KernelSpec(func.name, tuple(specs), tuple(dims), bool(func.attrs.get("noalias", True)))


def specs_from_primfunc(func: S.PrimFunc) -> tuple[list[ParamSpec], list[str]]:
    """Parameter specs and dim names of a PrimFunc.

    Outputs come from ``func.attrs["outputs"]`` (param indices) when present, else from the
    buffers the body stores to.
    """
    names: dict[E.Var, str] = {}
    used: set[str] = set()
    for v in func.dim_vars:
        n = v.name if v.name.isidentifier() else "d"
        base, k = n, 1
        while n in used:  # two dims printed alike must still be told apart
            n, k = f"{base}_{k}", k + 1
        used.add(n)
        names[v] = n
    outputs = func.attrs.get("outputs")
    if outputs is None:
        w = _Written()
        w.visit_stmt(func.body)
        outputs = [i for i, b in enumerate(func.params) if b.data in w.data]
    outs = set(outputs)
    specs = []
    for i, b in enumerate(func.params):
        shape: list[int | str] = []
        for s in b.shape:
            shape.append(s.value if isinstance(s, E.IntImm) else _py_expr(s, names))
        strides = tuple(s.value if isinstance(s, E.IntImm) else _py_expr(s, names)
                        for s in b.strides) if b.strides else None
        specs.append(ParamSpec(b.name, dt.element(b.dtype), tuple(shape), i in outs,
                               strides=strides))
    # scalar parameters (te.var arguments) go back to their places in the argument list; one
    # that is also a dim carries the dim's name (the checker binds or checks that dim by it)
    for pos, v in sorted(func.attrs.get("scalar_params", ()), key=lambda x: x[0]):
        known = names.get(v)
        if known is not None:
            n = known
        else:
            n = v.name if v.name.isidentifier() else "s"
            base, k = n, 1
            while n in used:
                n, k = f"{base}_{k}", k + 1
            used.add(n)
        specs.insert(pos, ParamSpec(n, dt.element(v.dtype), (), False, True))
    return specs, [names[v] for v in func.dim_vars]


__all__ = ["ArgChecker", "KernelSpec", "ParamSpec", "check_scalar", "scalar_ctype",
           "specs_from_primfunc"]
