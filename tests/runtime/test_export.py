"""export_library / load_module: a .so + C header + JSON manifest that runs without the compiler.

The central test loads the exported libraries in a fresh interpreter where llvmlite and xgboost
cannot be imported (a meta-path finder raises ImportError for them), as on a deployment
machine, and compares every kernel with numpy. The others check the C header from a real C
program, refusal of libraries this CPU cannot run, clear errors for damaged files, and that
loaded kernels check their arguments exactly like JIT-built ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.runtime.args import ParamSpec
from tecomp.runtime.export import KernelSpec, build_library, c_prototype
from tecomp.runtime.loader import (
    CPU_FLAGS,
    LoadedModule,
    check_runnable,
    host_cpu_flags,
    load_module,
    read_manifest,
)
from tecomp.runtime.module import Module

ROOT = Path(__file__).resolve().parents[2]
M, K, N = 64, 48, 32

# the library ---------------------------------------------------------------------------------


def _kernels() -> list[tuple[Any, list[Any], str]]:
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s_mm = te.create_schedule(C.op)
    i, j = s_mm[C].op.axis
    io, ii = s_mm[C].split(i, factor=8)
    s_mm[C].parallel(io)  # parallel + vectorized: links libgomp
    s_mm[C].vectorize(j)

    n = te.var("n")
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n,), lambda i: te.tanh(X[i]) * 2.0, name="Y")
    s_tanh = te.create_schedule(Y.op)
    _, yi = s_tanh[Y].split(Y.op.axis[0], factor=16)
    s_tanh[Y].vectorize(yi)

    Xd = te.placeholder((n,), "float32", name="X")
    D = te.compute((n - 1,), lambda i: Xd[i + 1] - Xd[i], name="D")  # extent computed from n
    s_diff = te.create_schedule(D.op)

    rows, cols = te.var("rows"), te.var("cols")
    Q = te.placeholder((rows, cols), "int32", name="Q")
    r = te.reduce_axis((0, cols), name="r")
    R = te.compute((rows,), lambda i: te.sum(Q[i, r], axis=r), name="R")
    s_sum = te.create_schedule(R.op)
    return [(s_mm, [A, B, C], "mm"), (s_tanh, [X, Y], "tanh2"), (s_diff, [Xd, D], "diff"),
            (s_sum, [Q, R], "rowsum")]


def _debug_kernel() -> tuple[Any, list[Any]]:
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i + 6], name="B")  # reads 6 past the end
    return te.create_schedule(B.op), [A, B]


PROVENANCE = {"log": "tune.jsonl", "tuner": "hand"}
KERNEL_PROVENANCE = {"mm": {"record_hash": "sha256:abc", "measured_time_s": 1.5e-5}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("export") / "out"  # export creates the directory
    lib = tc.build(_kernels(), target="llvm")
    files = lib.export_library(out / "kernels.so", provenance=PROVENANCE,
                               kernel_provenance=KERNEL_PROVENANCE)
    s, args = _debug_kernel()
    dbg = tc.build(s, args, name="shift", debug=True)
    dfiles = dbg.export_library(out / "dbg.so")
    return {"out": out, "lib": lib, "files": files, "dbg": dbg, "dfiles": dfiles}


def _inputs() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "a": rng.standard_normal((M, K), np.float32), "b": rng.standard_normal((K, N), np.float32),
        "x": rng.standard_normal(37).astype(np.float32),
        "q": rng.integers(-100, 100, (5, 9)).astype(np.int32),
    }


def _expected(v: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"mm": v["a"] @ v["b"], "tanh2": np.tanh(v["x"]) * 2, "diff": np.diff(v["x"]),
            "rowsum": v["q"].sum(axis=1, dtype=np.int32)}


def test_build_several_kernels_into_one_module(built: dict[str, Any]) -> None:
    lib = built["lib"]
    assert isinstance(lib, Module) and lib.function_names == ["mm", "tanh2", "diff", "rowsum"]
    assert lib.uses_openmp
    v, want = _inputs(), _expected(_inputs())
    c = np.zeros((M, N), np.float32)
    lib["mm"](v["a"], v["b"], c)
    np.testing.assert_allclose(c, want["mm"], rtol=1e-4, atol=1e-4)


def test_export_writes_library_header_and_manifest(built: dict[str, Any]) -> None:
    files, lib = built["files"], built["lib"]
    assert files.library.name == "kernels.so"
    assert files.header == built["out"] / "kernels.h"
    assert files.manifest == built["out"] / "kernels.json"
    assert not [p for p in built["out"].iterdir() if p.name.startswith(".tecomp-export")]
    header = files.header.read_text()
    for proto in ("int32_t mm(const float* A, const float* B, float* C);",
                  "int32_t tanh2(const float* X, float* Y, int64_t n);",
                  "int32_t diff(const float* X, float* D, int64_t n);",
                  "int32_t rowsum(const int32_t* Q, int32_t* R, int64_t rows, int64_t cols);"):
        assert proto in header
    assert "D  float32[(n - 1)]  output" in header
    man = json.loads(files.manifest.read_text())
    assert man["schema"] == "tecomp-library" and man["schema_version"] == 1
    assert man["tecomp_version"] == tc.__version__
    assert man["openmp"] is True and man["debug"] is False and man["oob_record"] is None
    assert man["target"]["triple"] == lib.target.triple and man["target"]["cpu"] == lib.target.cpu
    assert {"avx2", "sse2"} <= set(man["target"]["required_features"]) or \
        lib.target.vector_bits < 256
    assert man["provenance"] == PROVENANCE
    kern = {k["name"]: k for k in man["kernels"]}
    assert kern["mm"]["provenance"] == {"log": "tune.jsonl", "tuner": "hand",
                                        "record_hash": "sha256:abc", "measured_time_s": 1.5e-5}
    assert kern["tanh2"]["provenance"]["record_hash"] is None
    for name in lib.function_names:  # the ParamSpec round trip gives the JIT's own specs
        assert tuple(ParamSpec.from_json(p) for p in kern[name]["params"]) == lib[name].params
        assert tuple(kern[name]["dims"]) == lib[name].checker.dim_names
    assert [p["output"] for p in kern["mm"]["params"]] == [False, False, True]
    assert kern["diff"]["params"][1]["shape"] == ["(n - 1)"]


_CHILD = textwrap.dedent('''
    import importlib.abc, json, sys

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("llvmlite", "xgboost"):
                raise ImportError(f"{name} is not installed on this deployment")
            return None

    sys.meta_path.insert(0, _Block())
    import numpy as np
    import tecomp as tc

    lib = tc.runtime.load_module(sys.argv[1])
    v = dict(np.load(sys.argv[2]))
    M, N = v["a"].shape[0], v["b"].shape[1]
    out = {"mm": np.zeros((M, N), np.float32), "tanh2": np.empty_like(v["x"]),
           "diff": np.empty(v["x"].size - 1, np.float32), "rowsum": np.empty(5, np.int32)}
    lib["mm"](v["a"], v["b"], out["mm"])
    lib["tanh2"](v["x"], out["tanh2"])
    lib["diff"](v["x"], out["diff"])
    lib["rowsum"](v["q"], out["rowsum"])
    np.savez(sys.argv[3], **out)
    report = {"names": lib.function_names, "provenance": lib.kernel_provenance("mm")}
    try:
        lib["tanh2"](v["x"], out["diff"])
    except ValueError as e:
        report["shape_error"] = str(e)
    dbg = tc.runtime.load_module(sys.argv[4])
    try:
        dbg(np.ones(20, np.float32), np.zeros(20, np.float32))
    except IndexError as e:
        report["oob"] = str(e)
    report["timed"] = lib["tanh2"].time_evaluator(number=2, repeat=2)(v["x"], out["tanh2"]).median
    try:
        tc.runtime.Module
    except ImportError:
        report["jit_blocked"] = True
    # nor the GPU runtime: a library without cuda functions never needs cuda-bindings
    report["leaked"] = [m for m in sys.modules if m.split(".")[0] in ("llvmlite", "xgboost", "cuda")
                        or m == "tecomp.runtime.cuda"]
    report["compiler"] = [m for m in sys.modules if m.startswith(("tecomp.codegen.llvm",
                          "tecomp.lowering", "tecomp.passes", "tecomp.runtime.module"))]
    print(json.dumps(report))
''')


def test_load_in_fresh_process_without_llvmlite(built: dict[str, Any], tmp_path: Path) -> None:
    v = _inputs()
    np.savez(tmp_path / "in.npz", **v)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(script), str(built["files"].library),
                          str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                          str(built["dfiles"].library)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["leaked"] == [] and report["compiler"] == [] and report["jit_blocked"]
    assert report["names"] == ["mm", "tanh2", "diff", "rowsum"]
    assert report["provenance"]["record_hash"] == "sha256:abc"
    assert report["timed"] > 0
    got = dict(np.load(tmp_path / "out.npz"))
    want = _expected(v)
    np.testing.assert_allclose(got["mm"], want["mm"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["tanh2"], want["tanh2"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["diff"], want["diff"])
    np.testing.assert_array_equal(got["rowsum"], want["rowsum"])
    # the same errors as the JIT-built functions
    with pytest.raises(ValueError) as jit_err:
        built["lib"]["tanh2"](v["x"], np.empty(36, np.float32))
    assert report["shape_error"] == str(jit_err.value)
    with pytest.raises(IndexError) as jit_oob:
        built["dbg"](np.ones(20, np.float32), np.zeros(20, np.float32))
    assert report["oob"] == str(jit_oob.value) == (
        "out-of-bounds access to buffer 'A': flat index 20 not in [0, 20)")


def _bad_calls() -> list[tuple[str, tuple[Any, ...]]]:
    a = np.zeros((M, K), np.float32)
    b = np.zeros((K, N), np.float32)
    c = np.zeros((M, N), np.float32)
    x = np.zeros(10, np.float32)
    ro = np.zeros((M, N), np.float32)
    ro.flags.writeable = False
    return [
        ("mm", (a, b)),  # count
        ("mm", (a.astype(np.float64), b, c)),  # dtype
        ("mm", (a[:, :10], b, c)),  # shape
        ("mm", (np.asfortranarray(a), b, c)),  # contiguity
        ("mm", (a, b, ro)),  # read-only output
        ("mm", (a, b, [1, 2])),  # not an array
        ("tanh2", (x, x)),  # output overlaps an input
        ("tanh2", (x, np.zeros(11, np.float32))),  # dim bound twice, disagreeing
        ("diff", (x, np.zeros(10, np.float32))),  # extent computed from n
        ("rowsum", (np.zeros((3, 4), np.int64), np.zeros(3, np.int32))),
    ]


def test_loaded_argument_checks_match_jit(built: dict[str, Any]) -> None:
    loaded = load_module(built["files"].library)
    assert isinstance(loaded, LoadedModule)
    jit = built["lib"]
    for name, args in _bad_calls():
        with pytest.raises((TypeError, ValueError)) as want:
            jit[name](*args)
        with pytest.raises(type(want.value)) as got:
            loaded[name](*args)
        assert str(got.value) == str(want.value), name
        assert repr(loaded[name]) == repr(jit[name])
    with pytest.raises(TecompError, match="several kernels"):
        loaded(np.zeros(1))
    with pytest.raises(KeyError, match="no kernel 'nope'"):
        loaded["nope"]
    public = {n for n in dir(Module) if not n.startswith("_")} - {"export_library"}
    assert public <= set(dir(loaded)), public - set(dir(loaded))
    assert "int32_t mm(" in loaded.get_source("h")
    with pytest.raises(TecompError, match="machine code"):
        loaded.get_source("asm")


_C_PROGRAM = textwrap.dedent('''
    #include <stdio.h>
    #include "kernels.h"
    #include "dbg.h"

    int main(void) {
        static float a[64 * 48], b[48 * 32], c[64 * 32];
        float x[5] = {0.f, 0.5f, -1.f, 2.f, 3.f}, y[5], d[4];
        int32_t q[6] = {1, 2, 3, 4, 5, 6}, r[2];
        for (int i = 0; i < 64 * 48; i++) a[i] = (float)(i % 7) - 3.f;
        for (int i = 0; i < 48 * 32; i++) b[i] = (float)(i % 5) * 0.25f;
        int rc = mm(a, b, c) | tanh2(x, y, 5) | diff(x, d, 5) | rowsum(q, r, 2, 3);
        if (rc != TECOMP_OK) return 1;
        double sum = 0;
        for (int i = 0; i < 64 * 32; i++) sum += c[i];
        printf("%.6f %.7g %.7g %.7g %d %d\\n", sum, y[3], d[2], y[0], r[0], r[1]);
        float e[20] = {0}, f[20];
        rc = shift(e, f, 20);
        printf("%d %d %lld %lld\\n", rc == TECOMP_ERR_OUT_OF_BOUNDS, __tecomp_oob_shift.buffer,
               (long long)__tecomp_oob_shift.index, (long long)__tecomp_oob_shift.extent);
        return 0;
    }
''')


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_program_calls_exported_kernels(built: dict[str, Any], tmp_path: Path) -> None:
    src = tmp_path / "main.c"
    src.write_text(_C_PROGRAM)
    out = built["out"]
    exe = tmp_path / "main"
    cc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(src),
                         f"-I{out}", f"-L{out}", "-l:kernels.so", "-l:dbg.so",
                         f"-Wl,-rpath,{out}"], capture_output=True, text=True, timeout=60)
    assert cc.returncode == 0, cc.stderr
    # the header is valid C++ too
    cxx = subprocess.run(["g++", "-fsyntax-only", "-x", "c++", "-"], input='#include "kernels.h"\n',
                         capture_output=True, text=True, timeout=60, cwd=out)
    assert cxx.returncode == 0 or shutil.which("g++") is None, cxx.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    line1, line2 = run.stdout.split("\n")[:2]
    a = (np.arange(M * K) % 7 - 3).astype(np.float32).reshape(M, K)
    b = ((np.arange(K * N) % 5) * 0.25).astype(np.float32).reshape(K, N)
    vals = line1.split()
    np.testing.assert_allclose(float(vals[0]), float((a @ b).sum()), rtol=1e-6)
    np.testing.assert_allclose([float(v) for v in vals[1:4]],
                               [np.tanh(2.0) * 2, 2.0 - (-1.0), 0.0], rtol=1e-6)
    assert vals[4:] == ["6", "15"]
    assert line2.split() == ["1", "0", "20", "20"]  # OOB code; buffer 0 = 'A', index 20 of 20


def _copy_library(built: dict[str, Any], dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for p in (built["files"].library, built["files"].header, built["files"].manifest):
        shutil.copy(p, dst / p.name)
    return dst / "kernels.so"


def _edit_manifest(lib: Path, edit: Any) -> None:
    path = lib.with_suffix(".json")
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_refuses_library_for_cpu_features_this_machine_lacks(built: dict[str, Any],
                                                             tmp_path: Path) -> None:
    flags = host_cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    lacking = [f for f, flag in CPU_FLAGS.items() if flag not in flags]
    if not lacking:
        pytest.skip("this CPU has every feature the loader knows")
    lib = _copy_library(built, tmp_path / "fake")
    _edit_manifest(lib, lambda d: d["target"]["required_features"].append(lacking[0]))
    with pytest.raises(TecompError, match=f"{lib}.*lacks: {lacking[0]}"):
        load_module(lib)
    # another architecture, or a feature this loader does not know, is refused as well
    _edit_manifest(lib, lambda d: d["target"].update(
        triple="aarch64-unknown-linux-gnu", required_features=[]))
    with pytest.raises(TecompError, match="aarch64"):
        load_module(lib)
    man = read_manifest(built["files"].manifest)
    old_cpu = dataclasses.replace(man, required_features=("sse2", "avx2", "fma"))
    with pytest.raises(TecompError, match="lacks: avx2, fma"):
        check_runnable(old_cpu, lib, flags=frozenset({"sse", "sse2"}))
    check_runnable(old_cpu, lib, flags=frozenset({"sse2", "avx2", "fma"}))
    with pytest.raises(TecompError, match="cannot check"):
        check_runnable(dataclasses.replace(man, required_features=("avx99",)), lib, flags)


def test_refuses_real_library_compiled_for_a_missing_feature(tmp_path: Path) -> None:
    flags = host_cpu_flags()
    if flags is None or "avx512_fp16" in flags:
        pytest.skip("this CPU has AVX512-FP16 (or no /proc/cpuinfo)")
    n = te.var("n")
    X = te.placeholder((n,), "float16", name="X")
    Y = te.compute((n,), lambda i: X[i] * X[i], name="Y")
    s = te.create_schedule(Y.op)
    _, yi = s[Y].split(Y.op.axis[0], factor=32)
    s[Y].vectorize(yi)
    # tc.build would refuse to JIT this; build_library compiles without running it
    files = build_library(s, [X, Y], path=tmp_path / "fp16.so", name="sq",
                          target="llvm -mattr=+avx512fp16,+avx512vl")
    assert "avx512fp16" in json.loads(files.manifest.read_text())["target"]["required_features"]
    assert "uint16_t* Y" in files.header.read_text()
    with pytest.raises(TecompError, match="lacks: avx512fp16"):
        load_module(files.library)


@pytest.mark.parametrize("damage", [
    "truncated", "not-json", "wrong-schema", "missing-field", "bad-shape", "no-kernels",
    "newer-version", "missing-manifest",
])
def test_damaged_manifest_is_a_clear_error(built: dict[str, Any], tmp_path: Path,
                                           damage: str) -> None:
    lib = _copy_library(built, tmp_path)
    man = lib.with_suffix(".json")
    text = man.read_text()
    edits = {
        "wrong-schema": lambda d: d.update(schema="something-else"),
        "missing-field": lambda d: d["kernels"][1].pop("dims"),
        "bad-shape": lambda d: d["kernels"][0]["params"][0].update(
            shape=["__import__('os').system('true')", 48]),
        "no-kernels": lambda d: d.update(kernels=[]),
        "newer-version": lambda d: d.update(schema_version=99),
    }
    if damage == "truncated":
        man.write_text(text[: len(text) // 2])
    elif damage == "not-json":
        man.write_bytes(b"\x7fELF\x00\x01garbage")
    elif damage == "missing-manifest":
        man.unlink()
    else:
        _edit_manifest(lib, edits[damage])
    with pytest.raises(TecompError, match=str(man)):
        load_module(lib)


def test_damaged_shared_object_is_a_clear_error(built: dict[str, Any], tmp_path: Path) -> None:
    lib = _copy_library(built, tmp_path)
    blob = lib.read_bytes()
    lib.write_bytes(blob[: len(blob) // 3])
    with pytest.raises(TecompError, match=f"{lib} does not match its manifest"):
        load_module(lib)
    # garbage whose hash the manifest agrees with still fails cleanly in dlopen
    lib.write_bytes(b"this is not an ELF file" * 10)
    _edit_manifest(lib, lambda d: d.update(sha256=hashlib.sha256(lib.read_bytes()).hexdigest()))
    with pytest.raises(TecompError, match=f"could not load the shared object {lib}"):
        load_module(lib)
    with pytest.raises(TecompError, match="does not exist"):
        load_module(tmp_path / "missing.so")


def test_reexport_to_the_same_path_loads_the_new_code(tmp_path: Path) -> None:
    path = tmp_path / "k.so"
    A = te.placeholder((4,), "float32", name="A")
    for scale in (2.0, 3.0):  # glibc would hand back the first mapping for the same path
        B = te.compute((4,), lambda i: A[i] * scale, name="B")  # noqa: B023 - used at once
        tc.build(te.create_schedule(B.op), [A, B], name="scale").export_library(path)
        b = np.zeros(4, np.float32)
        load_module(path)(np.ones(4, np.float32), b)
        np.testing.assert_array_equal(b, np.full(4, scale, np.float32))


def test_export_argument_errors(built: dict[str, Any], tmp_path: Path) -> None:
    lib = built["dbg"]
    with pytest.raises(TecompError, match="JSON values"):
        lib.export_library(tmp_path / "x.so", provenance={"time": object()})
    with pytest.raises(TecompError, match="lacks"):
        lib.export_library(tmp_path / "x.so", kernel_provenance={"nope": {}})
    with pytest.raises(TecompError, match="nosuchlib|linking"):
        lib.export_library(tmp_path / "x.so", libs=["-lnosuchlib_tecomp"])
    assert not (tmp_path / "x.so").exists() and not (tmp_path / "x.json").exists()


def test_header_names_are_valid_c() -> None:
    k = KernelSpec("k", (ParamSpec("int", "float16", ("n",)), ParamSpec("n", "bool", (3,), True),
                         ParamSpec("A.x", "uint8", (2,), True)), ("n",))
    assert c_prototype(k) == ("int32_t k(const uint16_t* int_, bool* n_1, uint8_t* A_x, "
                              "int64_t n);")
    with pytest.raises(TecompError, match="C function name"):
        from tecomp.runtime.export import _check_kernel_names

        _check_kernel_names(["double"])


def test_shape_with_min_max_is_checked_at_call_time():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((te.max(n - 2, 1),), lambda i: A[i] * 2, name="B")
    f = tc.build(te.create_schedule(B.op), [A, B])
    a = np.arange(5, dtype="float32")
    b = np.zeros(3, "float32")
    f(a, b)
    np.testing.assert_array_equal(b, a[:3] * 2)
    with pytest.raises(ValueError, match=r"max\(\(n - 2\), 1\)"):
        f(a, np.zeros(4, "float32"))


# scalar parameters (a te.var in the argument list) in exported libraries ----------------------


def _scalar_kernel():  # noqa: ANN202
    n = te.var("n")
    alpha = te.var("alpha", "float32")
    k = te.var("k", "int64")
    flag = te.var("flag", "int32")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: te.if_then_else(flag != 0, A[i] * alpha + k.astype("float32"), A[i]),
                   name="B")
    s = te.create_schedule(B.op)
    return tc.build(s, [A, alpha, k, B, flag, n], name="axpyk")


def test_scalar_params_export_header_manifest_and_load(tmp_path: Path) -> None:
    f = _scalar_kernel()
    path = tmp_path / "sc.so"
    f.export_library(path)
    header = (tmp_path / "sc.h").read_text()
    assert ("int32_t axpyk(const float* A, float* B, int64_t n, float alpha, int64_t k, int32_t flag);"
            in header)
    assert "scalar, by value" in header and "also a scalar argument" in header
    manifest = json.loads((tmp_path / "sc.json").read_text())
    (entry,) = manifest["kernels"]
    params = [ParamSpec.from_json(p) for p in entry["params"]]
    assert [p.name for p in params if p.scalar] == ["alpha", "k", "flag", "n"]
    assert params[1] == ParamSpec("alpha", "float32", (), False, True)
    m = load_module(path)
    a = np.arange(6, dtype=np.float32)
    b = np.zeros(6, np.float32)
    m(a, 2.5, 3, b, 1, 6)
    np.testing.assert_array_equal(b, a * 2.5 + 3)
    m(a, np.float32(-1), np.int64(1), b, 0, 6)
    np.testing.assert_array_equal(b, a)
    ref = np.zeros(6, np.float32)
    f(a, 2.5, 3, ref, 1, 6)
    m(a, 2.5, 3, b, 1, 6)
    np.testing.assert_array_equal(b, ref)
    # the same type checks as the JIT: each message names the argument
    for bad, exc, match in [
        ((a, "x", 3, b, 1, 6), TypeError, "alpha"),
        ((a, 2.5, 3.5, b, 1, 6), TypeError, "k"),
        ((a, 2.5, 2**70, b, 1, 6), (TypeError, OverflowError, ValueError), "k"),
        ((a, 2.5, 3, b, 1, 7), ValueError, "n"),
        ((a, 2.5, 3, b, 1), TypeError, "arguments"),
    ]:
        with pytest.raises(exc, match=match):
            m(*bad)
        with pytest.raises(exc, match=match):
            f(*bad)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_program_passes_scalars_by_value(tmp_path: Path) -> None:
    _scalar_kernel().export_library(tmp_path / "sc.so")
    src = tmp_path / "main.c"
    src.write_text(textwrap.dedent('''
        #include <stdio.h>
        #include "sc.h"
        int main(void) {
            float a[4] = {0, 1, 2, 3}, b[4];
            int rc = axpyk(a, b, 4, 0.5f, (int64_t)10, 1);
            printf("%d %g %g %g %g\\n", rc, b[0], b[1], b[2], b[3]);
            return 0;
        }
    '''))
    exe = tmp_path / "main"
    cc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(src),
                         f"-I{tmp_path}", f"-L{tmp_path}", "-l:sc.so", f"-Wl,-rpath,{tmp_path}"],
                        capture_output=True, text=True, timeout=60)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["0", "10", "10.5", "11", "11.5"], run.stderr
