"""Checks of a lowered GPU kernel that would otherwise fail on the device, in ptxas, or not at all.

ptxas accepts a kernel that declares more shared memory than the arch has, and a launch with
more than 1024 threads per block only fails at run time: on a machine without a GPU nobody
would ever know. So the loop nest is checked here, right after lowering, and each problem is
a `ScheduleError` / `LoweringError` that names the loop, stage or buffer. The launch
configuration (one extent per thread tag) is derived on the way.
"""

from __future__ import annotations

import math

from ..arith.simplify import simplify
from ..codegen.target import Target
from ..errors import LoweringError, ScheduleError
from ..ir.expr import Expr, IntImm
from ..ir.functor import StmtVisitor
from ..ir.stmt import Allocate, BufferStore, For, ForKind, PrimFunc, thread_tag

# annotation key of a scan's serial time loop (`Lowering._scan_nest`); its value is the scan
SCAN_TIME_LOOP = "scan_time_loop"


class _Walk(StmtVisitor):
    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.tags: list[tuple[str, Expr]] = []  # enclosing thread-bound loops (tag, extent), outermost first
        self.launch: dict[str, Expr] = {}
        self.shared: dict[str, int] = {}  # shared buffer -> bytes

    def visit_For(self, s: For) -> None:
        tag = thread_tag(s)
        if tag is None:
            if s.kind == ForKind.PARALLEL:
                raise ScheduleError(f"{self.kernel}: loop '{s.var.name}' is parallel(); on a GPU "
                                    "bind it to blockIdx/threadIdx instead")
            # a loop of extent 1 runs once, and a scan's time loop is meant to run in every
            # thread (each advances its own columns one step at a time; lowering adds the
            # barriers it needs): neither repeats work, so both may enclose the thread loops
            ext1 = simplify(s.extent)
            trivial = isinstance(ext1, IntImm) and ext1.value == 1
            if not self.tags and not trivial and s.annotation(SCAN_TIME_LOOP) is None:
                raise ScheduleError(
                    f"{self.kernel}: loop '{s.var.name}' runs outside every thread-bound loop; on a "
                    "cuda target bind the outer loops of the output stage to blockIdx.* / "
                    "threadIdx.* (s[C].bind(axis, te.thread_axis('blockIdx.x')))")
            super().visit_For(s)
            return
        ext = simplify(s.extent)
        outer = next((e for t, e in reversed(self.tags) if t == tag), None)
        if outer is None:
            # Loops of one tag that are not nested (a cooperative load at a blockIdx loop beside
            # the consumer's threadIdx loop) may differ, as in TVM: the launch takes the
            # largest, and a narrower loop runs only for the indices below its extent (the
            # codegen and the emulator mask it, docs/gpu-ir.md).
            known = self.launch.get(tag)
            if known is None or _same(known, ext):
                self.launch[tag] = ext
            elif isinstance(known, IntImm) and isinstance(ext, IntImm):
                self.launch[tag] = ext if ext.value > known.value else known
            else:
                # no launch extent covers both for every value of the sizes (a symbolic grid)
                raise ScheduleError(f"{self.kernel}: {tag} is bound to loops of different extents "
                                    f"({known} and {ext}, loop '{s.var.name}'); a launch has one "
                                    "extent per thread index, and the larger of these is not known "
                                    "when the kernel is compiled")
        elif isinstance(ext, IntImm) and isinstance(outer, IntImm) and ext.value > outer.value:
            # nested: the hardware index is the enclosing loop's, so indices past its extent
            # never reach this loop's body
            raise ScheduleError(f"{self.kernel}: loop '{s.var.name}' (extent {ext.value}) is bound "
                                f"to {tag} inside a {tag} loop of extent {outer.value}: a stage "
                                "cannot use more threads than its block has")
        self.tags.append((tag, ext))
        super().visit_For(s)
        self.tags.pop()

    def visit_BufferStore(self, s: BufferStore) -> None:
        if not self.tags:
            raise ScheduleError(f"{self.kernel}: buffer {s.buffer.name} is written outside every "
                                "thread-bound loop; bind the output stage's loops to blockIdx/threadIdx")
        super().visit_BufferStore(s)

    def visit_Allocate(self, s: Allocate) -> None:
        b = s.buffer
        if b.scope == "global":
            raise LoweringError(f"{self.kernel}: stage buffer {b.name} would need global scratch "
                                "memory; compute it inline or at a loop of its consumer, or give "
                                "it a 'shared'/'local' scope")
        dims = [simplify(d) for d in b.shape]
        if not all(isinstance(d, IntImm) for d in dims):
            raise LoweringError(f"{self.kernel}: {b.scope} buffer {b.name} has the non-constant shape "
                                f"[{', '.join(map(str, dims))}]; GPU {b.scope} memory is sized when "
                                "the kernel is compiled (split the axes by constant factors)")
        if b.scope == "shared":
            n = math.prod(d.value for d in dims if isinstance(d, IntImm))
            if b.strides:
                n = max(n, sum((d.value - 1) * st.value for d, st in zip(dims, b.strides)  # type: ignore[attr-defined]
                               if isinstance(d, IntImm) and isinstance(st, IntImm)) + 1)
            self.shared[b.name] = self.shared.get(b.name, 0) + n * b.itemsize
        super().visit_Allocate(s)


def _same(a: Expr, b: Expr) -> bool:
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return a.value == b.value
    return str(a) == str(b)


def check_gpu_kernel(fn: PrimFunc, target: Target, roots: set[str]) -> dict[str, Expr]:
    """Check ``fn`` against ``target``'s limits; returns the launch extents by thread tag."""
    kernel = "/".join(sorted(roots)) or fn.name
    w = _Walk(kernel)
    w.visit_stmt(fn.body)
    lim = target.gpu
    threads = 1
    for k, axis in enumerate("xyz"):
        ext = w.launch.get(f"threadIdx.{axis}")
        if ext is None:
            continue
        if not isinstance(ext, IntImm):
            raise ScheduleError(f"{kernel}: threadIdx.{axis} is bound to a loop of extent {ext}; the "
                                "threads of a block must be a constant number (split by a constant)")
        if ext.value > lim.max_block_dims[k]:
            raise ScheduleError(f"{kernel}: threadIdx.{axis} extent {ext.value} exceeds {lim.arch}'s "
                                f"limit of {lim.max_block_dims[k]}")
        threads *= ext.value
    if threads > lim.max_threads_per_block:
        raise ScheduleError(f"{kernel}: {threads} threads per block (" + " x ".join(
            f"{t}={w.launch[t]}" for t in sorted(w.launch) if t.startswith("threadIdx")) +
            f") exceed {lim.arch}'s limit of {lim.max_threads_per_block}")
    if not w.launch:
        raise ScheduleError(f"{kernel}: no loop is bound to a thread index; on a cuda target bind "
                            "the output stage's loops to blockIdx/threadIdx")
    smem = sum(w.shared.values())
    if smem > lim.max_dynamic_smem:
        # up to static_smem (48 KB) shared arrays are static; above, codegen makes them dynamic
        # shared memory (codegen/gpu_shared.py), which the launch opts in to up to this maximum
        detail = ", ".join(f"{k} {v} B" for k, v in sorted(w.shared.items()))
        raise LoweringError(f"{kernel}: {smem} bytes of shared memory ({detail}) exceed the "
                            f"{lim.max_dynamic_smem} bytes a block may use on {lim.arch} "
                            f"({lim.static_smem} static, the rest as dynamic shared memory)")
    return w.launch


__all__ = ["SCAN_TIME_LOOP", "check_gpu_kernel"]
