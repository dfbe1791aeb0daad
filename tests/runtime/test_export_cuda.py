"""export_library / load_module for cuda functions (tecomp/runtime/export.py, loader.py).

One library holds a CPU function and three cuda functions: a single kernel over a symbolic n,
a shared-memory GEMM and two root stages (two kernels with an intermediate tensor). Without a
GPU: the manifest's contents, the PTX assembled by ptxas for sm_80/sm_90 and the cubins beside
it, loading in a fresh interpreter where llvmlite cannot be imported (listing functions and
signatures, the CPU function run, the cuda one refused with the reason after the same argument
checks as the built one), damaged bundles refused, and the launches of a loaded function
against the stand-in libcuda of test_cuda_runtime.py (fake_libcuda.c, wrapped here to log
every launch). With a GPU (``-m gpu``): loaded kernels against numpy.
"""

from __future__ import annotations

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
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import TecompError
from tecomp.runtime import cuda
from tecomp.runtime.args import ParamSpec
from tecomp.runtime.export import build_library, cubin_archs_for, export_modules
from tecomp.runtime.loader import LoadedCudaFunction, load_module, read_manifest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "te"))
sys.path.insert(0, str(HERE))
from test_gpu_lowering import simt_gemm, vector_add  # noqa: E402
from test_gpu_multi_kernel import two_elementwise  # noqa: E402

HAVE_PTXAS = find_ptxas() is not None
needs_ptxas = pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas (CUDA toolkit) not installed")
GEMM_N, TILE = 64, 16


def _cpu_scale() -> tuple[Any, list[Any]]:
    n = te.var("n")
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n,), lambda i: X[i] * 3.0, name="Y")
    return te.create_schedule(Y.op), [X, Y]


