"""Calling native CPU kernels through ctypes, and timing them.

`Function` wraps the address of one compiled ``int32_t f(T*..., int64_t...)``; it does not care
whether the code came from the JIT or from a shared library on disk (no llvmlite here).
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import TecompError
from .args import ArgChecker, ParamSpec


@dataclass(frozen=True)
class BenchmarkResult:
    """Seconds per kernel call, one entry per repeat (each the mean over ``number`` calls)."""

    results: tuple[float, ...]
    number: int = 1  # calls per repeat actually used (grown to honour min_repeat_ms)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results) if len(self.results) > 1 else 0.0

    def __str__(self) -> str:
        return (f"median {self.median * 1e3:.4f} ms, mean {self.mean * 1e3:.4f} ms, "
                f"min {self.min * 1e3:.4f} ms, std {self.std * 1e3:.4f} ms "
                f"({len(self.results)} repeats x {self.number} calls)")


ErrorHandler = Callable[[int], Exception]


def _default_error(name: str) -> ErrorHandler:
    def handle(rc: int) -> Exception:
        return TecompError(f"kernel {name} failed with error code {rc}")

    return handle


class Function:
    """A callable compiled kernel: ``f(a, b, c)`` checks the arrays, then runs the kernel.

    ``owner`` is kept alive as long as the Function (it owns the machine code).
    """

    def __init__(self, name: str, address: int, checker: ArgChecker, owner: object = None,
                 on_error: ErrorHandler | None = None) -> None:
        self.name = name
        self.checker = checker
        self._owner = owner
        # buffers, int64 dims, then scalar parameters by value (ArgChecker.ctypes_args)
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *checker.ctypes_args)
        self._cfunc = proto(address)
        self._convert = checker.convert
        self._on_error = on_error or _default_error(name)

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.checker.params

    def __call__(self, *args: object) -> None:
        arrays, cargs = self._convert(args)
        rc = self._cfunc(*cargs)
        if rc:
            raise self._on_error(rc)
        del arrays

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in self.params)
        return f"<tecomp.Function {self.name}({sig})>"

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                       warmup: int = 1) -> Callable[..., BenchmarkResult]:
        """A function that times this kernel on given arguments.

        Arguments are checked once; each repeat then calls the native kernel ``number`` times
        back to back (ctypes overhead included, ~1 us) and records the mean. If a repeat takes
        less than ``min_repeat_ms``, ``number`` grows (and the repeat is redone) until it does,
        as in TVM. ``warmup`` calls run first and are not timed.

        >>> f.time_evaluator(number=10, repeat=3)(a, b, c).median  # doctest: +SKIP
        """
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be at least 1")

        def evaluate(*args: object) -> BenchmarkResult:
            arrays, cargs = self._convert(args)
            cfunc, clock = self._cfunc, time.perf_counter
            for _ in range(warmup):
                rc = cfunc(*cargs)
                if rc:
                    raise self._on_error(rc)
            n = number
            results: list[float] = []
            while len(results) < repeat:
                t0 = clock()
                rc = 0
                for _ in range(n):
                    rc |= cfunc(*cargs)
                dt = clock() - t0
                if rc:
                    raise self._on_error(rc)
                if dt * 1e3 < min_repeat_ms:
                    # Too short to trust the clock: scale up (with headroom) and redo.
                    per_call = max(dt / n, 1e-9)
                    n = max(int(math.ceil(min_repeat_ms / 1e3 / per_call * 1.2)), n * 2)
                    continue
                results.append(dt / n)
            del arrays
            return BenchmarkResult(tuple(results), n)

        return evaluate


class OOBRecord(ctypes.Structure):
    """Where a debug build reports its first out-of-bounds access of a call.

    Mirrors ``codegen.memory._OOB_TYPE`` ({claimed, buffer id, flat index, extent}); defined
    here, without llvmlite, because JIT modules and loaded libraries both read it.
    """

    _fields_ = [("claimed", ctypes.c_int32), ("buffer", ctypes.c_int32),
                ("index", ctypes.c_int64), ("extent", ctypes.c_int64)]


class ErrorDecoder:
    """Turns a kernel's nonzero return code into the exception to raise.

    Shared by JIT-built and loaded kernels so both raise the same exceptions. ``codes`` maps
    code -> name (``OUT_OF_BOUNDS``, ``ALLOC_FAILED``): the JIT passes codegen's ErrorCode, a
    library its manifest, so a library keeps meaning what its writer meant. Holds ``owner``
    (the JIT engine or the loaded library, which own the memory of ``oob``) rather than the
    module, so module -> Function -> decoder has no cycle and the code is freed with the last
    Function.
    """

    def __init__(self, kernel: str, codes: Mapping[int, str], oob: OOBRecord | None,
                 buffers: Sequence[str], owner: object = None) -> None:
        self._kernel, self._codes, self._oob = kernel, dict(codes), oob
        self._buffers, self._owner = list(buffers), owner

    def __call__(self, rc: int) -> Exception:
        what = self._codes.get(rc)
        rec = self._oob
        if what == "OUT_OF_BOUNDS" and rec is not None and rec.claimed:
            names = self._buffers
            bid, axis = rec.buffer & 0xFFFF, (rec.buffer >> 16) - 1  # axis >= 0: a per-axis check
            buf = names[bid] if 0 <= bid < len(names) else f"#{bid}"
            if axis >= 0:
                msg = (f"out-of-bounds access to buffer '{buf}': index {rec.index} on axis {axis} "
                       f"not in [0, {rec.extent})")
            else:
                msg = (f"out-of-bounds access to buffer '{buf}': flat index {rec.index} "
                       f"not in [0, {rec.extent})")
            rec.claimed = 0  # first error wins per call; re-arm for the next one
            return IndexError(msg)
        if what == "ALLOC_FAILED":
            return MemoryError(f"kernel {self._kernel}: could not allocate a local buffer")
        if what == "DIV_BY_ZERO":
            return ZeroDivisionError(f"kernel {self._kernel}: integer division or modulo by zero")
        return TecompError(f"kernel {self._kernel} failed with error code {rc}")


def function_from_address(name: str, address: int, params: Sequence[ParamSpec],
                          dim_names: Sequence[str], owner: object = None,
                          on_error: ErrorHandler | None = None,
                          check_overlap: bool = True) -> Function:
    """Build a `Function` for a kernel at ``address`` described by ``params``/``dim_names``."""
    checker = ArgChecker(name, params, dim_names, check_overlap)
    return Function(name, address, checker, owner, on_error)


class KernelSet:
    """The access surface shared by JIT-built modules and loaded libraries.

    Subclasses fill ``_functions`` (name -> Function) and ``entry_name`` (the only kernel, or
    None) and say in ``_where`` what to call themselves in error messages.
    """

    _functions: dict[str, Function]
    entry_name: str | None
    _where: str = "this module"

    def __getitem__(self, name: str) -> Function:
        try:
            return self._functions[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self._where}; it has "
                           f"{', '.join(self._functions)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    @property
    def function_names(self) -> list[str]:
        return list(self._functions)

    def get_function(self, name: str) -> Function:
        return self[name]

    @property
    def entry_func(self) -> Function:
        if self.entry_name is None:
            raise TecompError(f"{self._where} has several kernels ({', '.join(self._functions)}); "
                              "pick one with mod['name']")
        return self._functions[self.entry_name]

    def __call__(self, *args: object) -> None:
        self.entry_func(*args)

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                       name: str | None = None) -> Callable[..., BenchmarkResult]:
        """`Function.time_evaluator` of the kernel ``name`` (default: the entry kernel)."""
        f = self[name] if name is not None else self.entry_func
        return f.time_evaluator(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)


__all__ = ["BenchmarkResult", "ErrorDecoder", "Function", "KernelSet", "OOBRecord",
           "function_from_address"]
