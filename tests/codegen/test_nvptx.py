"""The NVPTX backend on GPU kernels built by hand under the IR contract of docs/gpu-ir.md.

Each kernel is generated, optimised to PTX and assembled by ptxas for sm_80 and sm_90 (no GPU
needed): ptxas must accept it, report no spills, registers > 0 and exactly the shared memory the
kernel allocates. Anything that could make LLVM abort the process (an intrinsic the arch lacks,
masked vector accesses) runs in a subprocess or a forked child, so a regression shows up as a
failed test, not a dead test run. Without a GPU, what the generated code computes is checked by
running its LLVM IR on the host (`ir_on_host`) next to the emulator (which runs the loop nest).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tecomp.codegen import libdevice
from tecomp.codegen.llvm_cpu import CodegenCPU
from tecomp.codegen.llvm_nvptx import CodegenNVPTX, check_ptx, emit_ptx
from tecomp.codegen.ptxas import (
    PtxasError,
    compile_cubin,
    find_ptxas,
    parse_resources,
    ptxas_resources,
)
from tecomp.codegen.target import Target
from tecomp.errors import CodegenError, TecompError
from tecomp.ir import Allocate, Buffer, BufferStore, Expr, For, ForKind, IfThenElse, PrimFunc, Var, seq
from tecomp.ir.expr import BufferLoad, Call, FloatImm, IntImm, Ramp
from tecomp.ir.stmt import barrier

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not found")
needs_libdevice = pytest.mark.skipif(libdevice.find_libdevice() is None,
                                     reason="libdevice (CUDA toolkit) not found")
ARCHS = ["sm_80", "sm_90"]

# IR builders -------------------------------------------------------------------------------


def imm(v: int | Expr) -> Expr:
    return IntImm(v) if isinstance(v, int) else v


def ld(b: Buffer, i: Expr | int) -> BufferLoad:
    return BufferLoad(b, (imm(i),))


def st(b: Buffer, i: Expr | int, v: Expr) -> BufferStore:
    return BufferStore(b, v, (imm(i),))


def bind(v: Var, tag: str, extent: int | Expr, body: object) -> For:
    """A THREAD_BINDING loop: ``v`` is the hardware index ``tag``."""
    return For(v, IntImm(0), imm(extent), ForKind.THREAD_BINDING, body,  # type: ignore[arg-type]
               (("thread_tag", tag),))


def serial(v: Var, extent: int | Expr, body: object) -> For:
    return For(v, IntImm(0), imm(extent), ForKind.SERIAL, body)  # type: ignore[arg-type]


def kernel(name: str, params: list[Buffer], body: object, launch: dict[str, int | Expr],
           dims: tuple[Var, ...] = ()) -> PrimFunc:
    return PrimFunc(name, params, body, list(dims),  # type: ignore[arg-type]
                    {"launch": {k: imm(v) for k, v in launch.items()}})


def f32(name: str, *shape: int | Expr, scope: str = "global") -> Buffer:
    return Buffer(name, tuple(imm(s) for s in shape), "float32", scope=scope)


def call(name: str, *args: Expr) -> Call:
    return Call(args[0].dtype, name, args)


# the kernels of the brief --------------------------------------------------------------------


def elementwise_add() -> tuple[PrimFunc, int]:
    """C = A + B over n elements, 128 threads per block, ceil(n/128) blocks, tail guard."""
    n = Var("n", "int64")
    A, B, C = f32("A", n), f32("B", n), f32("C", n)
    bx, tx = Var("bx"), Var("tx")
    blocks = ((n + 127) // 128).astype("int32")
    i = bx * 128 + tx
    body = IfThenElse(i.astype("int64") < n, st(C, i, ld(A, i) + ld(B, i)))
    f = kernel("vadd", [A, B, C], bind(bx, "blockIdx.x", blocks, bind(tx, "threadIdx.x", 128, body)),
               {"blockIdx.x": blocks, "threadIdx.x": 128}, (n,))
    return f, 0


def tiled_transpose() -> tuple[PrimFunc, int]:
    """B = A^T for 1024x512 through a padded 32x33 shared tile; 32x8 threads, 4 rows each."""
    n, m, t = 1024, 512, 32
    A, B = f32("A", n, m), f32("B", m, n)
    tile = f32("tile", t * (t + 1), scope="shared")
    bx, by, tx, ty, k = Var("bx"), Var("by"), Var("tx"), Var("ty"), Var("k")
    row = ty + k * 8

    def threads(body: object) -> For:
        return bind(ty, "threadIdx.y", 8, bind(tx, "threadIdx.x", t, serial(k, 4, body)))

    load = threads(st(tile, row * (t + 1) + tx, ld(A, (by * t + row) * m + bx * t + tx)))
    store = threads(st(B, (bx * t + row) * n + by * t + tx, ld(tile, tx * (t + 1) + row)))
    body = bind(by, "blockIdx.y", n // t, bind(bx, "blockIdx.x", m // t,
                Allocate(tile, seq(load, barrier(), store))))
    f = kernel("transpose", [A, B], body,
               {"blockIdx.x": m // t, "blockIdx.y": n // t, "threadIdx.x": t, "threadIdx.y": 8})
    return f, t * (t + 1) * 4


def block_reduce() -> tuple[PrimFunc, int]:
    """out[b] = sum(A[b*256 : b*256+256]): a shared-memory tree with a barrier per level."""
    nb, nt = 64, 256
    A, out = f32("A", nb * nt), f32("out", nb)
    red = f32("red", nt, scope="shared")
    bx, tx, s, t0 = Var("bx"), Var("tx"), Var("s"), Var("t0")
    half = Call("int32", "shift_right", (IntImm(nt // 2), s))
    step = seq(bind(tx, "threadIdx.x", nt,
                    IfThenElse(tx < half, st(red, tx, ld(red, tx) + ld(red, tx + half)))),
               barrier())
    body = seq(bind(tx, "threadIdx.x", nt, st(red, tx, ld(A, bx * nt + tx))),
               barrier(),
               serial(s, 8, step),
               # extent 1 < launch 256: only thread 0 writes (guarded, no barrier inside)
               bind(t0, "threadIdx.x", 1, st(out, bx, ld(red, 0))))
    f = kernel("reduce", [A, out], bind(bx, "blockIdx.x", nb, Allocate(red, body)),
               {"blockIdx.x": nb, "threadIdx.x": nt})
    return f, nt * 4


def math_kernel(dtype: str = "float32") -> tuple[PrimFunc, int]:
    """Y = exp(X) + tanh(X) + erf(X) + pow(X, Z): libdevice functions."""
    n = 4096
    X, Z, Y = (Buffer(nm, (IntImm(n),), dtype) for nm in "XZY")
    bx, tx = Var("bx"), Var("tx")
    i = bx * 128 + tx
    x, z = ld(X, i), ld(Z, i)
    v = call("exp", x) + call("tanh", x) + call("erf", x) + call("pow", x, z)
    f = kernel(f"math_{dtype}", [X, Z, Y],
               bind(bx, "blockIdx.x", n // 128, bind(tx, "threadIdx.x", 128, st(Y, i, v))),
               {"blockIdx.x": n // 128, "threadIdx.x": 128})
    return f, 0


def float4_copy() -> tuple[PrimFunc, int]:
    """C = A * B with one float4 load/store per thread (flat Ramp indices of 4 lanes)."""
    n = 1 << 16
    A, B, C = f32("A", n), f32("B", n), f32("C", n)
    bx, tx = Var("bx"), Var("tx")
    r = Ramp((bx * 256 + tx) * 4, IntImm(1), 4)
    f = kernel("vec4", [A, B, C], bind(bx, "blockIdx.x", n // 1024, bind(
        tx, "threadIdx.x", 256, BufferStore(C, BufferLoad(A, (r,)) * BufferLoad(B, (r,)), (r,)))),
        {"blockIdx.x": n // 1024, "threadIdx.x": 256})
    return f, 0


KERNELS: dict[str, Callable[[], tuple[PrimFunc, int]]] = {
    "elementwise_add": elementwise_add, "tiled_transpose": tiled_transpose,
    "block_reduce": block_reduce, "math": math_kernel, "float4": float4_copy,
}


def ptx_of(f: PrimFunc, arch: str) -> str:
    t = Target.parse(f"cuda -arch={arch}")
    cg = CodegenNVPTX(t)
    cg.add_function(f)
    return emit_ptx(cg.module, t)


# PTX accepted by ptxas ----------------------------------------------------------------------


@needs_ptxas
@needs_libdevice
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("which", list(KERNELS))
def test_kernel_assembles(which: str, arch: str) -> None:
    f, smem = KERNELS[which]()
    ptx = ptx_of(f, arch)
    assert f".target {arch}" in ptx
    assert re.search(rf"\.entry {f.name}\(", ptx)
    assert re.search(r"\.maxntid \d+", ptx)
    assert not re.search(r"\.extern\s+\.func", ptx)
    res = ptxas_resources(ptx, arch)[f.name]
    assert res.registers > 0
    assert (res.spill_stores, res.spill_loads) == (0, 0)
    assert res.shared_bytes == smem
    assert res.barriers == (1 if smem else 0)


@needs_ptxas
@needs_libdevice
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_math_other_float_types(dtype: str) -> None:
    f, _ = math_kernel(dtype)
    ptx = ptx_of(f, "sm_80")
    assert not re.search(r"\.extern\s+\.func", ptx)
    assert ptxas_resources(ptx, "sm_80")[f.name].registers > 0


def test_ptx_details() -> None:
    """What the generated PTX is made of: the instructions each construct must become."""
    f, _ = elementwise_add()
    ptx = ptx_of(f, "sm_80")
    assert ".maxntid 128" in ptx
    assert "%ctaid.x" in ptx and "%tid.x" in ptx
    assert re.search(r"ld\.global(\.nc)?\.b32", ptx) and "st.global.b32" in ptx
    assert "setp." in ptx  # the tail guard

    ptx = ptx_of(float4_copy()[0], "sm_80")
    assert re.search(r"ld\.global(\.nc)?\.v4\.(b32|f32)", ptx)
    assert re.search(r"st\.global\.v4\.(b32|f32)", ptx)
    assert ".maxntid 256" in ptx

    ptx = ptx_of(tiled_transpose()[0], "sm_90")
    assert ".shared .align 16 .b8" in ptx
    assert "st.shared" in ptx and "ld.shared" in ptx
    assert re.search(r"\bbar(rier)?\.sync\s+0;", ptx)
    assert ".maxntid 256" in ptx

    ptx = ptx_of(block_reduce()[0], "sm_80")
    assert len(re.findall(r"\bbar(rier)?\.sync\s+0;", ptx)) >= 2  # before and inside the loop


@needs_ptxas
def test_vector_widths_and_gathers() -> None:
    """8-byte Ramps become v2 accesses; strided Ramps (gathers) become scalar accesses."""
    n = 1 << 12
    A, C = f32("A", n), f32("C", n)
    bx, tx = Var("bx"), Var("tx")
    r2 = Ramp((bx * 256 + tx) * 2, IntImm(1), 2)
    rs = Ramp((bx * 256 + tx) * 8, IntImm(2), 4)
    body = seq(BufferStore(C, BufferLoad(A, (r2,)) + FloatImm(1.0), (r2,)),
               BufferStore(C, BufferLoad(A, (rs,)), (rs,)))
    f = kernel("v2", [A, C], bind(bx, "blockIdx.x", 4, bind(tx, "threadIdx.x", 256, body)),
               {"blockIdx.x": 4, "threadIdx.x": 256})
    ptx = ptx_of(f, "sm_80")
    assert re.search(r"ld\.global(\.nc)?\.v2\.b32", ptx) and re.search(r"st\.global\.v2\.b32", ptx)
    assert len(re.findall(r"st\.global\.b32", ptx)) == 4
    assert ptxas_resources(ptx, "sm_80")["v2"].spill_stores == 0


@needs_libdevice
def test_math_uses_libdevice() -> None:
    t = Target.parse("cuda -arch=sm_80")
    cg = CodegenNVPTX(t)
    cg.add_function(math_kernel()[0])
    text = str(cg.module)
    for fn in ("__nv_expf", "__nv_tanhf", "__nv_erff", "__nv_powf"):
        assert f'@"{fn}"' in text
    ptx = emit_ptx(text, t)  # IR text works too
    assert "__nv_" not in ptx  # linked and inlined (libdevice's functions are alwaysinline)
    assert not re.search(r"\.extern\s+\.func", ptx)


def test_ir_contract_details() -> None:
    """Calling convention, attributes and address spaces of the generated LLVM IR."""
    t = Target.parse("cuda -arch=sm_80")
    cg = CodegenNVPTX(t)
    cg.add_function(tiled_transpose()[0])
    cg.add_function(elementwise_add()[0])
    text = str(cg.module)
    assert cg.module.triple == "nvptx64-nvidia-cuda"
    assert cg.module.data_layout.startswith("e-")
    assert 'define ptx_kernel void @"transpose"(ptr noalias align 16 %"A"' in text
    assert '"nvvm.maxntid"="256"' in text and '"nvvm.maxntid"="128"' in text
    assert re.search(r'internal addrspace\(3\) global \[1056 x float\] undef, align 16', text)
    assert "llvm.nvvm.barrier.cta.sync.aligned.all" in text
    assert "i64 %\"n\"" in text  # dims are i64 parameters
    assert "nvvm.annotations" not in text
    assert cg.kernels["transpose"].shared_bytes == 32 * 33 * 4
    assert cg.kernels["vadd"].threads == 128


def test_thread_guard_only_when_extent_differs() -> None:
    A = f32("A", 256)
    tx = Var("tx")
    t = Target.parse("cuda -arch=sm_80")
    for ext, guarded in ((256, False), (200, True)):
        cg = CodegenNVPTX(t)
        cg.add_function(kernel("k", [A], bind(tx, "threadIdx.x", ext, st(A, tx, FloatImm(1.0))),
                               {"threadIdx.x": 256}))
        assert ("icmp slt" in str(cg.module)) == guarded
    cg = CodegenNVPTX(t)
    with pytest.raises(CodegenError, match="never run"):
        cg.add_function(kernel("k", [A], bind(tx, "threadIdx.x", 300, st(A, tx, FloatImm(1.0))),
                               {"threadIdx.x": 256}))


def test_integer_division_by_zero_sets_the_error_global() -> None:
    A = Buffer("A", (IntImm(128),), "int32")
    tx = Var("tx")
    f = kernel("div", [A], bind(tx, "threadIdx.x", 128, st(A, tx, ld(A, tx) // ld(A, 0))),
               {"threadIdx.x": 128})
    ptx = ptx_of(f, "sm_80")
    assert ".visible .global .align 4 .u32 __tecomp_error" in ptx
    assert re.search(r"atom\.(global\.)?exch", ptx)


# errors -------------------------------------------------------------------------------------


def test_shared_buffer_of_symbolic_size_is_an_error() -> None:
    n = Var("n", "int64")
    A = f32("A", n)
    sh = f32("sh", n, scope="shared")
    tx = Var("tx")
    f = kernel("k", [A], Allocate(sh, bind(tx, "threadIdx.x", 64, st(sh, tx, ld(A, tx)))),
               {"threadIdx.x": 64}, (n,))
    with pytest.raises(TecompError, match="shared buffer 'sh' has the non-constant shape"):
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(f)


def test_shared_memory_over_the_static_limit_is_an_error() -> None:
    # above the static 48 KB shared memory is dynamic (opt-in) up to the arch's maximum per
    # block, 166912 B (163 KiB) on sm_80: past that, codegen refuses naming both limits
    A = f32("A", 64)
    sh = f32("sh", 41 * 1024, scope="shared")  # 167936 B > 166912 B
    tx = Var("tx")
    f = kernel("k", [A], Allocate(sh, bind(tx, "threadIdx.x", 64, st(sh, tx, ld(A, tx)))),
               {"threadIdx.x": 64})
    with pytest.raises(CodegenError, match=r"kernel k declares 167936 bytes of shared memory \(sh 167936 B\); "
                                           r"sm_80 allows 166912 bytes per block \(49152 static"):
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(f)


def test_barrier_under_a_thread_guard_is_an_error() -> None:
    A = f32("A", 256)
    tx = Var("tx")
    f = kernel("k", [A], bind(tx, "threadIdx.x", 100, seq(st(A, tx, FloatImm(0.0)), barrier())),
               {"threadIdx.x": 128})
    with pytest.raises(CodegenError, match="divergent"):
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(f)


@pytest.mark.parametrize("launch, match", [
    (None, "no attrs\\['launch'\\]"),
    ({"threadIdx.x": 2048}, "exceeds 1024"),
    ({"threadIdx.x": 64, "threadIdx.y": 32}, "2048 threads per block"),
    ({"threadIdx.w": 64}, "unknown launch tag"),
])
def test_bad_launch_is_an_error(launch: dict[str, int] | None, match: str) -> None:
    A = f32("A", 64)
    f = PrimFunc("k", [A], st(A, 0, FloatImm(0.0)), [],
                 {} if launch is None else {"launch": {k: IntImm(v) for k, v in launch.items()}})
    with pytest.raises(CodegenError, match=match):
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(f)


def test_loop_kinds_the_target_lacks_are_errors() -> None:
    A = f32("A", 64)
    i = Var("i")
    par = For(i, IntImm(0), IntImm(64), ForKind.PARALLEL, st(A, i, FloatImm(0.0)))
    with pytest.raises(CodegenError, match="PARALLEL"):
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(kernel("k", [A], par, {}))
    bound = bind(i, "threadIdx.x", 64, st(A, i, FloatImm(0.0)))
    with pytest.raises(CodegenError, match="no GPU threads"):
        CodegenCPU(Target.host()).add_function(PrimFunc("k", [A], bound))
    with pytest.raises(CodegenError, match="cannot be called from a GPU kernel"):
        ext = Call("float32", "sinf", (FloatImm(1.0),), extern=True)
        CodegenNVPTX(Target.parse("cuda -arch=sm_80")).add_function(
            kernel("k", [A], st(A, 0, ext), {}))


def test_missing_libdevice_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv("TECOMP_LIBDEVICE", raising=False)
    monkeypatch.setattr(libdevice, "search_locations", lambda: [str(tmp_path)])
    with pytest.raises(TecompError, match=r"libdevice.*not found. Looked in:\n  .*"):
        ptx_of(math_kernel()[0], "sm_80")
    ptx_of(elementwise_add()[0], "sm_80")  # kernels without math do not need it


_ABORT_PROBE = r"""
import json, sys
from tecomp.codegen.llvm_nvptx import emit_ptx
from tecomp.codegen.target import Target
out = {}
for key, arch, name, ret in json.loads(sys.argv[1]):
    text = ('target triple = "nvptx64-nvidia-cuda"\n'
            'define ptx_kernel void @k(ptr %p) {\n'
            + (f'  %v = call {ret} @{name}()\n  store {ret} %v, ptr %p\n' if ret != 'void'
               else f'  call void @{name}()\n')
            + f'  ret void\n}}\ndeclare {ret} @{name}()\n')
    try:
        emit_ptx(text, Target.parse('cuda -arch=' + arch))
        out[key] = 'ok'
    except Exception as e:
        out[key] = type(e).__name__ + ': ' + str(e)
