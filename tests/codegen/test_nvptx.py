"""The NVPTX backend on GPU kernels built by hand under the IR contract of docs/gpu-ir.md.

Each kernel is generated, optimised to PTX and assembled by ptxas for sm_80 and sm_90 (no GPU
needed): ptxas must accept it, report no spills, registers > 0 and exactly the shared memory the
kernel allocates. Anything that could make LLVM abort the process (an intrinsic the arch lacks)
runs in a subprocess, so a regression shows up as a failed test, not a dead test run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable

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
    A = f32("A", 64)
    sh = f32("sh", 16 * 1024, scope="shared")  # 64 KB > 48 KB
    tx = Var("tx")
    f = kernel("k", [A], Allocate(sh, bind(tx, "threadIdx.x", 64, st(sh, tx, ld(A, tx)))),
               {"threadIdx.x": 64})
    with pytest.raises(CodegenError, match="65536 bytes of shared memory"):
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