def _cuda_funcs() -> list[tuple[Any, list[Any], str]]:
    s1, a1 = vector_add(te.var("n"))
    s2, a2 = simt_gemm(GEMM_N, TILE)
    s3, a3 = two_elementwise(te.var("n"))
    return [(s1, a1, "vadd"), (s2, a2, "gemm"), (s3, a3, "twice")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("export_cuda") / "out"
    gpu = tc.build(_cuda_funcs(), target="cuda")
    s, args = _cpu_scale()
    cpu = tc.build(s, args, target="llvm", name="scale")
    files = export_modules([cpu, gpu], out / "kernels.so", provenance={"log": "t.jsonl"},
                           kernel_provenance={"twice": {"record_hash": "sha256:1"}})
    only = tc.build(*vector_add(te.var("n"))[:2], target="cuda", name="vadd")
    ofiles = only.export_library(out / "gpu_only.so")
    return {"out": out, "gpu": gpu, "cpu": cpu, "files": files, "only": only, "ofiles": ofiles}


def _rand(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# the bundle and its manifest -----------------------------------------------------------------


def test_bundle_files(bundle: dict[str, Any]) -> None:
    files, out = bundle["files"], bundle["out"]
    assert files.library == out / "kernels.so" and files.library.is_file()
    assert files.manifest == out / "kernels.json" and files.header == out / "kernels.h"
    assert files.ptx == out / "kernels.ptx" and files.ptx.read_text() == bundle["gpu"].ptx
    if HAVE_PTXAS:
        assert sorted(files.cubins) == ["sm_80", "sm_90"]
        for path in files.cubins.values():
            assert path.read_bytes()[:4] == b"\x7fELF"
    else:
        assert files.cubins == {}
    assert not [p for p in out.iterdir() if p.name.startswith(".tecomp-export")]
    # a library of cuda functions only: no shared object, the PTX is what load_module takes
    ofiles = bundle["ofiles"]
    assert ofiles.library == ofiles.ptx == out / "gpu_only.ptx"
    assert not (out / "gpu_only.so").exists()
    header = files.header.read_text()
    assert "int32_t scale(const float* X, float* Y, int64_t n);" in header
    assert "twice_kernel0(A, B, n) grid (((n + 127) // 128), 1, 1) block (128, 1, 1)" in header


def test_manifest_describes_cuda_functions(bundle: dict[str, Any]) -> None:
    files, gpu = bundle["files"], bundle["gpu"]
    man = json.loads(files.manifest.read_text())
    assert man["schema_version"] == 2 and man["library"] == "kernels.so"
    assert man["target"]["triple"] == bundle["cpu"].target.triple
    c = man["cuda"]
    ptx_text = files.ptx.read_text()
    assert c["target"] == "cuda -arch=sm_80" and c["arch"] == "sm_80"
    assert c["ptx"]["file"] == "kernels.ptx" and c["ptx"]["target"] == "sm_80"
    assert f".version {c['ptx']['isa_version']}" in ptx_text and c["ptx"]["address_size"] == 64
    if HAVE_PTXAS:
        assert [(b["arch"], b["file"]) for b in c["cubins"]] == [
            ("sm_80", "kernels.sm_80.cubin"), ("sm_90", "kernels.sm_90.cubin")]
        assert c["cubins_skipped"] is None and all(b["ptxas_version"] for b in c["cubins"])
    else:
        assert c["cubins"] == [] and "ptxas" in c["cubins_skipped"]
    kern = {k["name"]: k for k in man["kernels"]}
    assert [k["name"] for k in man["kernels"]] == ["scale", "vadd", "gemm", "twice"]
    assert kern["scale"]["kind"] == "llvm" and "c_prototype" in kern["scale"]
    assert kern["twice"]["provenance"] == {"log": "t.jsonl", "record_hash": "sha256:1",
                                           "measured_time_s": None}

    vadd = kern["vadd"]
    assert vadd["kind"] == "cuda" and vadd["dims"] == ["n"] and vadd["intermediates"] == []
    assert [ParamSpec.from_json(p) for p in vadd["params"]] == list(gpu["vadd"].params)
    (launch,) = vadd["launches"]
    assert launch["kernel"] == "vadd" and launch["args"] == [0, 1, 2] and launch["dim_args"] == [0]
    assert launch["grid"] == ["((n + 127) // 128)", 1, 1] and launch["block"] == [128, 1, 1]
    assert launch["shared_bytes"] == 0 and launch["dynamic_shared_bytes"] == 0

    (g,) = kern["gemm"]["launches"]
    assert kern["gemm"]["dims"] == []
    assert g["grid"] == [GEMM_N // TILE, GEMM_N // TILE, 1] and g["block"] == [TILE, TILE, 1]
    assert g["shared_bytes"] == 2 * TILE * TILE * 4  # two float32 tiles in shared memory
    for b in c["cubins"]:  # ptxas agrees with the count made from the IR
        assert b["resources"]["gemm"]["shared_bytes"] == g["shared_bytes"]
        assert b["resources"]["gemm"]["spill_stores"] == 0

    tw = kern["twice"]
    assert [k["kernel"] for k in tw["launches"]] == ["twice_kernel0", "twice_kernel1"]
    assert [k["args"] for k in tw["launches"]] == [[0, 2], [1, 2]]  # A, C, then intermediate B
    assert [k["block"] for k in tw["launches"]] == [[128, 1, 1], [64, 1, 1]]
    assert tw["launches"][1]["grid"] == ["((n + 63) // 64)", 1, 1]
    assert tw["intermediates"] == [{"name": "B", "dtype": "float32", "shape": ["n"],
                                    "output": False}]
    assert [p["name"] for p in tw["launches"][0]["params"]] == ["A", "B"]
    assert [p["output"] for p in tw["launches"][0]["params"]] == [False, True]


def test_loaded_plans_launch_like_the_built_ones(bundle: dict[str, Any]) -> None:
    man = read_manifest(bundle["files"].manifest)
    mod = cuda.CudaModule("// not loaded")
    for entry in man.kernels[1:]:
        built = bundle["gpu"][entry.name].plan
        plan = entry.plan
        assert plan is not None and entry.kind == "cuda"
        assert plan.spec == built.spec and plan.intermediates == built.intermediates
        assert [(k.spec, k.args, k.dims, k.shared_mem) for k in plan.kernels] == \
            [(k.spec, k.args, k.dims, k.shared_mem) for k in built.kernels]
        for n in (1, 127, 1000):
            dims = (n,) * len(plan.spec.dims)
            for a, b in zip(plan.kernels, built.kernels, strict=True):
                ka = mod.kernel_for(a.spec, a.launch)
                kb = mod.kernel_for(b.spec, b.launch)
                sub = tuple(dims[j] for j in a.dims)
                assert ka.launch_dims(sub) == kb.launch_dims(sub)


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bundled_ptx_passes_ptxas(bundle: dict[str, Any], tmp_path: Path, arch: str) -> None:
    out = tmp_path / f"{arch}.cubin"
    r = subprocess.run([find_ptxas() or "ptxas", f"-arch={arch}", "-o", str(out),
                        str(bundle["files"].ptx)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"


def test_cubin_archs() -> None:
    assert cubin_archs_for("sm_80") == ["sm_80", "sm_90"]
    assert cubin_archs_for("sm_75") == ["sm_75", "sm_80", "sm_90"]
    assert cubin_archs_for("sm_86") == ["sm_86", "sm_90"]  # PTX for 8.6 cannot make an 8.0 cubin
    assert cubin_archs_for("sm_90") == ["sm_90"]
    assert cubin_archs_for("sm_90a") == ["sm_90a"]
    assert cubin_archs_for("sm_80", ["sm_90"]) == ["sm_90"]
    assert cubin_archs_for("sm_80", []) == []


def test_pick_cubin() -> None:
    both = {"sm_80": b"", "sm_90": b""}
    assert cuda.pick_cubin(both, (8, 0)) == "sm_80"
    assert cuda.pick_cubin(both, (8, 6)) == "sm_80"  # same major, later minor: binary compatible
    assert cuda.pick_cubin(both, (8, 9)) == "sm_80"
    assert cuda.pick_cubin(both, (9, 0)) == "sm_90"
    assert cuda.pick_cubin(both, (10, 0)) is None  # a new major: the PTX is JIT-compiled
    assert cuda.pick_cubin(both, (7, 5)) is None
    assert cuda.pick_cubin({"sm_90a": b""}, (9, 0)) == "sm_90a"
    assert cuda.pick_cubin({"sm_86": b"", "sm_80": b""}, (8, 9)) == "sm_86"


def test_build_library_for_cuda(tmp_path: Path) -> None:
    s, args = vector_add(te.var("n"))
    files = build_library(s, args, path=tmp_path / "v.so", target="cuda -arch=sm_90", name="v")
    man = json.loads(files.manifest.read_text())
    assert man["cuda"]["arch"] == "sm_90" and man["cuda"]["ptx"]["target"] == "sm_90"
    assert [b["arch"] for b in man["cuda"]["cubins"]] == (["sm_90"] if HAVE_PTXAS else [])
    assert load_module(files.library).function_names == ["v"]


def test_the_cuda_backend_exports(tmp_path: Path) -> None:
    # the Backend interface the CLI's export goes through writes the same bundle
    from tecomp.codegen.backend import backend_for
    from tecomp.codegen.target import Target
    from tecomp.lowering import lower
    from tecomp.passes.pipeline import run_pipeline

    s, args = vector_add(te.var("n"))
    be = backend_for("cuda")
    art = be.codegen([run_pipeline(lower(s, args, name="v", target="cuda"))], Target.parse("cuda"))
    files = be.export(art, tmp_path / "v.so")
    assert files.ptx is not None and files.ptx.exists()
    assert sorted(files.cubins) == (["sm_80", "sm_90"] if HAVE_PTXAS else [])
    assert load_module(files.manifest).function_names == ["v"]
    assert tc.runtime.export_modules is export_modules


def test_one_module_per_kind(bundle: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(TecompError, match="one cuda module"):
        export_modules([bundle["gpu"], bundle["only"]], tmp_path / "x.so")
    s, args = _cpu_scale()
    dup = tc.build(s, args, target="llvm", name="vadd")
    with pytest.raises(TecompError, match="unique"):
        export_modules([dup, bundle["only"]], tmp_path / "x.so")


# loading without the compiler ----------------------------------------------------------------

_CHILD = textwrap.dedent('''
    import importlib.abc, json, sys

    BLOCKED = tuple(sys.argv[3].split(","))

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "cuda.bindings" or name.startswith("cuda.bindings."):
                top = "cuda"
            else:
                top = name.partition(".")[0]
            if top in BLOCKED:
                raise ImportError(f"{name} is not installed on this deployment")
            return None

    sys.meta_path.insert(0, _Block())
    import numpy as np
    import tecomp as tc

    def err(fn, *args):
        try:
            fn(*args)
        except Exception as e:
            return [type(e).__name__, str(e), getattr(e, "kind", None)]
        return None

    report = {}
    lib = tc.runtime.load_module(sys.argv[1])
    report["names"] = lib.function_names
    report["sigs"] = {n: repr(lib[n]) for n in lib.function_names}
    report["params"] = {n: [[p.name, p.dtype, list(p.shape), p.output] for p in lib[n].params]
                        for n in lib.function_names}
    report["kernels"] = {n: getattr(lib[n], "kernels", None) for n in lib.function_names}
    report["bindings_after_listing"] = "cuda.bindings" in sys.modules
    x = np.arange(10, dtype=np.float32)
    y = np.zeros_like(x)
    lib["scale"](x, y)
    report["scale_ok"] = bool(np.array_equal(y, x * 3))
    a = np.ones(1000, np.float32)
    report["bad_count"] = err(lib["vadd"], a, a)
    report["bad_shape"] = err(lib["twice"], a, np.zeros(999, np.float32))
    report["call"] = err(lib["vadd"], a, a, np.zeros_like(a))
    report["call_multi"] = err(lib["twice"], a, np.zeros_like(a))
    report["timing"] = err(lambda: lib["vadd"].time_evaluator()(a, a, np.zeros_like(a)))
    report["ptx"] = lib.get_source("ptx") == open(sys.argv[2]).read()
    report["leaked"] = [m for m in sys.modules if m.split(".")[0] == "llvmlite"]
    report["compiler"] = [m for m in sys.modules if m.startswith(("tecomp.codegen.llvm",
                          "tecomp.lowering", "tecomp.passes", "tecomp.runtime.module",
                          "tecomp.runtime.gpu_"))]
    print(json.dumps(report))
''')


@pytest.mark.parametrize("blocked", ["llvmlite", "llvmlite,cuda"])
def test_load_in_fresh_process_without_llvmlite(bundle: dict[str, Any], tmp_path: Path,
                                               blocked: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    files = bundle["files"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TECOMP_CUDA_EMULATE", None)
    res = subprocess.run([sys.executable, str(script), str(files.library), str(files.ptx),
                          blocked], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    assert rep["leaked"] == [] and rep["compiler"] == [] and rep["scale_ok"] and rep["ptx"]
    assert rep["names"] == ["scale", "vadd", "gemm", "twice"]
    assert not rep["bindings_after_listing"]  # listing never touches cuda-bindings
    assert rep["params"]["vadd"] == [["A", "float32", ["n"], False], ["B", "float32", ["n"], False],
                                     ["C", "float32", ["n"], True]]
    assert rep["params"]["gemm"][2] == ["C", "float32", [GEMM_N, GEMM_N], True]
    assert rep["kernels"]["twice"] == ["twice_kernel0", "twice_kernel1"]
    assert rep["sigs"]["vadd"].startswith("<tecomp.LoadedCudaFunction vadd(A: float32['n']")
    # wrong arguments: the built function's own errors, before any word about the GPU
    gpu, a = bundle["gpu"], np.ones(1000, np.float32)
    for key, fn, args in [("bad_count", gpu["vadd"], (a, a)),
                          ("bad_shape", gpu["twice"], (a, np.zeros(999, np.float32)))]:
        with pytest.raises((TypeError, ValueError)) as want:
            fn(*args)
        assert rep[key][:2] == [type(want.value).__name__, str(want.value)]
    if cuda.cuda_available()[0]:
        return
    for key in ("call", "call_multi", "timing"):
        name, msg, kind = rep[key]
        fname = "twice" if key == "call_multi" else "vadd"
        assert name == "CudaUnavailable", rep[key]
        assert msg.startswith(f"cannot run cuda kernel {fname} of library {files.library}: ")
        assert "cannot be emulated" in msg and f"target='cuda')['{fname}'].emulate" in msg
        if blocked.endswith("cuda"):
            assert kind == "not-installed" and "cuda-bindings is not installed" in msg
        else:
            assert kind in ("no-driver", "no-device")


def test_load_a_gpu_only_library_by_any_of_its_names(bundle: dict[str, Any]) -> None:
    ofiles = bundle["ofiles"]
    for path in (ofiles.library, ofiles.manifest, ofiles.manifest.with_suffix(".so")):
        lib = load_module(path)
        assert lib.function_names == ["vadd"] and lib.target == "cuda -arch=sm_80"
        assert isinstance(lib["vadd"], LoadedCudaFunction) and lib["vadd"].loaded_from is None
    assert "vadd(float32[n] A" in lib.get_source("h")
    with pytest.raises(TecompError, match="nothing.so does not exist"):
        load_module(ofiles.library.with_name("nothing.so"))
    with pytest.raises(TecompError, match="has no manifest"):
        load_module(ofiles.library.with_name("nothing.ptx"))


def test_emulation_is_refused_for_loaded_functions(bundle: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TECOMP_CUDA_EMULATE", "1")
    lib = load_module(bundle["files"].library)
    a = np.ones(8, np.float32)
    with pytest.raises(TecompError, match="TECOMP_CUDA_EMULATE is set, but a loaded library"):
        lib["vadd"](a, a, np.zeros_like(a))


def _copy(bundle: dict[str, Any], tmp_path: Path) -> Path:
    for p in bundle["out"].iterdir():
        if p.name.startswith("kernels."):
            shutil.copy(p, tmp_path / p.name)
    return tmp_path / "kernels.so"


def _edit(man: Path, fn: Any) -> None:
    data = json.loads(man.read_text())
    fn(data)
    man.write_text(json.dumps(data))


def _kernel(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(k for k in d["kernels"] if k["name"] == name)


@pytest.mark.parametrize("damage, text", [
    ("ptx-changed", "does not match its manifest"),
    ("ptx-missing", "is missing"),
    ("cubin-changed", "cubin .* does not match"),
    ("evil-extent", "must be a non-negative int or an expression over dim names"),
    ("unknown-dim", r"uses \['m'\], which are not dims of the kernel"),
    ("bad-extent", "must be a non-negative int"),
    ("arg-out-of-range", "indices below"),
    ("dtype-mismatch", "but its argument"),
    ("path-in-file", "must name a file next to the manifest"),
    ("no-launches", "launches no kernel"),
    ("unknown-kind", "of kind 'metal'"),
    ("no-cuda-section", "has no 'cuda' section"),
])
def test_damaged_cuda_bundle_is_a_clear_error(bundle: dict[str, Any], tmp_path: Path,
                                              damage: str, text: str) -> None:
    lib = _copy(bundle, tmp_path)
    man = tmp_path / "kernels.json"
    edits = {
        "evil-extent": lambda d: _kernel(d, "vadd")["launches"][0].update(
            grid=["__import__('os').system('true')", 1, 1]),
        "unknown-dim": lambda d: _kernel(d, "vadd")["launches"][0].update(grid=["n + m", 1, 1]),
        "bad-extent": lambda d: _kernel(d, "vadd")["launches"][0].update(block=[-1, 1, 1]),
        "arg-out-of-range": lambda d: _kernel(d, "twice")["launches"][0].update(args=[0, 7]),
        "dtype-mismatch": lambda d: _kernel(d, "vadd")["launches"][0]["params"][0].update(
            dtype="int32"),
        "path-in-file": lambda d: d["cuda"]["ptx"].update(file="../kernels.ptx"),
        "no-launches": lambda d: _kernel(d, "gemm").update(launches=[]),
        "unknown-kind": lambda d: _kernel(d, "gemm").update(kind="metal"),
        "no-cuda-section": lambda d: d.update(cuda=None),
    }
    if damage == "ptx-changed":
        (tmp_path / "kernels.ptx").write_text("// another PTX\n")
    elif damage == "ptx-missing":
        (tmp_path / "kernels.ptx").unlink()
    elif damage == "cubin-changed":
        if not HAVE_PTXAS:
            pytest.skip("no cubins without ptxas")
        (tmp_path / "kernels.sm_90.cubin").write_bytes(b"\x7fELF broken")
    else:
        _edit(man, edits[damage])
    with pytest.raises(TecompError, match=text):
        load_module(lib)


# the driver path against the stand-in libcuda --------------------------------------------------

# fake_libcuda.c with cuModuleLoadData / cuModuleGetFunction / cuLaunchKernel wrapped: any
# kernel name is found, and every launch is logged (name, grid, block, shared bytes, its
# parameters, and for pointer parameters the first 4 bytes they point to), with the
# parameter kinds set per kernel by the test ("p" pointer, "d" int64).
SHIM = r"""
/* renamed on the way in: the fake's entry table keeps the driver names (E(f) stringifies its
   argument unexpanded) for its base_ functions; cuGetProcAddress below hands out the
   wrappers first */
#define cuGetProcAddress_v2 base_cuGetProcAddress_v2
#define cuGetProcAddress base_cuGetProcAddress
#define cuModuleLoadData base_cuModuleLoadData
#define cuModuleGetFunction base_cuModuleGetFunction
#define cuLaunchKernel base_cuLaunchKernel
#include "fake_libcuda.c"
#undef cuGetProcAddress_v2
#undef cuGetProcAddress
#undef cuModuleLoadData
#undef cuModuleGetFunction
#undef cuLaunchKernel

struct launch_log { char name[64]; uint32_t grid[3], block[3], shared; int nparams;
                    uint64_t params[16]; uint32_t peek[16]; };
struct launch_log fake_log[64];
int fake_nlog;
char fake_image_magic[8];
static struct { char name[64]; char sig[17]; } sigs[32];
static int nsigs;

void fake_set_sig(const char *name, const char *sig) {
  strncpy(sigs[nsigs].name, name, 63); strncpy(sigs[nsigs].sig, sig, 16); nsigs++;
}
static const char *sig_of(const char *name) {
  for (int i = 0; i < nsigs; i++) if (!strcmp(sigs[i].name, name)) return sigs[i].sig;
  return "";
}
CUresult cuModuleLoadData(void **mod, const void *image) {
  memcpy(fake_image_magic, image, 4);
  return base_cuModuleLoadData(mod, image);
}
CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
  if (!want_ctx()) return INVALID_CONTEXT;
  *f = strdup(name);
  return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  CUresult r = base_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
  if (r != OK || fake_nlog >= 64) return r;
  struct launch_log *l = &fake_log[fake_nlog++];
  strncpy(l->name, (const char *)f, 63);
  l->grid[0] = gx; l->grid[1] = gy; l->grid[2] = gz;
  l->block[0] = bx; l->block[1] = by; l->block[2] = bz; l->shared = shared;
  const char *sig = sig_of((const char *)f);
  l->nparams = (int)strlen(sig);
  for (int i = 0; i < l->nparams; i++) {
    l->params[i] = *(uint64_t *)params[i];
    if (sig[i] == 'p' && l->params[i]) memcpy(&l->peek[i], (void *)(uintptr_t)l->params[i], 4);
  }
  return OK;
}
static struct { const char *name; void *fn; } wrapped[] = {
  {"cuModuleLoadData", (void *)cuModuleLoadData}, {"cuModuleGetFunction", (void *)cuModuleGetFunction},
  {"cuLaunchKernel", (void *)cuLaunchKernel},
};
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  for (size_t i = 0; i < sizeof wrapped / sizeof wrapped[0]; i++)
    if (!strcmp(sym, wrapped[i].name)) { *pfn = wrapped[i].fn; if (status) *status = 0; return OK; }
  return base_cuGetProcAddress_v2(sym, pfn, ver, flags, status);
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags) {
  return cuGetProcAddress_v2(sym, pfn, ver, flags, 0);
}
"""

FAKE_SCRIPT = r"""
import ctypes, json, sys
import numpy as np
import tecomp as tc

lib = ctypes.CDLL("libcuda.so.1")
class Log(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("shared", ctypes.c_uint32),
                ("nparams", ctypes.c_int), ("params", ctypes.c_uint64 * 16),
                ("peek", ctypes.c_uint32 * 16)]
log = (Log * 64).in_dll(lib, "fake_log")
nlog = ctypes.c_int.in_dll(lib, "fake_nlog")
magic = (ctypes.c_char * 8).in_dll(lib, "fake_image_magic")

m = tc.runtime.load_module(sys.argv[1])
for e in m.manifest["kernels"]:  # pointer / int64 parameters of every PTX entry
    for k in e.get("launches", []):
        lib.fake_set_sig(k["kernel"].encode(), b"p" * len(k["params"]) + b"d" * len(k["dims"]))

def as_f32(u):
    return float(np.array([u], np.uint32).view(np.float32)[0])

def launches(since):
    out = []
    for l in log[since:nlog.value]:
        out.append({"name": l.name.decode(), "grid": list(l.grid), "block": list(l.block),
                    "shared": l.shared, "params": list(l.params[:l.nparams]),
                    "peek": [as_f32(v) for v in l.peek[:l.nparams]]})
    return out

out = {}
n = 1000
a, b, c = (np.full(n, v, np.float32) for v in (1.5, 2.5, 3.5))
m["vadd"](a, b, c)
out["vadd"] = launches(0)
out["loaded_from"] = m["vadd"].loaded_from
out["magic"] = bytes(magic.raw[:4]).hex()
seen = nlog.value
x = np.full((64, 64), 4.5, np.float32); y = np.full((64, 64), 5.5, np.float32)
m["gemm"](x, y, np.zeros((64, 64), np.float32))
out["gemm"] = launches(seen)
seen = nlog.value
m["twice"](a, c)
out["twice"] = launches(seen)
seen = nlog.value
t = m["twice"].time_evaluator(number=2, repeat=3)(a, c)
out["timing"] = [len(t.results), t.number, nlog.value - seen]
out["after"] = [lib.fake_ctx_depth()]
try:
    m["vadd"](a, b)
except TypeError as e:
    out["bad"] = str(e)
print(json.dumps(out))
"""


def _fake_run(tmp_path: Path, library: Path, script: str = FAKE_SCRIPT) -> dict[str, Any]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda")
    pytest.importorskip("cuda.bindings.driver")
    tmp_path.mkdir(exist_ok=True)
    so = tmp_path / "libcuda.so.1"
    (tmp_path / "shim.c").write_text(SHIM)
    r = subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", f"-I{HERE}",
                        "-o", str(so), str(tmp_path / "shim.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("TECOMP_CUDA_EMULATE", None)
    res = subprocess.run([sys.executable, "-c", script, str(library)], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_loaded_functions_launch_through_the_stand_in_driver(bundle: dict[str, Any],
                                                              tmp_path: Path) -> None:
    out = _fake_run(tmp_path, bundle["files"].library)
    # the fake device is an sm_80: its cubin is loaded, no JIT
    if HAVE_PTXAS:
        assert out["loaded_from"] == "cubin sm_80" and out["magic"] == b"\x7fELF".hex()
    else:
        assert out["loaded_from"] == "PTX"
    (v,) = out["vadd"]
    assert (v["name"], v["grid"], v["block"], v["shared"]) == ("vadd", [8, 1, 1], [128, 1, 1], 0)
    assert v["params"][3] == 1000 and v["peek"][:3] == [1.5, 2.5, 3.5]  # A, B, C, then n
    assert len(set(v["params"][:3])) == 3
    (g,) = out["gemm"]
    assert (g["name"], g["grid"], g["block"], g["shared"]) == ("gemm", [4, 4, 1], [16, 16, 1], 0)
    assert g["peek"] == [4.5, 5.5, 0.0] and len(g["params"]) == 3  # no dims: static shapes
    k0, k1 = out["twice"]
    assert (k0["name"], k0["grid"], k0["block"]) == ("twice_kernel0", [8, 1, 1], [128, 1, 1])
    assert (k1["name"], k1["grid"], k1["block"]) == ("twice_kernel1", [16, 1, 1], [64, 1, 1])
    assert k0["peek"][0] == 1.5 and k1["peek"][0] == 3.5  # A into kernel 0, C into kernel 1
    assert k0["params"][1] == k1["params"][1]  # the same intermediate B between them
    assert k0["params"][1] not in (k0["params"][0], k1["params"][0])
    assert k0["params"][2] == k1["params"][2] == 1000
    assert out["timing"] == [3, 2, 2 * (1 + 3 * 2)]  # warmup + repeats x number, 2 kernels each
    assert out["after"] == [0]
    assert out["bad"] == "vadd() takes 3 array arguments (A, B, C), got 2"


@needs_ptxas
def test_without_a_matching_cubin_the_ptx_is_loaded(bundle: dict[str, Any],
                                                    tmp_path: Path) -> None:
    files = export_modules([bundle["only"]], tmp_path / "lib" / "v.so", cubin_archs=["sm_90"])
    assert sorted(files.cubins) == ["sm_90"]
    script = FAKE_SCRIPT.split("x = np.full((64, 64)")[0] + "print(json.dumps(out))\n"
    out = _fake_run(tmp_path / "run", files.library, script)
    assert out["loaded_from"] == "PTX" and out["magic"] != b"\x7fELF".hex()  # no sm_80 cubin
    assert [v["name"] for v in out["vadd"]] == ["vadd"]


# on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_loaded_kernels_match_numpy(bundle: dict[str, Any]) -> None:
    lib = load_module(bundle["files"].library)
    n = 1000
    a, b = _rand(n), _rand(n, seed=1)
    c = np.zeros(n, np.float32)
    lib["vadd"](a, b, c)
    np.testing.assert_array_equal(c, a + b)
    dev = cuda.get_device(0)
    want = f"cubin {dev.arch}" if HAVE_PTXAS and dev.arch in ("sm_80", "sm_90") else None
    assert lib["vadd"].loaded_from in ((want,) if want else ("PTX", "cubin sm_80", "cubin sm_90"))
    x = np.random.default_rng(2).standard_normal((GEMM_N, GEMM_N)).astype(np.float32)
    y = np.random.default_rng(3).standard_normal((GEMM_N, GEMM_N)).astype(np.float32)
    z = np.zeros((GEMM_N, GEMM_N), np.float32)
    lib["gemm"](x, y, z)
    np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-4)
    lib["twice"](a, c)
    np.testing.assert_array_equal(c, a * 2 + (a * 2)[::-1])
    res = lib["twice"].time_evaluator(number=3, repeat=2)(a, c)
    assert len(res.results) == 2 and all(r > 0 for r in res.results)


@pytest.mark.gpu
def test_gpu_loaded_from_ptx_matches_numpy(bundle: dict[str, Any], tmp_path: Path) -> None:
    files = export_modules([bundle["only"]], tmp_path / "v.so", cubin_archs=[])
    lib = load_module(files.library)
    a, b = _rand(300), _rand(300, seed=4)
    c = np.zeros(300, np.float32)
    lib(a, b, c)
    assert lib["vadd"].loaded_from == "PTX"
    np.testing.assert_array_equal(c, a + b)
