"""Scalar kernel parameters (a te.var in build's argument list) on a cuda target.

The scalar is a by-value PTX parameter of its own type after the buffers and dims (the CPU's
calling convention). Without a GPU: the emulator against numpy (float and int scalars, a
scalar loop bound, a dim given explicitly, a function of two kernels), the argument checks of
a call (type, bool, range), ptxas on the PTX, the kernelParams packing (in process and through
the stand-in libcuda of test_cuda_runtime.py, for built and for exported-and-loaded
functions), and the export manifest and header.
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.backend import backend_for
from tecomp.codegen.ptxas import find_ptxas
from tecomp.codegen.target import Target
from tecomp.errors import TecompError
from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, PrimFunc, Var, const
from tecomp.runtime.cuda import cuda_available, pack_params
from tecomp.runtime.loader import load_module

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_export_cuda import _fake_run  # noqa: E402

TARGET = "cuda -arch=sm_80"
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")
NO_GPU = not cuda_available()[0]


def _bind(s: Any, t: Any, factor: int = 64) -> None:
    bx, tx = s[t].split(t.op.axis[0], factor=factor)
    s[t].bind(bx, te.thread_axis("blockIdx.x"))
    s[t].bind(tx, te.thread_axis("threadIdx.x"))


def scaled_add(dtype: str = "float32", kdtype: str = "int32") -> tuple[Any, list[Any]]:
    """B[i] = A[i] * alpha + k over a symbolic n: a float and an int scalar."""
    n = te.var("n")
    alpha = te.var("alpha", dtype)
    k = te.var("k", kdtype)
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: A[i] * alpha + k.astype(dtype), name="B")
    s = te.create_schedule(B.op)
    _bind(s, B)
    return s, [A, alpha, k, B]


def two_kernels() -> tuple[Any, list[Any]]:
    """T = A * alpha and B = T + k, each at root: two kernels, one scalar each; the scalars
    are listed out of order (k before B, alpha last) to check the argument slots."""
    n = te.var("n")
    alpha = te.var("alpha", "float32")
    k = te.var("k", "int64")
    A = te.placeholder((n,), "float32", name="A")
    T = te.compute((n,), lambda i: A[i] * alpha, name="T")
    B = te.compute((n,), lambda i: T[i] + k.astype("float32"), name="B")
    s = te.create_schedule(B.op)
    _bind(s, T)
    _bind(s, B, 32)
    return s, [A, k, B, alpha]


def _rand(n: int, dtype: str = "float32", seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


# -- emulation against numpy ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scaled_add_emulates(dtype: str) -> None:
    s, args = scaled_add(dtype)
    f = tc.build(s, args, target=TARGET, name="scaled")
    a = _rand(200, dtype)
    for alpha, k, seed in [(2.5, 3, 0), (np.float32(-1.25), np.int32(-7), 1), (4, 0, 2),
                           (np.array(0.5), 2**31 - 1, 3)]:
        b = np.zeros_like(a)
        f.emulate(a, alpha, k, b, seed=seed)
        want = a * np.asarray(alpha).astype(dtype) + np.asarray(k).astype(dtype)
        np.testing.assert_allclose(b, want, rtol=1e-6)
    b = np.zeros(0, dtype)
    f.emulate(np.zeros(0, dtype), 1.0, 1, b)  # n = 0: an empty grid


@pytest.mark.parametrize("kdtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                    "int64", "uint64"])
def test_int_scalar_types_and_range(kdtype: str) -> None:
    k = te.var("k", kdtype)
    A = te.placeholder((64,), "int64", name="A")
    B = te.compute((64,), lambda i: A[i] + k.astype("int64"), name="B")
    s = te.create_schedule(B.op)
    _bind(s, B, 32)
    f = tc.build(s, [A, k, B], target=TARGET, name="addk")
    a = np.arange(64, dtype="int64")
    info = np.iinfo(kdtype)
    for v in (int(info.min), int(info.max), 5):
        b = np.zeros_like(a)
        f.emulate(a, v, b)
        # the cast to int64 wraps uint64 values above INT64_MAX, as C (and the CPU build) do
        np.testing.assert_array_equal(b, a + np.array(v, kdtype).astype("int64"))
    b = np.zeros_like(a)
    for call in (f.emulate, f):  # a device call checks before it needs the driver
        with pytest.raises(ValueError, match=rf"argument 1 \('k'\).*out of range for {kdtype}"):
            call(a, int(info.max) + 1, b)
        with pytest.raises(ValueError, match="out of range"):
            call(a, int(info.min) - 1, b)
        with pytest.raises(TypeError, match=r"argument 1 \('k'\) of addk: expected an integer"):
            call(a, 1.5, b)
        with pytest.raises(TypeError, match=r"argument 1 \('k'\).*got bool"):
            call(a, True, b)
        with pytest.raises(TypeError, match=r"argument 1 \('k'\).*got ndarray"):
            call(a, np.ones(2, "int64"), b)


def test_float_scalar_refuses_non_numbers() -> None:
    s, args = scaled_add()
    f = tc.build(s, args, target=TARGET, name="scaled")
    a = _rand(8)
    for call in (f.emulate, f):
        with pytest.raises(TypeError, match=r"argument 1 \('alpha'\) of scaled: expected a "
                                            r"float32 scalar.*got str"):
            call(a, "2.0", 1, a.copy())
        with pytest.raises(TypeError, match="takes 4 arguments"):
            call(a, 2.0, a.copy())


def test_scalar_loop_bound() -> None:
    m = te.var("m", "int32")
    A = te.placeholder((64, 32), "float32", name="A")
    r = te.reduce_axis((0, m), name="r")
    C = te.compute((64,), lambda i: te.sum(A[i, r], axis=r), name="C")
    s = te.create_schedule(C.op)
    _bind(s, C, 32)
    f = tc.build(s, [A, m, C], target=TARGET, name="rowsum")
    a = _rand(64 * 32).reshape(64, 32)
    for mv in (0, 1, 5, 32):
        c = np.full(64, np.nan, np.float32)
        f.emulate(a, mv, c)
        # float32 sums in another order than numpy's pairwise one
        np.testing.assert_allclose(c, a[:, :mv].astype("float64").sum(axis=1), rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="'A'"):  # m past A's 32 columns: the emulator says so
        f.emulate(a, 33, np.zeros(64, np.float32))


def test_dim_given_only_by_the_scalar() -> None:
    # n appears only inside the shape n + 1: the explicit argument gives it, the shapes check it
    n = te.var("n")
    A = te.placeholder((n + 1,), name="A")
    B = te.compute((n + 1,), lambda i: A[i] * 2, name="B")
    s = te.create_schedule(B.op)
    _bind(s, B, 32)
    f = tc.build(s, [n, A, B], target=TARGET, name="twice")
    a = _rand(70)
    b = np.zeros_like(a)
    f.emulate(69, a, b)
    np.testing.assert_array_equal(b, a * 2)
    assert f["twice"].plan.single and "n" in f["twice"].spec.dims
    with pytest.raises(ValueError, match="n"):
        f.emulate(68, a, b)


def test_two_kernels_each_with_its_scalar() -> None:
    s, args = two_kernels()
    f = tc.build(s, args, target=TARGET, name="two")
    fn = f["two"]
    a = _rand(100)
    b = np.zeros_like(a)
    fn.emulate(a, -4, b, 0.5)
    np.testing.assert_allclose(b, a * np.float32(0.5) - 4, rtol=1e-6)
    k0, k1 = fn.plan.kernels
    # slots: the arguments (A, k, B, alpha), then the intermediate T
    assert [p.name for p in k0.spec.params] == ["A", "T", "alpha"] and k0.args == (0, 4, 3)
    assert [p.name for p in k1.spec.params] == ["B", "T", "k"] and k1.args == (2, 4, 1)
    assert k0.spec.params[2].scalar and k1.spec.params[2].dtype == "int64"


# -- PTX --------------------------------------------------------------------------------------

def test_ptx_signature_has_the_scalars_by_value() -> None:
    s, args = scaled_add("float64", "int8")
    ptx = tc.build(s, args, target=TARGET, name="scaled").get_source("ptx")
    params = [ln.strip().rstrip(",") for ln in ptx.split(".entry scaled(")[1].split(")")[0]
              .splitlines() if ln.strip()]
    # A, B, then the dim n, then alpha and k in their own types
    assert [p.split()[1] for p in params] == [".u64", ".u64", ".u64", ".f64", ".u8"], params


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptx_with_scalars_passes_ptxas(arch: str) -> None:
    for s, args in (scaled_add(), scaled_add("float64", "uint16"), two_kernels()):
        f = tc.build(s, args, target=f"cuda -arch={arch}", name="fn")
        r = f["fn"].resources
        assert r is not None
        for rep in (r.values() if isinstance(r, dict) else [r]):
            assert rep.registers > 0 and rep.spill_stores == 0


# -- errors -----------------------------------------------------------------------------------

def test_a_grid_sized_by_a_scalar_is_refused() -> None:
    # a hand-made kernel whose grid is the scalar k: the runtime computes grids from the
    # argument shapes only, so the build says why rather than failing at the first call
    A = Buffer("A", (const(64),), "float32")
    k, bx, tx = Var("k"), Var("bx"), Var("tx")
    i = bx * 32 + tx
    body = For(bx, const(0), k, ForKind.THREAD_BINDING,
               For(tx, const(0), const(32), ForKind.THREAD_BINDING,
                   BufferStore(A, BufferLoad(A, (i,)) * 2.0, (i,)),
                   (("thread_tag", "threadIdx.x"),)), (("thread_tag", "blockIdx.x"),))
    tgt = Target.parse(TARGET)
    f = PrimFunc("grid_k", [A], body, attrs={
        "launch": {"blockIdx.x": k, "threadIdx.x": const(32)}, "target": tgt,
        "scalar_params": [(1, k)], "outputs": [0]})
    with pytest.raises(TecompError, match=r"grid_k: the launch extent of blockIdx.x is k.*"
                                          r"depends on k.*scalar parameter cannot size it"):
        backend_for(tgt).codegen([f], tgt)


def test_sixteen_bit_float_scalars_are_refused() -> None:
    h = te.var("h", "float16")
    C = te.compute((32,), lambda i: h.astype("float32"), name="C")
    s = te.create_schedule(C.op)
    _bind(s, C, 32)
    with pytest.raises(tc.LoweringError, match="float16"):
        tc.build(s, [h, C], target=TARGET)


# -- kernelParams -----------------------------------------------------------------------------

def test_pack_params_puts_each_value_in_its_c_type() -> None:
    vals = [(ctypes.c_uint64, 0xDEADBEEF00), (ctypes.c_int64, -3), (ctypes.c_float, 2.5),
            (ctypes.c_int8, -1), (ctypes.c_uint64, 2**64 - 1), (ctypes.c_double, -0.5),
            (ctypes.c_uint16, 65535)]
    slots, ptrs = pack_params(vals)
    assert len(ptrs) == len(vals)
    got = [ctypes.c_uint64.from_address(p).value for p in ptrs]
    assert got == [0xDEADBEEF00, 2**64 - 3, struct.unpack("<I", struct.pack("<f", 2.5))[0], 0xFF,
                   2**64 - 1, struct.unpack("<Q", struct.pack("<d", -0.5))[0], 0xFFFF]
    assert ptrs[1] - ptrs[0] == 8  # one 8-byte slot each, in order
    with pytest.raises(TypeError, match="8-byte slot"):
        pack_params([(ctypes.c_longdouble, 1.0)])
    empty_slots, empty_ptrs = pack_params([])
    assert len(empty_ptrs) == 1  # a valid array even without parameters


def _f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _f64_bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


# the built function and the same one exported and loaded, called through the stand-in driver
# (every launch logged with its raw 8-byte parameter slots; "p": a pointer, "d": an int64 dim,
# "s": a by-value scalar)
FAKE_SCRIPT = r"""
import ctypes, json, sys
import numpy as np
import tecomp as tc
sys.path.insert(0, sys.argv[2])
from test_gpu_scalar_params import scaled_add, two_kernels

