"""How a GPU kernel's shared memory is laid out: static ``.shared`` arrays, or one dynamic area.

Every ``Allocate`` of scope "shared" in a kernel (docs/gpu-ir.md) takes its size rounded up to
`SHARED_ALIGN` bytes; the kernel's shared memory is their sum (no reuse between allocations:
the same total the launch check, the emulator and ptxas see). Where that total is at most the
arch's static limit (`GPULimits.static_smem`, 48 KiB on every arch), each allocation is its own
static ``.shared`` array, as before. Above it, up to the arch's opt-in maximum
(`GPULimits.max_dynamic_smem`: 163 KiB on sm_80, 227 KiB on sm_90), every allocation of the
kernel is an offset (a multiple of `SHARED_ALIGN`, in allocation order) into one
``extern .shared .align 16 .b8 <name>[]`` area, and the launch passes the total as its dynamic
shared memory size (``sharedMemBytes``; the runtime opts the function in above 48 KiB).

This module holds the rule, so the code generator, `tecomp.runtime.gpu_module.launch_plan`
(what a built function launches and an exported manifest records) and the tuner's filters
cannot disagree. It imports neither llvmlite nor the runtime.
"""

from __future__ import annotations

import math

from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from ..ir.functor import StmtVisitor
from .target import GPULimits, Target

SHARED_ALIGN = 16  # bytes: the widest access (float4, cp.async.cg, an ldmatrix row) of shared memory
# the extern shared area every dynamic kernel of a module addresses (PTX's `extern __shared__`)
DYNAMIC_SHARED_SYMBOL = "__tecomp_dyn_smem"


def allocation_bytes(buf: Buffer) -> int | None:
    """Bytes a shared allocation of ``buf`` takes (the elements its constant shape and strides
    span, as `llvm_base.const_elements` counts them, rounded up to `SHARED_ALIGN` bytes), None
    when they are not constant (codegen refuses such an allocation)."""
    shape = [d.value for d in buf.shape if isinstance(d, E.IntImm)]
    if len(shape) != len(buf.shape):
        return None
    n = math.prod(shape)
    if buf.strides:
        strides = [d.value for d in buf.strides if isinstance(d, E.IntImm)]
        if len(strides) != len(buf.strides):
            return None
        n = max([n] + [a * b for a, b in zip(shape, strides, strict=True)])
    nbytes = max(n, 1) * dt.itemsize(buf.dtype)
    return -(-nbytes // SHARED_ALIGN) * SHARED_ALIGN


class _Shared(StmtVisitor):
    def __init__(self) -> None:
        self.sizes: list[tuple[str, int]] = []

    def visit_Allocate(self, s: S.Allocate) -> None:  # noqa: N802 - the visitor's naming
        if s.buffer.scope == "shared":
            n = allocation_bytes(s.buffer)
            if n is not None:
                self.sizes.append((s.buffer.name, n))
        super().visit_Allocate(s)


def shared_allocations(func: S.PrimFunc) -> list[tuple[str, int]]:
    """(buffer name, bytes) of each shared allocation of the kernel ``func``, in the order the
    code generator meets them (a statement's body before what follows it)."""
    v = _Shared()
    v.visit_stmt(func.body)
    return v.sizes


def shared_bytes(func: S.PrimFunc) -> int:
    """All shared memory the kernel ``func`` uses per block (static or dynamic), in bytes."""
    return sum(n for _, n in shared_allocations(func))


def _limits(func: S.PrimFunc, target: Target | None) -> GPULimits | None:
    t = target if target is not None else func.attrs.get("target")
    return t.gpu if isinstance(t, Target) and t.is_gpu else None


def static_limit(func: S.PrimFunc, target: Target | None = None) -> int:
    """The static shared memory ``func``'s target allows (48 KiB; that without a target)."""
    lim = _limits(func, target)
    return lim.static_smem if lim is not None else GPULimits("sm_80", (8, 0)).static_smem


def uses_dynamic_shared(total: int, static_smem: int) -> bool:
    """Whether a kernel of ``total`` shared bytes puts them in the dynamic area."""
    return total > static_smem


def dynamic_shared_bytes(func: S.PrimFunc, target: Target | None = None) -> int:
    """The dynamic shared memory a launch of kernel ``func`` must pass (``sharedMemBytes``): its
    whole shared memory when that exceeds the static limit, else 0 (static arrays)."""
    total = shared_bytes(func)
    return total if uses_dynamic_shared(total, static_limit(func, target)) else 0


def static_shared_bytes(func: S.PrimFunc, target: Target | None = None) -> int:
    """The shared memory kernel ``func`` declares statically (0 when it is dynamic)."""
    total = shared_bytes(func)
    return 0 if uses_dynamic_shared(total, static_limit(func, target)) else total


__all__ = ["DYNAMIC_SHARED_SYMBOL", "SHARED_ALIGN", "allocation_bytes", "dynamic_shared_bytes",
           "shared_allocations", "shared_bytes", "static_limit", "static_shared_bytes",
           "uses_dynamic_shared"]