print(json.dumps(out))
"""


def test_intrinsics_the_arch_lacks_are_errors_not_aborts() -> None:
    """Each of these would make LLVM abort (or emit an unresolved call) without the table."""
    cases = [
        ["cp_async_sm75", "sm_75", "llvm.nvvm.cp.async.commit.group", "void"],
        ["cp_async_sm80", "sm_80", "llvm.nvvm.cp.async.commit.group", "void"],
        ["wgmma_sm90", "sm_90", "llvm.nvvm.wgmma.fence.sync.aligned", "void"],
        ["wgmma_sm90a", "sm_90a", "llvm.nvvm.wgmma.fence.sync.aligned", "void"],
        ["misspelled", "sm_80", "llvm.nvvm.read.ptx.sreg.tidd.x", "i32"],
        ["libm_exp", "sm_80", "llvm.exp.f32", "float"],
    ]
    p = subprocess.run([sys.executable, "-c", _ABORT_PROBE, json.dumps(cases)],
                       capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert p.returncode == 0, f"the process died (rc {p.returncode}): {p.stderr[-2000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cp_async_sm80"] == "ok" and out["wgmma_sm90a"] == "ok"
    assert out["cp_async_sm75"].startswith("TecompError") and "needs sm_80" in out["cp_async_sm75"]
    assert out["wgmma_sm90"].startswith("TecompError") and "needs sm_90a" in out["wgmma_sm90"]
    assert out["misspelled"].startswith("TecompError") and "unknown NVVM intrinsic" in out["misspelled"]
    assert out["libm_exp"].startswith("TecompError") and "libdevice" in out["libm_exp"]


def test_ptx_with_an_unresolved_intrinsic_is_rejected() -> None:
    ptx = (".version 7.0\n.target sm_80\n.address_size 64\n"
           ".extern .func  (.param .b32 func_retval0) llvm.nvvm.read.ptx.sreg.tidd.x\n()\n;\n")
    with pytest.raises(TecompError, match="llvm.nvvm.read.ptx.sreg.tidd.x"):
        check_ptx(ptx)
    with pytest.raises(TecompError, match="'foo'"):
        check_ptx(".extern .func foo\n(\n\t.param .b32 foo_param_0\n)\n;\n")


# ptxas --------------------------------------------------------------------------------------


def test_parse_resources() -> None:
    log = """ptxas info    : 4 bytes gmem, 8 bytes cmem[4]
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'a' for 'sm_80'
ptxas info    : Function properties for a
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4224 bytes smem, 376 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 5.113 ms
ptxas info    : Compiling entry function 'b' for 'sm_80'
ptxas info    : Function properties for b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 360 bytes cmem[0]
"""
    res = parse_resources(log, "sm_80")
    assert sorted(res) == ["a", "b"] and res.global_bytes == 4
    a, b = res["a"], res["b"]
    assert (a.registers, a.spill_stores, a.spill_loads, a.stack_frame) == (255, 12, 8, 16)
    assert (a.shared_bytes, a.constant_bytes, a.barriers, a.spills) == (4224, 384, 1, True)
    assert (b.registers, b.shared_bytes, b.constant_bytes, b.barriers, b.spills) == (12, 0, 360, 0, False)
    with pytest.raises(KeyError, match="no kernel 'c'"):
        res["c"]


@needs_ptxas
def test_ptxas_rejection_carries_its_message() -> None:
    bad = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n\tbogus.op;\n}\n"
    with pytest.raises(PtxasError, match=r"ptxas rejected the PTX for sm_80[\s\S]*<ptx>"):
        ptxas_resources(bad, "sm_80")


@needs_ptxas
def test_compile_cubin() -> None:
    ptx = ptx_of(elementwise_add()[0], "sm_80")
    cubin = compile_cubin(ptx, "sm_80")
    assert cubin[:4] == b"\x7fELF"


# masked vector accesses (bug D: LLVM aborted on masked loads) -------------------------------
#
# LLVM 22's NVPTX backend selects an llvm.masked.load whose mask the optimiser folded to a
# constant as a vector load with a used-bytes mask and aborts the process on it (passthru not
# poison; a mask all on or all off; the 1-lane piece of an odd vector). The codegen now emits
# masked accesses per lane. Every build below first runs in a forked child, so that a
# regression fails the test instead of killing the test run.

GPU_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "bool"]
MASK_PATTERNS = ["tail", "partial", "all_on", "all_off", "store_tail", "select", "gather", "scatter"]
# Lane counts per dtype: every one for float32; powers of two and odd ones for one dtype of each
# other element size and bool (i1 in registers, i8 in memory); the rest share that memory code
# and differ only in the select's compare. (The big kernels take seconds in LLVM and ptxas.)
WIDTHS = {"float32": list(range(1, 17)),
          **dict.fromkeys(["float16", "float64", "int8", "bool"], [1, 2, 3, 4, 5, 7, 8, 16])}
FEW_WIDTHS = [1, 3, 4, 16]


def _in_child(fn: Callable[[], object]) -> object:
    """``fn()`` run in a forked child (its result pickled back): an abort of the process fails
    the test with what the child wrote to stderr, an exception is re-raised here."""
    if not hasattr(os, "fork"):
        return fn()
    import pickle
    import tempfile

    with tempfile.TemporaryFile() as out:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(r)
            os.dup2(w, 2)
            code = 0
            try:
                res: tuple[str, object] = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - handed to the parent
                res, code = ("error", e), 1
            try:
                try:
                    pickle.dump(res, out)
                except Exception:  # an unpicklable result or exception: its text instead
                    out.seek(0)
                    out.truncate()
                    pickle.dump(("error", RuntimeError(repr(res[1]))), out)
                    code = 1
                out.flush()
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            err = fh.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            pytest.fail(f"the build killed the process (signal {os.WTERMSIG(status)}): {err[-1500:]}")
        out.seek(0)
        kind, val = pickle.load(out)
    if kind == "error":
        raise val
    return val


def _ptx_by_arch(funcs: list[PrimFunc]) -> dict[str, str]:
    """PTX of one module holding ``funcs`` for each of ARCHS, built in a forked child."""

    def build() -> dict[str, str]:
        out = {}
        for arch in ARCHS:
            t = Target.parse(f"cuda -arch={arch}")
            cg = CodegenNVPTX(t)
            for f in funcs:
                cg.add_function(f)
            text = str(cg.module)
            assert "llvm.masked." not in text  # no masked intrinsic reaches LLVM
            out[arch] = emit_ptx(text, t)
        return out

    return _in_child(build)  # type: ignore[return-value]


_HOST_SREGS = {"tid.x": "threadIdx.x", "tid.y": "threadIdx.y", "tid.z": "threadIdx.z",
               "ctaid.x": "blockIdx.x", "ctaid.y": "blockIdx.y", "ctaid.z": "blockIdx.z"}


def ir_on_host(ir_text: str) -> Callable[[str, list, dict[str, int]], None]:
    """The LLVM IR the NVPTX codegen generated, compiled for this CPU: ``run(name, arrays,
    launch)`` runs kernel ``name`` block by block, thread by thread, on numpy ``arrays`` (in
    place).

    There is no GPU here and the emulator runs the loop nest, not the generated code: this
    checks what the IR itself computes (masked lanes, per-lane branches), compiled without
    optimisation (fast, and what LLVM's O3 makes of it is LLVM's business). Only for kernels
    without barriers, shared memory or libdevice: the hardware indices become globals set
    before each call, the error global an ordinary one.
    """
    import ctypes
    import itertools

    import llvmlite.binding as llvm

    from tecomp.codegen.llvm_jit import ensure_llvm_initialized, load_compiler_runtime

    t = ir_text.replace('target triple = "nvptx64-nvidia-cuda"',
                        f'target triple = "{Target.host().triple}"')
    t = re.sub(r'target datalayout = "[^"]*"', "", t).replace("ptx_kernel ", "")
    t = re.sub(r'"nvvm\.\w+"="\d+"', "", t)
    t = re.sub(r'addrspacecast ptr addrspace\(1\) (@"?[\w.]+"?) to ptr', r"getelementptr i8, ptr \1, i64 0", t)
    t = t.replace("addrspace(1) global", "global")
    for reg in _HOST_SREGS:
        g = "__host_" + reg.replace(".", "_")
        t = t.replace(f'call i32 @"llvm.nvvm.read.ptx.sreg.{reg}"()', f'load i32, ptr @"{g}"')
        t = re.sub(rf'declare i32 @"llvm\.nvvm\.read\.ptx\.sreg\.{re.escape(reg)}"\(\)\s*', "", t)
        t += f'\n@"{g}" = global i32 0\n'
    assert "nvvm" not in t and "addrspace" not in t and "__nv_" not in t, "not runnable on a CPU"
    ensure_llvm_initialized()
    load_compiler_runtime()  # float16 conversions call libgcc helpers
    mod = llvm.parse_assembly(t)
    mod.verify()
    tm = llvm.Target.from_triple(Target.host().triple).create_target_machine(
        opt=0, reloc="pic", codemodel="jitdefault", jit=True)
    jit = llvm.create_mcjit_compiler(mod, tm)
    jit.finalize_object()
    regs = {tag: ctypes.c_int32.from_address(jit.get_global_value_address(
        "__host_" + reg.replace(".", "_"))) for reg, tag in _HOST_SREGS.items()}
    tags = ["blockIdx.z", "blockIdx.y", "blockIdx.x", "threadIdx.z", "threadIdx.y", "threadIdx.x"]

    def run(name: str, arrays: list, launch: dict[str, int]) -> None:
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(arrays))(jit.get_function_address(name))
        ptrs = [a.ctypes.data for a in arrays]
        for idx in itertools.product(*(range(launch.get(tag, 1)) for tag in tags)):
            for tag, v in zip(tags, idx, strict=True):
                regs[tag].value = v
            fn(*ptrs)

    run.jit = jit  # type: ignore[attr-defined]  # keeps the machine code alive with run
    return run


def _vec(base: Expr, lanes: int, stride: int = 1) -> Expr:
    return Ramp(base, IntImm(stride), lanes) if lanes > 1 else base


def _bcast(v: int, lanes: int) -> Expr:
    from tecomp.ir.expr import Broadcast

    return Broadcast(IntImm(v), lanes) if lanes > 1 else IntImm(v)


def masked_vectors(dtype: str, lanes: int) -> tuple[PrimFunc, Callable[..., np.ndarray]]:
    """A kernel with a masked access of ``lanes`` lanes of every pattern in MASK_PATTERNS.

    Two threads; each pattern owns a segment of 2L elements (L = ``lanes``) of A, C (inputs)
    and B (output), thread t covering ``[t*L, t*L + L)`` of it (position p, lane l):

    * tail: ``B = A[p < 2L-1]`` (the last lane of thread 1 masked off; masked loads read 0);
    * partial / all_on / all_off: ``B = A[l < L-1]`` / ``[l < L]`` / ``[l < 0]``: masks that
      are constants after optimisation (what made LLVM abort);
    * store_tail: ``B[p < 2L-1] = A`` (a masked store; its load inherits the mask);
    * select: ``B[p < 2L-1] = A < C ? A : C`` (loads inside a vector Select);
    * gather: ``B = A[reversed][p < 2L-1]`` (a masked gather); scatter: ``B[reversed][p < 2L-1] = A``.

    Returns the kernel and ``ref(a, c, b) -> expected b``.
    """
    from tecomp.ir.expr import LT, Select

    L = lanes
    n = 2 * L * len(MASK_PATTERNS)
    A, C, B = (Buffer(nm, (IntImm(n),), dtype) for nm in "ACB")
    tx = Var("tx")
    pos = _vec(tx * L, L)  # position inside the segment
    tail = LT(pos, _bcast(2 * L - 1, L))
    stmts = []
    for k, pat in enumerate(MASK_PATTERNS):
        o = 2 * L * k
        r = _vec(tx * L + o, L)
        rev = _vec(IntImm(o + 2 * L - 1) - tx * L, L, -1)
        if pat == "tail":
            s = BufferStore(B, BufferLoad(A, (r,), predicate=tail), (r,))
        elif pat in ("partial", "all_on", "all_off"):
            m = {"partial": L - 1, "all_on": L, "all_off": 0}[pat]
            s = BufferStore(B, BufferLoad(A, (r,), predicate=LT(_vec(IntImm(0), L), _bcast(m, L))), (r,))
        elif pat == "store_tail":
            s = BufferStore(B, BufferLoad(A, (r,)), (r,), predicate=tail)
        elif pat == "select":
            a, c = BufferLoad(A, (r,)), BufferLoad(C, (r,))
            s = BufferStore(B, Select(LT(a, c), a, c), (r,), predicate=tail)
        elif pat == "gather":
            s = BufferStore(B, BufferLoad(A, (rev,), predicate=tail), (r,))
        else:
            s = BufferStore(B, BufferLoad(A, (r,)), (rev,), predicate=tail)
        stmts.append(s)
    f = kernel(f"masked_{dtype}_{L}", [A, C, B], bind(tx, "threadIdx.x", 2, seq(*stmts)),
               {"threadIdx.x": 2})

    def ref(a: np.ndarray, c: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = b.copy()
        zero = np.zeros((), a.dtype)
        for k, pat in enumerate(MASK_PATTERNS):
            o = 2 * L * k
            for p in range(2 * L):
                on = {"partial": p % L < L - 1, "all_on": True, "all_off": False}.get(pat, p < 2 * L - 1)
                if pat in ("tail", "partial", "all_on", "all_off"):
                    out[o + p] = a[o + p] if on else zero
                elif pat == "store_tail" and on:
                    out[o + p] = a[o + p]
                elif pat == "select" and on:
                    out[o + p] = a[o + p] if a[o + p] < c[o + p] else c[o + p]
                elif pat == "gather":
                    out[o + p] = a[o + 2 * L - 1 - p] if on else zero
                elif pat == "scatter" and on:
                    out[o + 2 * L - 1 - p] = a[o + p]
        return out

    return f, ref


def _random(dtype: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.startswith("float"):
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), n, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_masked_vector_accesses_of_every_width(dtype: str) -> None:
    """Masked loads/stores/gathers/scatters of 1 to 16 lanes (odd counts included, WIDTHS)
    compile (no abort), pass ptxas for sm_80 and sm_90, and both the emulator and the
    generated IR (run on the host) compute what numpy computes."""
    from tecomp.runtime.gpu_emulator import emulate

    # One kernel per width in one module: LLVM optimises each function on its own (one
    # function with all widths takes LLVM's O3 superlinearly longer).
    cases = [masked_vectors(dtype, L) for L in WIDTHS.get(dtype, FEW_WIDTHS)]
    ptx = _ptx_by_arch([f for f, _ in cases])
    for arch in ARCHS:
        assert not re.search(r"\.extern\s+\.func", ptx[arch])
        res = ptxas_resources(ptx[arch], arch)  # a missing ptxas fails here
        for f, _ in cases:
            assert res[f.name].registers > 0
    cg = CodegenNVPTX(Target.parse("cuda -arch=sm_80"))
    for f, _ in cases:
        cg.add_function(f)
    on_host = ir_on_host(str(cg.module))  # the generated code itself, run on the host
    for f, ref in cases:
        n = f.params[0].shape[0]
        assert isinstance(n, IntImm)
        a, c, b0 = (_random(dtype, n.value, seed) for seed in (1, 2, 3))
        want = ref(a, c, b0)
        b = b0.copy()
        emulate(f, a, c, b)
        np.testing.assert_array_equal(b, want, err_msg=f"{f.name} emulated")
        b = b0.copy()
        on_host(f.name, [a, c, b], {"threadIdx.x": 2})
        np.testing.assert_array_equal(b, want, err_msg=f"{f.name} generated IR run on the host")


def test_masked_vector_ptx_details() -> None:
    """All lanes active: one vector access (ld.v4); otherwise per-lane predicated accesses to
    the right address space; no masked intrinsic anywhere."""
    f, _ = masked_vectors("float32", 4)
    ptx = _ptx_by_arch([f])["sm_80"]
    assert re.search(r"ld\.global(\.nc)?\.v4\.b32", ptx)  # the all-active fast path
    assert re.search(r"st\.global\.v4\.b32", ptx)
    assert re.search(r"@%p\d+ bra", ptx)  # the per-lane branches
    assert not re.search(r"\b(ld|st)\.b32", ptx)  # gathers/scatters stay in .global


TeCase = tuple[Any, list[Any], Callable[..., np.ndarray]]  # schedule, args, numpy reference


def _tail_max3() -> TeCase:
    """From the GPU fuzzer: a 3-lane int32 vector over an axis of extent 2 ("Do not know how
    to scalarize the result of this operator")."""
    from tecomp import te

    A0 = te.placeholder((2,), "int32", name="A0")
    r0 = te.reduce_axis((0, 2), name="r0")
    S0 = te.compute((2, 8, 8), lambda i0, i1, i2: te.max(A0[i0], axis=[r0], init=-2), name="S0")
    s = te.create_schedule(S0.op)
    i0, i1, i2 = S0.op.axis
    i0o, i0i = s[S0].split(i0, factor=3)
    i2o, i2i = s[S0].split(i2, factor=1)
    s[S0].reorder(i1, i2o, i0o, i2i, i0i, r0)
    s[S0].bind(i1, te.thread_axis("blockIdx.x"))
    s[S0].bind(i2o, te.thread_axis("blockIdx.y"))
    s[S0].bind(i0o, te.thread_axis("threadIdx.x"))
    s[S0].bind(i2i, te.thread_axis("threadIdx.y"))
    s[S0].vectorize(i0i)
    return s, [A0, S0], lambda a: np.broadcast_to(np.maximum(a, -2)[:, None, None], (2, 8, 8))


def _rfactor_local_tail() -> TeCase:
    """From the GPU fuzzer: a per-thread rfactor stage vectorized with masks that are constant
    after optimisation ("Unexpected masked load with elements masked all on or all off")."""
    from tecomp import te

    A0 = te.placeholder((19, 19), "float32", name="A0")
    r = te.reduce_axis((0, 19), name="r")
    S0 = te.compute((19,), lambda i0: te.sum(A0[r, i0], axis=[r]), name="S0")
    S2 = te.compute((19,), lambda i0: S0[8] / 0.5, name="S2")
    s = te.create_schedule(S2.op)
    s0: Any = s[S0]  # its op changes with rfactor
    _, ri = s0.split(s0.op.reduce_axis[0], factor=3)
    rf: Any = s.rfactor(S0, ri, factor_axis=1)
    s[S2].bind(S2.op.axis[0], te.thread_axis("threadIdx.x"))
    s0.compute_at(s[S2], S2.op.axis[0])
    _, vi = s0.split(s0.op.axis[0], factor=10)
    s0.vectorize(vi)
    s[rf].compute_at(s[S2], S2.op.axis[0])
    s[rf].pragma(rf.op.reduce_axis[0], "auto_unroll_max_step", 4)
    return s, [A0, S2], lambda a: np.full(19, a[:, 8].sum() / 0.5, "float32")


def _select_tail(dtype: str, lanes: int) -> Callable[[], TeCase]:
    """A vectorized select between two loads with a vector tail and a reversed (gather) read."""

    def make() -> TeCase:
        from tecomp import te

        n = 12 * lanes - 1
        A = te.placeholder((n,), dtype, name="A")
        C = te.placeholder((n,), dtype, name="C")
        B = te.compute((n,), lambda i: te.if_then_else(A[i] < C[i], A[n - 1 - i], C[i]), name="B")
        s = te.create_schedule(B.op)
        bx, rest = s[B].split(B.op.axis[0], factor=4 * lanes)
        tx, v = s[B].split(rest, factor=lanes)
        s[B].bind(bx, te.thread_axis("blockIdx.x"))
        s[B].bind(tx, te.thread_axis("threadIdx.x"))
        s[B].vectorize(v)
        return s, [A, C, B], lambda a, c: np.where(a < c, a[::-1], c)

    return make


TE_CASES: dict[str, Callable[[], TeCase]] = {
    "max3_int32": _tail_max3, "rfactor_local_tail": _rfactor_local_tail,
    "select_float32x3": _select_tail("float32", 3), "select_float16x7": _select_tail("float16", 7),
    "select_int8x5": _select_tail("int8", 5), "select_float64x2": _select_tail("float64", 2),
}


@pytest.mark.parametrize("which", list(TE_CASES))
def test_vector_tails_through_tc_build(which: str) -> None:
    """te schedules whose vector tails made LLVM abort: tc.build works for sm_80 and sm_90,
    ptxas accepts the PTX, and the emulated kernel and the generated IR (run on the host)
    match numpy."""
    import tecomp as tc

    s, args, ref = TE_CASES[which]()

    def build_all() -> dict[str, str]:
        out = {}
        for arch in ARCHS:
            f = tc.build(s, args, target=f"cuda -arch={arch}")
            assert "llvm.masked." not in f.get_source("ll")
            out[arch] = f.get_source("ptx")
        return out

    ptx: dict[str, str] = _in_child(build_all)  # type: ignore[assignment]
    for arch in ARCHS:
        assert f".target {arch}" in ptx[arch]
        res = ptxas_resources(ptx[arch], arch)
        assert all(r.registers > 0 for r in res.values())
    f = tc.build(s, args, target="cuda")  # the child did not abort: safe here
    shapes = [tuple(int(d.value) for d in t.shape) for t in args]
    ins = [_random(t.dtype, math.prod(sh), k).reshape(sh)
           for k, (t, sh) in enumerate(zip(args[:-1], shapes, strict=False))]
    want = ref(*ins)
    got = np.zeros(shapes[-1], args[-1].dtype)
    f.emulate(*ins, got)
    # float sums: numpy adds in another order than the kernel
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg="emulated")
    got = np.zeros_like(got)
    launch = {k: int(v.value) for k, v in f.entry_func.launch.items()}
    ir_on_host(f.get_source("ll"))(f.entry_func.name, [*ins, got], launch)
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg="generated IR run on the host")


_MASKED_LOAD_IR = """target triple = "nvptx64-nvidia-cuda"
define ptx_kernel void @k(ptr align 16 %p, ptr %q) {
  %v = call <4 x float> @llvm.masked.load.v4f32.p0(ptr %p, i32 16,
           <4 x i1> <i1 1, i1 1, i1 1, i1 0>, <4 x float> zeroinitializer)
  store <4 x float> %v, ptr %q
  ret void
}
declare <4 x float> @llvm.masked.load.v4f32.p0(ptr, i32, <4 x i1>, <4 x float>)
"""


def test_masked_load_in_ir_text_is_refused_not_an_abort() -> None:
    """IR text handed to emit_ptx directly: LLVM would abort on this masked load."""
    t = Target.parse("cuda -arch=sm_80")

    def compile_it() -> str:
        try:
            emit_ptx(_MASKED_LOAD_IR, t)
        except TecompError as e:
            return str(e)
        return "compiled"

    msg = str(_in_child(compile_it))
    assert "llvm.masked.load.v4f32.p0" in msg and "aborts" in msg