lib = ctypes.CDLL("libcuda.so.1")
class Log(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("shared", ctypes.c_uint32),
                ("nparams", ctypes.c_int), ("params", ctypes.c_uint64 * 16),
                ("peek", ctypes.c_uint32 * 16)]
log = (Log * 64).in_dll(lib, "fake_log")
nlog = ctypes.c_int.in_dll(lib, "fake_nlog")

def sigs(plan):
    for k in plan.kernels:
        sig = "".join("p" for p in k.spec.params if not p.scalar) + "d" * len(k.spec.dims) + "".join(
            "s" for p in k.spec.params if p.scalar and p.name not in k.spec.dims)
        lib.fake_set_sig(k.spec.name.encode(), sig.encode())

def launches(since):
    return [{"name": l.name.decode(), "grid": list(l.grid), "block": list(l.block),
             "params": list(l.params[:l.nparams]), "peek": list(l.peek[:l.nparams])}
            for l in log[since:nlog.value]]

out = {}
s1, a1 = scaled_add("float64", "int8")
s2, a2 = two_kernels()
mod = tc.build([(s1, a1, "scaled"), (s2, a2, "two")], target="cuda -arch=sm_80")
for f in (mod["scaled"], mod["two"]):
    sigs(f.plan)
a = np.arange(100, dtype="float64"); b = np.zeros_like(a)
a32 = np.arange(100, dtype="float32"); b32 = np.zeros_like(a32)
mod["scaled"](a, -0.5, -3, b)
mod["two"](a32, -7, b32, 2.5)
out["built"] = launches(0)
seen = nlog.value
t = mod["two"].time_evaluator(number=2, repeat=2)(a32, 9, b32, 1.5)
out["timed"] = launches(seen)[-1]
mod.export_library(sys.argv[1])
m = tc.runtime.load_module(sys.argv[1])
seen = nlog.value
m["scaled"](a, -0.5, -3, b)
m["two"](a32, -7, b32, 2.5)
out["loaded"] = launches(seen)
try:
    m["scaled"](a, -0.5, 300, b)
