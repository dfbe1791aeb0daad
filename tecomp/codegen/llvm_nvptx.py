"""LLVM IR and PTX for NVIDIA GPUs: lowered GPU `PrimFunc`s -> ``nvptx64-nvidia-cuda`` -> PTX.

The input is the GPU kernel IR contract of docs/gpu-ir.md. Each PrimFunc becomes one kernel

    define ptx_kernel void @name(ptr noalias align 16 %A, ..., i64 %n, ...) "nvvm.maxntid"="T"
        "nvvm.minctasm"="1"

with buffers in ``params`` order, then one i64 per ``dim_vars`` entry, then the scalar
parameters (``te.var`` arguments that are no dim, `llvm_base.c_scalar_params`) by value in their
own types (the CPU's argument order),
``T`` the product of the threadIdx launch extents (``.maxntid T`` + ``.minnctapersm 1`` in the
PTX, CUDA's ``__launch_bounds__(T, 1)``). Buffers are generic pointers: LLVM's NVPTX
argument lowering and address-space inference turn accesses through kernel arguments into
``ld.global``/``st.global`` (``ld.global.nc`` for read-only noalias inputs) and accesses to
shared arrays into ``ld.shared``. Parameters are declared 16-byte aligned (the runtime must pass
such pointers; cudaMalloc gives 256). Each access claims the alignment its buffer and index prove
(`CodegenNVPTX.access_align`), so float4 accesses of shared and global memory stay ``.v4``.

* THREAD_BINDING loops read ``llvm.nvvm.read.ptx.sreg.{tid,ctaid}.{x,y,z}``; a loop whose
  extent is not the launch extent of its tag runs under ``if var < extent``. A barrier under
  such a threadIdx guard is rejected: threads beyond the extent would never reach it.
* ``Allocate`` of scope "shared": an internal ``addrspace(3)`` array (16-byte aligned, constant
  size); "local": an ``alloca``. A kernel whose shared memory exceeds the arch's 48 KB of
  static shared memory puts all of it in the dynamic area instead (`gpu_shared`): each
  allocation is a 16-byte aligned offset into one ``extern .shared .align 16 .b8
  __tecomp_dyn_smem[]`` (an external ``addrspace(3)`` ``[0 x i8]``), and `KernelInfo` records
  the size the launch passes. Above the arch's opt-in maximum (163 KB on sm_80, 227 KB on
  sm_90) it is rejected (ptxas checks neither limit).
* ``syncthreads`` -> ``llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)`` (``bar.sync 0``).
* math -> libdevice (`tecomp.codegen.libdevice`).
* Masked vector accesses (vector tails, loads inside a vector ``Select``) never use the
  ``llvm.masked.*`` intrinsics, on which LLVM's NVPTX backend can abort: one plain vector
  access when every lane is active, else one predicated scalar access per active lane
  (`CodegenNVPTX._masked`); gathers and scatters are always per lane.
* An integer division by a zero divisor sets the module's ``__tecomp_error`` (global i32,
  `ErrorCode.DIV_BY_ZERO`) and divides by 1; the runtime reads and clears it after a launch.

`emit_ptx` verifies, links libdevice, optimises (O3) and emits PTX. Before LLVM sees the module
every intrinsic it declares is checked against `INTRINSICS` for the arch: an intrinsic the
arch lacks makes LLVM abort the whole process ("Cannot select"), a misspelled one turns into an
unresolved ``.extern .func`` that only ptxas would notice, and ``llvm.masked.load`` in IR text
handed in directly may abort (above); all are TecompErrors here.

>>> cg = CodegenNVPTX(Target.parse("cuda -arch=sm_80")); cg.add_function(f)   # doctest: +SKIP
>>> ptx = emit_ptx(cg.module, cg.target)                                       # doctest: +SKIP
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import llvmlite.binding as llvm
from llvmlite import ir

from ..arith.divisibility import pow2_divisor
from ..errors import CodegenError, TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from ..ir.structural import structural_equal
from ..te.intrin_cuda import FRAGMENT_SCOPES as _FRAGMENT_SCOPES
from ..te.intrin_cuda import MMA_CALLS as _MMA_CALLS
from .gpu_shared import DYNAMIC_SHARED_SYMBOL, shared_allocations, shared_bytes, uses_dynamic_shared
from .libdevice import emit_gpu_math_call, link_libdevice, needs_libdevice
from .llvm_base import CodegenLLVM, c_scalar_params, const_elements
from .llvm_common import I1, I32, I64, PTR, VOID, call_intrinsic, cast, declare, llvm_type, opaque
from .nvptx_memops import SHARED_ALIGN, AsyncCopyMixin, TensorCoreMixin, _param_align
from .target import Target

ERROR_GLOBAL = "__tecomp_error"

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y",
               "threadIdx.z")
_SREG = {"blockIdx": "ctaid", "threadIdx": "tid"}


# ---- which intrinsics each arch has ------------------------------------------------------------
@dataclass(frozen=True)
class Needs:
    """What an intrinsic needs: a minimum compute capability, and maybe the arch-specific
    feature set (``sm_90a``: wgmma, setmaxnreg...)."""

    cc: tuple[int, int] = (0, 0)
    arch_specific: bool = False


# Generic LLVM intrinsics the NVPTX backend lowers on every supported arch (each checked with
# LLVM 22 for sm_75, sm_80, sm_90, sm_90a, scalar and vector forms). Notably absent:
# llvm.exp/log/pow/sin/cos (abort: "Cannot select"; use libdevice), llvm.exp2
# (approximate ex2.approx) and llvm.masked.load (see `_REFUSED`).
_GENERIC = frozenset({
    "abs", "assume", "ceil", "copysign", "ctlz", "ctpop", "cttz", "expect", "fabs", "floor",
    "fma", "fmuladd", "fptosi.sat", "fptoui.sat", "lifetime.end", "lifetime.start",
    "masked.gather", "masked.scatter", "masked.store", "maximum", "maxnum",
    "memcpy", "memmove", "memset", "minimum", "minnum", "nearbyint", "prefetch", "rint",
    "round", "roundeven", "smax", "smin", "sqrt", "trunc", "umax", "umin",
    "vector.reduce.add", "vector.reduce.and", "vector.reduce.fadd", "vector.reduce.fmax",
    "vector.reduce.fmin", "vector.reduce.fmul", "vector.reduce.mul", "vector.reduce.or",
    "vector.reduce.smax", "vector.reduce.smin", "vector.reduce.umax", "vector.reduce.umin",
    "vector.reduce.xor",
})
# NVVM intrinsics by name (a trailing "." matches a family); what codegen emits now plus the
# families of the later tensor-core/async-copy work (docs/gpu-ir.md).
INTRINSICS: dict[str, Needs] = {
    "nvvm.read.ptx.sreg.tid.": Needs(), "nvvm.read.ptx.sreg.ntid.": Needs(),
    "nvvm.read.ptx.sreg.ctaid.": Needs(), "nvvm.read.ptx.sreg.nctaid.": Needs(),
    "nvvm.read.ptx.sreg.laneid": Needs(), "nvvm.read.ptx.sreg.warpsize": Needs(),
    "nvvm.barrier.cta.sync.aligned.all": Needs(), "nvvm.barrier0": Needs(),
    "nvvm.shfl.sync.": Needs((7, 0)),
    "nvvm.ldmatrix.sync.aligned.": Needs((7, 5)),
    "nvvm.mma.m16n8k16.": Needs((8, 0)),
    "nvvm.cp.async.": Needs((8, 0)),  # sm_75: LLVM aborts
    "nvvm.mbarrier.": Needs((8, 0)),
    "nvvm.wgmma.": Needs((9, 0), arch_specific=True),  # sm_90 without "a": LLVM aborts
}
# Generic intrinsics that LLVM 22's NVPTX backend can abort the process on, with why. A masked
# load whose mask the optimiser makes constant is selected as a vector load with a used-bytes
# mask, which asserts (passthru not poison; mask all on or all off; the 1-lane piece of an odd
# vector); whether that happens is only known after optimisation. `CodegenNVPTX` emits masked
# accesses per lane instead; this catches IR text handed to `emit_ptx` directly.
_REFUSED: dict[str, str] = {
    "masked.load": "LLVM's NVPTX backend aborts on masked loads whose mask becomes constant "
                   "(emit per-lane predicated loads instead, as CodegenNVPTX does)",
}
_DECLARE = re.compile(r'^declare\b[^@\n]*@"?(llvm\.[A-Za-z0-9_.$]+)"?\s*\(', re.M)
_EXTERN = re.compile(r"\.extern\s+\.func\b[^;]*?([A-Za-z_$.][\w$.]*)\s*\(", re.S)


def _lookup(name: str) -> Needs | None:
    """The requirement of ``llvm.<name>``; None when no table entry covers it."""
    short = name[len("llvm."):]
    for key, needs in INTRINSICS.items():
        if short.startswith(key) if key.endswith(".") else short == key:
            return needs
    if not short.startswith("nvvm."):
        for base in _GENERIC:
            if short == base or short.startswith(base + "."):
                return Needs()
    return None


def check_intrinsics(ir_text: str, target: Target) -> None:
    """Raise TecompError for an intrinsic ``target``'s arch lacks or nobody knows.

    Runs on the IR text, before LLVM parses it: LLVM itself would abort the process.
    """
    gpu = target.gpu
    for name in sorted(set(_DECLARE.findall(ir_text))):
        short = name[len("llvm."):]
        why = next((w for base, w in _REFUSED.items()
                    if short == base or short.startswith(base + ".")), None)
        if why is not None:
            raise TecompError(f"intrinsic {name!r} cannot be compiled for {target}: {why}")
        needs = _lookup(name)
        if needs is None:
            what = "NVVM intrinsic" if name.startswith("llvm.nvvm.") else "intrinsic"
            raise TecompError(
                f"unknown {what} {name!r}: tecomp's table of intrinsics the NVPTX backend can "
                "lower does not list it (misspelled? math functions go through libdevice)")
        if gpu.compute_capability < needs.cc or (needs.arch_specific and not gpu.arch.endswith("a")):
            want = f"sm_{needs.cc[0]}{needs.cc[1]}" + ("a" if needs.arch_specific else "")
            raise TecompError(f"intrinsic {name!r} needs {want} or newer, but the target is "
                              f"{target}: LLVM cannot generate it for {gpu.arch}")


def check_ptx(ptx: str) -> None:
    """Reject PTX calling functions nobody defines (LLVM emits a misspelled intrinsic as one)."""
    for name in _EXTERN.findall(ptx):
        if name.startswith("llvm."):
            raise TecompError(f"the PTX calls the undefined function {name}: LLVM did not know "
                              "this intrinsic (misspelled, or not in this LLVM version)")
        raise TecompError(f"the PTX calls the undefined function {name!r} (an extern function "
                          "that no linked library defines)")


# ---- target machine and PTX emission -----------------------------------------------------------
_init_lock = threading.Lock()


@functools.cache
def _init_nvptx() -> None:
    # Not llvm.initialize() (an error in llvmlite 0.50); the native target is initialised
    # separately by llvm_jit, and initialising all targets is idempotent.
    with _init_lock:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()


@functools.lru_cache(maxsize=16)
def nvptx_target_machine(target: Target) -> llvm.TargetMachine:
    """The (cached) NVPTX TargetMachine of a cuda target: cpu = the arch, features = PTX ISA."""
    if not target.is_gpu:
        raise TecompError(f"target '{target}' is not a cuda target")
    _init_nvptx()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3)


def emit_ptx(module_or_ir_text: ir.Module | str, target: Target) -> str:
    """PTX for an LLVM module (llvmlite ``ir.Module`` or IR text) and a cuda ``target``.

    Checks intrinsics (`check_intrinsics`), verifies, links libdevice when a kernel calls
    ``__nv_*``, runs the O3 pipeline and emits PTX, which `check_ptx` then checks.
    """
    text = str(module_or_ir_text)
    check_intrinsics(text, target)
    tm = nvptx_target_machine(target)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"internal error: generated LLVM IR is invalid: {e}") from None
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    if needs_libdevice(mod):
        link_libdevice(mod, tm)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    ptx = tm.emit_assembly(mod)
    check_ptx(ptx)
    return ptx


# ---- code generation ---------------------------------------------------------------------------
@dataclass
class KernelInfo:
    """What the runtime needs to know about a generated kernel beyond its signature."""

    name: str
    launch: dict[str, E.Expr]  # tag -> launch extent (tags not listed: 1)
    threads: int  # threads per block (product of the threadIdx extents)
    shared_bytes: int  # static shared memory, bytes (0 when the kernel's is dynamic)
    param_align: list[int]  # bytes each buffer argument's address must be a multiple of
    # dynamic shared memory a launch must pass (sharedMemBytes; above 48 KB with the opt-in
    # attribute set), bytes: the kernel's whole shared memory when it exceeds the static limit
    dynamic_shared_bytes: int = 0


class CodegenNVPTX(AsyncCopyMixin, TensorCoreMixin, CodegenLLVM):
    """Generates one ``nvptx64-nvidia-cuda`` LLVM module from lowered GPU PrimFuncs.

    ``kernels`` describes each generated kernel (`KernelInfo`); ``error_global`` names the i32
    device global a kernel sets to a nonzero `ErrorCode` (integer division by zero).
    """

    backend_name: ClassVar[str] = "NVPTX"

    def __init__(self, target: Target, debug: bool = False, module_name: str = "tecomp") -> None:
        if not target.is_gpu:
            raise CodegenError(f"CodegenNVPTX needs a cuda target, got '{target}'")
        if debug:
            raise CodegenError("bounds-checked (debug) builds are not supported for cuda targets "
                               "yet; use f.emulate(...) to find out-of-bounds accesses")
        super().__init__(target, debug, module_name)
        self.kernels: dict[str, KernelInfo] = {}
        self.error_global = ERROR_GLOBAL
        self._launch: dict[str, E.Expr] = {}
        self._sregs: dict[str, ir.Value] = {}
        self._guards: list[str] = []  # threadIdx loops whose guard encloses the current code
        self._smem = 0
        self._n_shared = 0
        self._dynamic = False  # the current kernel's shared memory is the dynamic area

    def data_layout(self) -> str:
        return str(nvptx_target_machine(self.target).target_data)

    # function frame -------------------------------------------------------------------------
    def add_function(self, func: S.PrimFunc) -> ir.Function:
        """Generate ``func`` (docs/gpu-ir.md) as a ``ptx_kernel`` of the module."""
        self.check_kernel(func)
        launch, threads = self._launch_extents(func)
        total = self._check_shared(func)
        self._launch, self._sregs, self._guards, self._smem = launch, {}, [], 0
        self._dynamic = uses_dynamic_shared(total, self.target.gpu.static_smem)
        nb = len(func.params)
        # scalar parameters (te.vars that are no dim) by value in their own type, after the
        # dims, as on the CPU: i32 -> .param .u32, float -> .param .f32
        scalars = [llvm_type(v.dtype) for v in c_scalar_params(func)]
        fnty = ir.FunctionType(VOID, [PTR] * nb + [I64] * len(func.dim_vars) + scalars)
        fn = ir.Function(self.module, fnty, func.name)
        fn.calling_convention = "ptx_kernel"
        fn.attributes.add("nounwind")
        # llvmlite only knows valueless attributes; AttributeSet is a set of strings.
        set.add(fn.attributes, f'"nvvm.maxntid"="{threads}"')
        # With .maxntid alone ptxas sizes registers for a full SM of such blocks (64 threads:
        # 32 blocks, 32 registers each) and spills; one block per SM at least, as CUDA's
        # __launch_bounds__(T, 1), lets it use what the block needs.
        set.add(fn.attributes, '"nvvm.minctasm"="1"')
        self.name_params(func, fn)
        # The alignment promised for each buffer; LLVM derives vector access alignment from it.
        align = [_param_align(buf) for buf in func.params]
        for arg, a in zip(fn.args, align, strict=False):
            arg.attributes.align = a
        self.begin_function(fn, err=None, in_parallel=False)
        self.bind_params(func, fn)
        self.stmt(func.body)
        self.b.ret_void()
        self.end_function()
        if self._smem != total:  # gpu_shared's rule is what launches and manifests rely on
            raise CodegenError(f"internal error: kernel {func.name} allocated {self._smem} bytes "
                               f"of shared memory, but its layout has {total}")
        dynamic = self._smem if self._dynamic else 0
        self.kernels[func.name] = KernelInfo(func.name, launch, threads, self._smem - dynamic,
                                             align, dynamic)
        return fn

    def _check_shared(self, func: S.PrimFunc) -> int:
        """The kernel's shared memory in bytes (`gpu_shared.shared_bytes`); a CodegenError
        above the arch's opt-in maximum per block."""
        total = shared_bytes(func)
        gpu = self.target.gpu
        if total > gpu.max_dynamic_smem:
            detail = ", ".join(f"{n} {b} B" for n, b in shared_allocations(func))
            raise CodegenError(
                f"kernel {func.name} declares {total} bytes of shared memory ({detail}); "
                f"{gpu.arch} allows {gpu.max_dynamic_smem} bytes per block ({gpu.static_smem} "
                "static, the rest as dynamic shared memory by opt-in)")
        return total

    def _launch_extents(self, func: S.PrimFunc) -> tuple[dict[str, E.Expr], int]:
        launch = func.attrs.get("launch")
        if not isinstance(launch, dict):
            raise CodegenError(f"GPU kernel {func.name} has no attrs['launch'] (a dict from "
                               "'blockIdx.x'/'threadIdx.x'... to launch extents)")
        gpu = self.target.gpu
        threads = 1
        for tag, ext in launch.items():
            if tag not in THREAD_TAGS:
                raise CodegenError(f"kernel {func.name}: unknown launch tag {tag!r}; expected one "
                                   f"of {', '.join(THREAD_TAGS)}")
            axis = "xyz".index(tag[-1])
            if tag.startswith("threadIdx"):
                if not isinstance(ext, E.IntImm) or ext.value < 1:
                    raise CodegenError(f"kernel {func.name}: the launch extent of {tag} must be a "
                                       f"positive constant, got {ext}")
                if ext.value > gpu.max_block_dims[axis]:
                    raise CodegenError(f"kernel {func.name}: {tag} extent {ext.value} exceeds "
                                       f"{gpu.max_block_dims[axis]} on {gpu.arch}")
                threads *= ext.value
            elif isinstance(ext, E.IntImm) and not 1 <= ext.value <= gpu.max_grid_dims[axis]:
                raise CodegenError(f"kernel {func.name}: {tag} extent {ext.value} is outside "
                                   f"[1, {gpu.max_grid_dims[axis]}]")
        if threads > gpu.max_threads_per_block:
            raise CodegenError(f"kernel {func.name} launches {threads} threads per block; "
                               f"{gpu.arch} allows {gpu.max_threads_per_block}")
        return dict(launch), threads

    def new_error_slot(self, entry: ir.IRBuilder) -> ir.Value:
        g = self.module.globals.get(ERROR_GLOBAL)
        if g is None:
            g = ir.GlobalVariable(self.module, I32, ERROR_GLOBAL, addrspace=1)
            g.type = ir.PointerType(addrspace=1)  # llvmlite would print a typed pointer
            g.initializer = ir.Constant(I32, 0)
            g.align = 4
        # A generic pointer like every other buffer; unused casts are deleted by the optimiser.
        return entry.addrspacecast(g, PTR, name="err")

    # statements -----------------------------------------------------------------------------
    def parallel_for(self, s: S.For) -> bool:
        raise CodegenError(f"loop '{s.var.name}' is PARALLEL, which GPU kernels do not have; bind "
                           "it to blockIdx/threadIdx instead")

    def _sreg(self, tag: str) -> ir.Value:
        """The hardware index of ``tag`` (i32), read once per kernel in the entry block."""
        v = self._sregs.get(tag)
        if v is None:
            kind, axis = tag.split(".")
            fn = declare(self.module, f"llvm.nvvm.read.ptx.sreg.{_SREG[kind]}.{axis}",
                         ir.FunctionType(I32, []))
            v = self.st.entry.call(fn, [], name=tag.replace(".", "_"))
            self._sregs[tag] = v
        return v

    def thread_binding_for(self, s: S.For) -> None:
        tag = S.thread_tag(s)
        if tag not in THREAD_TAGS:
            raise CodegenError(f"loop '{s.var.name}' is THREAD_BINDING with tag {tag!r}; expected "
                               f"one of {', '.join(THREAD_TAGS)}")
        launch = self._launch.get(tag, E.IntImm(1, "int32"))
        need_guard = not self._covers(s, tag, launch)
        b = self.b
        idx = cast(b, self._sreg(tag), "int32", s.var.dtype)
        lo = self.expr(s.min)
        var = idx if _is_zero(s.min) else b.add(idx, cast(b, lo, s.min.dtype, s.var.dtype))
        prev = self.bind_var(s.var, var)
        if need_guard:
            ext = cast(b, self.expr(s.extent), s.extent.dtype, s.var.dtype)
            guarded = tag.startswith("threadIdx")
            if guarded:
                self._guards.append(f"{s.var.name} < {s.extent} ({tag} launches {launch})")
            with b.if_then(b.icmp_signed("<", idx, ext)):
                self.stmt(s.body)
            if guarded:
                self._guards.pop()
        else:
            self.stmt(s.body)
        self.unbind_var(s.var, prev)

    def _covers(self, s: S.For, tag: str, launch: E.Expr) -> bool:
        """Whether every index the launch gives ``tag`` is inside the loop (no guard needed)."""
        if isinstance(s.extent, E.IntImm) and isinstance(launch, E.IntImm):
            if s.extent.value > launch.value:
                raise CodegenError(f"loop '{s.var.name}' bound to {tag} has extent {s.extent.value}"
                                   f" but the kernel launches {launch.value}: iterations would "
                                   "never run")
            return s.extent.value == launch.value
        return bool(structural_equal(s.extent, launch))

    def _allocate(self, s: S.Allocate) -> None:
        buf = s.buffer
        if buf.scope in _FRAGMENT_SCOPES:
            self._allocate_fragment(s)
            return
        memty = llvm_type(dt.element(buf.dtype), memory=True)
        n = const_elements(buf)
        if buf.scope not in ("shared", "local"):
            raise CodegenError(f"buffer '{buf.name}' of scope {buf.scope!r} cannot be allocated "
                               "inside a GPU kernel; use scope 'shared' or 'local'")
        if n is None:
            raise CodegenError(
                f"{buf.scope} buffer '{buf.name}' has the non-constant shape "
                f"({', '.join(map(str, buf.shape))}): {buf.scope} memory in a GPU kernel must have "
                "a size known at compile time")
        arrty = ir.ArrayType(memty, max(n, 1))
        if buf.scope == "shared" and self._dynamic:
            ptr = self._dynamic_shared(buf, max(n, 1) * dt.itemsize(buf.dtype))
        elif buf.scope == "shared":
            # One array per block in shared memory; a generic pointer to it is what the memory
            # code uses, and address-space inference turns its accesses into ld/st.shared.
            self._n_shared += 1
            name = re.sub(r"\W", "_", f"{self.st.fn.name}_{buf.name}_shared{self._n_shared}")
            g = ir.GlobalVariable(self.module, arrty, name, addrspace=3)
            g.type = ir.PointerType(addrspace=3)
            g.linkage = "internal"
            g.align = SHARED_ALIGN
            g.initializer = ir.Constant(arrty, ir.Undefined)  # shared memory has no initializer
            nbytes = max(n, 1) * dt.itemsize(buf.dtype)
            self._smem += -(-nbytes // SHARED_ALIGN) * SHARED_ALIGN
            ptr = self.st.entry.addrspacecast(g, PTR, name=buf.name)
        else:
            # Per thread; SROA keeps constant-indexed arrays in registers.
            ptr = opaque(self.st.entry.alloca(arrty, name=buf.name))
            ptr.align = SHARED_ALIGN
        self.bind_buffer(buf, ptr, None)
        self.stmt(s.body)
        del self.st.bufs[buf.data]

    def _dynamic_shared(self, buf: Buffer, nbytes: int) -> ir.Value:
        """A generic pointer to ``buf``'s place in the kernel's dynamic shared area: the next
        `SHARED_ALIGN`-aligned offset (allocations in the order codegen meets them, no reuse:
        `gpu_shared`). The area is the module's ``extern .shared .align 16 .b8 []``; its base
        is 16-byte aligned, so every buffer keeps the alignment `access_align` claims for
        shared memory (float4, cp.async.cg, ldmatrix rows)."""
        g = self.module.globals.get(DYNAMIC_SHARED_SYMBOL)
        if g is None:
            arrty = ir.ArrayType(ir.IntType(8), 0)
            g = ir.GlobalVariable(self.module, arrty, DYNAMIC_SHARED_SYMBOL, addrspace=3)
            g.type = ir.PointerType(addrspace=3)  # llvmlite would print a typed pointer
            g.linkage = "external"
            g.align = SHARED_ALIGN
        off = self._smem
        self._smem += -(-nbytes // SHARED_ALIGN) * SHARED_ALIGN
        p = self.st.entry.gep(g, [ir.Constant(I64, off)], inbounds=True,
                              source_etype=ir.IntType(8), name=f"{buf.name}.dyn")
        return self.st.entry.addrspacecast(p, PTR, name=buf.name)

    # memory accesses ------------------------------------------------------------------------
    def access_align(self, buf: Buffer, index: E.Expr, el: str) -> int:
        """The alignment an access can claim: its buffer's (shared arrays and allocas are
        ``SHARED_ALIGN``-aligned here, arguments ``_param_align``) where the index provably keeps
        it, `pow2_divisor` of the first lane's element offset times the element size. Without
        it LLVM only sees ``align 4`` on a float4 access of shared memory (address-space
        inference hides the array's own alignment) and splits it into 4 scalar accesses."""
        size = dt.itemsize(el)
        base = SHARED_ALIGN if buf.scope in ("shared", "local") else _param_align(buf)
        if isinstance(index, E.Ramp):
            if not (isinstance(index.stride, E.IntImm) and index.stride.value == 1):
                return size  # a gather/scatter: each lane only has its element's alignment
            index = index.base
        if dt.lanes(index.dtype) != 1 or base <= size:
            return size
        return max(size, min(base, size * pow2_divisor(index, cap=base)))

    # masked memory accesses -----------------------------------------------------------------
    def _masked(self, op: str, vty: ir.Type, args: list[ir.Value]) -> ir.Value:
        """A masked load/store/gather/scatter (`memory.MemoryMixin` operands) without the
        ``llvm.masked.*`` intrinsics: per-lane predicated scalar accesses, and for contiguous
        accesses one plain vector access when every lane is active.

        LLVM 22's NVPTX backend lowers an ``llvm.masked.load`` whose mask is a constant (which
        the optimiser often makes of a vector tail's mask) as a full vector load with a
        used-bytes mask; that lowering aborts the process on a passthru that is not poison, on
        a mask it finds all on or all off, and on the 1-lane piece of an odd vector (3 lanes:
        "Do not know how to scalarize"). Whether the mask becomes constant is only known after
        optimisation, so no form of the intrinsic is safe; this is what LLVM's own
        scalarisation of a variable mask would give, plus the vector fast path.
        """
        load = op in ("load", "gather")
        if load:
            addr, align_c, mask, passthru = args
            value: ir.Value | None = None
            elty = vty.element
        else:
            value, addr, align_c, mask = args
            passthru = value
            elty = value.type.element
        align = align_c.constant
        known = _lane_constants(mask)
        contiguous = op in ("load", "store")
        b = self.b

        def lane_ptr(i: int) -> ir.Value:
            lane = ir.Constant(I32, i)
            if contiguous:
                return b.gep(addr, [lane], inbounds=True, source_etype=elty)
            if (isinstance(addr, ir.GEPInstr) and len(addr.indices) == 1
                    and isinstance(addr.indices[0].type, ir.VectorType)):
                # Rebuild the lane's address from the base pointer: address-space inference
                # does not look through an extractelement of a vector GEP, and the access
                # would become a generic ld/st instead of ld.global/ld.shared.
                idx = b.extract_element(addr.indices[0], lane)
                return b.gep(addr.pointer, [idx], inbounds=addr.inbounds,
                             source_etype=addr.source_etype)
            return b.extract_element(addr, lane)

        def vector() -> ir.Value:
            if load:
                return b.load(addr, typ=vty, align=align)
            b.store(value, addr, align=align)
            return passthru

        def per_lane() -> ir.Value:
            if load:
                return self._per_lane_load(lane_ptr, elty, align, mask, passthru, known)
            assert value is not None
            self._per_lane_store(lane_ptr, value, align, mask, known)
            return passthru

        if contiguous and all(k is True for k in known):
            return vector()
        if not contiguous or any(k is not None for k in known):
            return per_lane()  # nothing to gain from a vector access (or known partial lanes)
        # One reduction (NVPTX lowers it for any lane count, odd ones included).
        active = call_intrinsic(b, "vector.reduce.and", [mask], ret=I1)
        if load:
            return self.if_value(active, vector, per_lane)
        with b.if_else(active) as (then, otherwise):
            with then:
                vector()
            with otherwise:
                per_lane()
        return passthru

    def _per_lane_load(self, lane_ptr: Callable[[int], ir.Value], elty: ir.Type, align: int,
                       mask: ir.Value, passthru: ir.Value, known: list[bool | None]) -> ir.Value:
        """``passthru`` with each active lane ``i`` loaded from ``lane_ptr(i)``, each under a
        branch on its mask bit (no load of an inactive lane is ever executed)."""
        b = self.b
        v = passthru
        for i, k in enumerate(known):
            lane = ir.Constant(I32, i)
            if k is False:
                continue
            la = _lane_align(align, i, elty)
            if k is True:
                v = b.insert_element(v, b.load(lane_ptr(i), typ=elty, align=la), lane)
                continue
            pre = b.block
            with b.if_then(b.extract_element(mask, lane)):
                loaded = b.insert_element(v, b.load(lane_ptr(i), typ=elty, align=la), lane)
                then_end = b.block
            phi = b.phi(v.type)
            phi.add_incoming(loaded, then_end)
            phi.add_incoming(v, pre)
            v = phi
        return v

    def _per_lane_store(self, lane_ptr: Callable[[int], ir.Value], value: ir.Value, align: int,
                        mask: ir.Value, known: list[bool | None]) -> None:
        """Store each active lane ``i`` of ``value`` to ``lane_ptr(i)`` under its mask bit."""
        b = self.b
        for i, k in enumerate(known):
            lane = ir.Constant(I32, i)
            if k is False:
                continue
            la = _lane_align(align, i, value.type.element)
            if k is True:
                b.store(b.extract_element(value, lane), lane_ptr(i), align=la)
                continue
            with b.if_then(b.extract_element(mask, lane)):
                b.store(b.extract_element(value, lane), lane_ptr(i), align=la)

    # expressions ----------------------------------------------------------------------------
    def target_call(self, e: E.Call) -> ir.Value | None:
        if e.name == "shfl_xor_sync":
            return self._shfl_xor(e)
        if e.name in _MMA_CALLS:
            return self._tensor_core_call(e)
        if e.name in (S.CP_ASYNC_COMMIT, S.CP_ASYNC_WAIT):
            return self._cp_async_group(e)
        if e.name != S.BARRIER:
            return None
        if self._guards:
            raise CodegenError(
                f"barrier inside the guard {self._guards[-1]}: threads outside the loop's extent "
                "would never reach it (a divergent __syncthreads); move the barrier out of the "
                "loop or make its extent the launch extent")
        fn = declare(self.module, "llvm.nvvm.barrier.cta.sync.aligned.all",
                     ir.FunctionType(VOID, [I32]))
        self.b.call(fn, [ir.Constant(I32, 0)])
        return ir.Constant(I32, 0)

    def _shfl_xor(self, e: E.Call) -> ir.Value:
        """``__shfl_xor_sync(mask, value, lane_mask, width)`` on a 32-bit value."""
        if self._guards:
            raise CodegenError(
                f"warp shuffle inside the guard {self._guards[-1]}: threads outside the loop's "
                "extent would not take part (a divergent shfl.sync)")
        mask, value, lane, width = e.args
        if dt.lanes(e.dtype) != 1 or dt.itemsize(e.dtype) != 4:
            raise CodegenError(f"shfl_xor_sync moves 32-bit scalars, got {e.dtype}: {e}")
        if not isinstance(width, E.IntImm) or width.value not in (1, 2, 4, 8, 16, 32):
            raise CodegenError(f"shfl_xor_sync width must be a constant power of two <= 32: {e}")
        flt = dt.is_float(e.dtype)
        ty = llvm_type("float32") if flt else I32
        fn = declare(self.module, f"llvm.nvvm.shfl.sync.bfly.{'f32' if flt else 'i32'}",
                     ir.FunctionType(ty, [I32, ty, I32, I32]))
        v = self.expr(value)
        if not flt and v.type != I32:
            raise CodegenError(f"shfl_xor_sync of {e.dtype} is not supported: {e}")
        # PTX's c operand: segment mask in bits 8-12 (lanes outside the width), clamp 0x1f
        clamp = ir.Constant(I32, ((32 - width.value) << 8) | 0x1F)
        m, ln = self.expr(mask), self.expr(lane)
        if m.type != I32 or ln.type != I32:
            raise CodegenError(f"shfl_xor_sync takes a 32-bit mask and lane mask: {e}")
        return self.b.call(fn, [m, v, ln, clamp])

    def extern_call(self, e: E.Call) -> ir.Value:
        # llvm.* (te.call_llvm_intrin): declared as named; emit_ptx's check_intrinsics vets it
        if not e.name.startswith(("__nv_", "llvm.")):
            raise CodegenError(f"extern function {e.name!r} cannot be called from a GPU kernel "
                               "(only libdevice's __nv_* functions are linked)")
        return super().extern_call(e)

    def math_call(self, name: str, args: list[ir.Value], dtypes: list[str],
                  ret_dtype: str) -> ir.Value:
        return emit_gpu_math_call(self.b, name, args, dtypes, ret_dtype)



def _lane_align(align: int, lane: int, elty: ir.Type) -> int:
    """The alignment of lane ``lane`` of a contiguous access whose first lane has ``align``:
    the largest power of two dividing both ``align`` and the lane's byte offset."""
    size = elty.width // 8 if isinstance(elty, ir.IntType) else _FLOAT_BYTES.get(str(elty), 1)
    off = lane * size  # an unknown type counts as 1 byte: a smaller claim is always safe
    while off % align:
        align //= 2
    return align


_FLOAT_BYTES = {"half": 2, "bfloat": 2, "float": 4, "double": 8}


def _is_zero(e: E.Expr) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def _lane_constants(mask: ir.Value) -> list[bool | None]:
    """Each lane of an i1 vector ``mask``: True/False where it is a constant, else None."""
    n = mask.type.count
    if isinstance(mask, ir.Constant):
        c = mask.constant
        if isinstance(c, (list, tuple)) and len(c) == n:
            return [bool(x.constant) if isinstance(x, ir.Constant) and isinstance(x.constant, int)
                    else None for x in c]
    return [None] * n


def codegen_nvptx(funcs: list[S.PrimFunc], target: Target,
                  module_name: str = "tecomp") -> CodegenNVPTX:
    """Generate the module holding ``funcs`` (``.module``; ``.kernels`` describes them)."""
    cg = CodegenNVPTX(target, module_name=module_name)
    for f in funcs:
        cg.add_function(f)
    return cg


__all__ = ["ERROR_GLOBAL", "INTRINSICS", "CodegenNVPTX", "KernelInfo", "Needs", "check_intrinsics",
           "check_ptx", "codegen_nvptx", "emit_ptx", "nvptx_target_machine"]