except ValueError as e:
    out["range"] = str(e)
print(json.dumps(out))
"""


def test_scalars_reach_the_driver_packed_in_their_c_types(tmp_path: Path) -> None:
    script = FAKE_SCRIPT.replace("sys.argv[1]", repr(str(tmp_path / "lib" / "k.so")))
    script = script.replace("sys.argv[2]", repr(str(HERE)))
    out = _fake_run(tmp_path, tmp_path / "unused", script)
    f64, i8 = _f64_bits(-0.5), 0xFD  # int8 -3 in its one byte; the slot's other bytes zero
    for runs in (out["built"], out["loaded"]):
        scaled, k0, k1 = runs
        assert scaled["name"] == "scaled" and scaled["grid"] == [2, 1, 1]
        # A, B, n, alpha (double), k (int8)
        assert scaled["params"][2:] == [100, f64, i8]
        assert scaled["peek"][0] == 0 and scaled["params"][0] != scaled["params"][1]
        # two_kernel0(A, T, n, alpha: float32), two_kernel1(B, T, n, k: int64)
        assert k0["name"] == "two_kernel0" and k0["params"][2:] == [100, _f32_bits(2.5)]
        assert k1["name"] == "two_kernel1" and k1["params"][2:] == [100, 2**64 - 7]
        assert k0["params"][1] == k1["params"][1]  # the intermediate T
        assert k1["grid"] == [4, 1, 1] and k1["block"] == [32, 1, 1]
    assert out["timed"]["params"][2:] == [100, 9]
    assert out["range"].startswith("argument 2 ('k') of scaled") and "out of range" in out["range"]


# -- export -----------------------------------------------------------------------------------

def test_export_describes_the_scalars(tmp_path: Path) -> None:
    s1, a1 = scaled_add()
    s2, a2 = two_kernels()
    mod = tc.build([(s1, a1, "scaled"), (s2, a2, "two")], target=TARGET)
    files = mod.export_library(tmp_path / "k.so")
    man = json.loads(files.manifest.read_text())
    by = {e["name"]: e for e in man["kernels"]}
    sc = by["scaled"]
    assert [p.get("scalar", False) for p in sc["params"]] == [False, True, True, False]
    assert sc["params"][1] == {"name": "alpha", "dtype": "float32", "shape": [], "output": False,
                               "scalar": True}
    (launch,) = sc["launches"]
    assert launch["args"] == [0, 1, 2, 3] and launch["params"] == sc["params"]
    two = by["two"]
    assert [ln["args"] for ln in two["launches"]] == [[0, 4, 3], [2, 4, 1]]
    header = files.header.read_text()
    assert "then the listed scalars by value" in header
    assert "scaled(float32[n] A, float alpha (scalar), int32_t k (scalar), float32[n] B (out))" \
        in header
    assert "two_kernel0(A, T, n, float alpha)" in header
    assert "two_kernel1(B, T, n, int64_t k)" in header
    # loaded: the same signature, the same checks before any driver work
    m = load_module(files.library)
    f = m["scaled"]
    assert f.params == mod["scaled"].params
    a = _rand(10)
    call = f.prepare(a, 2.0, 3, np.zeros_like(a))
    assert call.scalars == {1: 2.0, 2: 3} and call.dims == (10,) and call.host[1] is None
    with pytest.raises(TypeError, match=r"argument 2 \('k'\) of scaled: expected an integer"):
        f.prepare(a, 2.0, 3.5, np.zeros_like(a))


def test_a_manifest_passing_a_buffer_as_a_scalar_is_refused(tmp_path: Path) -> None:
    s, args = two_kernels()
    files = tc.build(s, args, target=TARGET, name="two").export_library(tmp_path / "k.so")
    data = json.loads(files.manifest.read_text())
    (entry,) = data["kernels"]
    entry["launches"][1]["args"][2] = 0  # k's slot -> A's (both would have to be int64 anyway)
    entry["launches"][1]["params"][2]["dtype"] = "float32"
    files.manifest.write_text(json.dumps(data))
    with pytest.raises(TecompError, match="parameter k is a scalar, but its argument A is not"):
        load_module(files.library)


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA device")
@pytest.mark.gpu
def test_gpu_scaled_add_matches_numpy() -> None:
    s, args = scaled_add()
    f = tc.build(s, args, target=TARGET, name="scaled")
    a = _rand(1000)
    b = np.zeros_like(a)
    f(a, 1.5, -2, b)
    # the GPU contracts a*1.5 - 2 into one fma (a rounding less than numpy's product and
    # sum), so near cancellation the error is absolute: a few ulp of 2 (seen on an H100)
    np.testing.assert_allclose(b, a * np.float32(1.5) - 2, rtol=1e-6, atol=4 * 2.0 ** -22)
    s, args = two_kernels()
    g = tc.build(s, args, target=TARGET, name="two")
    g(a, 3, b, 0.25)
    np.testing.assert_allclose(b, a * np.float32(0.25) + 3, rtol=1e-6)
