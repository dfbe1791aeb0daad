"""Accuracy, special-value and vectorization tests for tecomp.codegen.vecmath.

Every (function, dtype, lane count) gets a tiny kernel ``out[i:i+L] = f(in[i:i+L])``
that uses real vector loads/stores; all kernels live in one module that is optimized
at O3 and JIT-compiled once per session (compilation dominates the runtime).  Results
are compared with numpy/scipy evaluated in float64 on the same inputs.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Iterator

import llvmlite.binding as llvm
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir
from scipy import special

from tecomp.codegen.vecmath import SUPPORTED, emit_math

I64 = ir.IntType(64)
ELEM: dict[str, ir.Type] = {"f32": ir.FloatType(), "f64": ir.DoubleType()}
NP: dict[str, type[np.floating]] = {"f32": np.float32, "f64": np.float64}
LANES: dict[str, tuple[int, ...]] = {"f32": (1, 4, 16), "f64": (1, 8)}
ARITY: dict[str, int] = {"power": 2, "pow": 2, "fma": 3, "atan2": 2, "hypot": 2}
CASES = [(n, d, lanes) for n in sorted(SUPPORTED) for d in ("f32", "f64") for lanes in LANES[d]]

Ref = Callable[..., np.ndarray]


def _sigmoid_ref(x: np.ndarray) -> np.ndarray:
    """scipy's expit flushes sigmoid(x < -709) to 0; this form keeps the subnormals."""
    t = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, t) / (1.0 + t)


REF: dict[str, Ref] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": _sigmoid_ref, "erf": special.erf, "abs": np.abs,
    "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
    "fma": lambda a, b, c: a * b + c, "power": np.power, "pow": np.power, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "atan2": np.arctan2, "exp10": lambda x: np.power(10.0, x), "hypot": np.hypot,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh,
}


def _kernel(module: ir.Module, name: str, dt: str, lanes: int) -> None:
    """Emit ``void k(ptr a, ptr b, ptr c, ptr out, i64 n)``; n is a multiple of lanes."""
    elem = ELEM[dt]
    vty = elem if lanes == 1 else ir.VectorType(elem, lanes)
    align = 8 if dt == "f64" else 4  # numpy buffers are only element-aligned
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * 4 + [I64]),
                     name=f"k_{name}_{dt}_{lanes}")
    *ins, out, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    ops = [b.load(b.gep(p, [i], source_etype=elem), typ=vty, align=align)
           for p in ins[:ARITY.get(name, 1)]]
    b.store(emit_math(b, name, ops), b.gep(out, [i], source_etype=elem), align=align)
    nxt = b.add(i, ir.Constant(I64, lanes))
    i.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()


def _optimized(module: ir.Module) -> tuple[llvm.ModuleRef, Callable[[], llvm.TargetMachine]]:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()

    def make_tm() -> llvm.TargetMachine:
        return llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)

    mod = llvm.parse_assembly(str(module))
    mod.verify()
    tm = make_tm()
    # llvmlite 0.50's create_pipeline_tuning_options() takes no size_level argument.
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return mod, make_tm


class Jit:
    """All kernels compiled once; ``run`` pads inputs to whole vectors."""

    def __init__(self) -> None:
        module = ir.Module(name="vecmath_test")
        for case in CASES:
            _kernel(module, *case)
        mod, make_tm = _optimized(module)
        self.engine = llvm.create_mcjit_compiler(mod, make_tm())
        self.engine.finalize_object()
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int64)
        self.fns = {c: proto(self.engine.get_function_address("k_{}_{}_{}".format(*c)))
                    for c in CASES}

    def run(self, name: str, dt: str, lanes: int, *args: np.ndarray) -> np.ndarray:
        n = args[0].size
        padded = -(-n // lanes) * lanes
        bufs = [np.ones(padded, NP[dt]) for _ in range(3)]
        for buf, a in zip(bufs, args):
            buf[:n] = a
        out = np.empty(padded, NP[dt])
        self.fns[(name, dt, lanes)](*(x.ctypes.data for x in bufs), out.ctypes.data, padded)
        return out[:n]


@pytest.fixture(scope="session")
def jit() -> Iterator[Jit]:
    yield Jit()


def check(got: np.ndarray, ref64: np.ndarray, dt: str, rtol: float, atol: float) -> float:
    """Assert NaN/inf agreement and |got-ref| <= atol + rtol*|ref|; return max rel. error."""
    with np.errstate(all="ignore"):
        ref = ref64.astype(NP[dt])  # correctly rounded reference; overflow -> inf
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN mismatch"
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), "inf mismatch"
    fin = np.isfinite(ref)
    g, r = got[fin].astype(np.float64), ref64[fin]
    assert np.all(np.isfinite(g)), f"non-finite where reference is finite: {g[~np.isfinite(g)]}"
    err = np.abs(g - r)
    bad = err > atol + rtol * np.abs(r)
    assert not bad.any(), f"max err at {r[bad][:4]} got {g[bad][:4]} (|err| {err[bad][:4]})"
    with np.errstate(all="ignore"):
        rel = np.where(r != 0, err / np.abs(r), err)
    return float(rel.max(initial=0.0))


SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e-300, 5e-324, 1e-45, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5,
           1e30, -1e30, 1e300, np.inf, -np.inf, np.nan]


def inputs(name: str, dt: str) -> tuple[list[np.ndarray], float, float]:
    """Test grid for `name` plus (rtol, atol) for the dtype."""
    f32 = dt == "f32"
    rng = np.random.default_rng(0)
    lin = np.linspace
    tiny = float(np.finfo(NP[dt]).smallest_subnormal)
    rtol, atol = (2e-6, 2 * tiny) if f32 else (1e-13, 2 * tiny)
    grid: np.ndarray
    if name in ("exp", "expm1", "sigmoid"):
        big = 88.0 if f32 else 709.0
        grid = np.concatenate([lin(-big, big, 20001), lin(-1, 1, 2001), lin(-750, 750, 3001),
                               lin(-104 if f32 else -745, -87 if f32 else -708, 2001)])
    elif name == "exp2":
        grid = np.concatenate([lin(-160, 160, 20001), lin(-1080, 1080, 3001), lin(-1, 1, 2001)])
    elif name in ("log", "log2", "log10", "sqrt", "rsqrt"):
        lo, hi = (-45, 38) if f32 else (-323, 308)
        grid = np.concatenate([np.logspace(lo, hi, 20001), lin(0.5, 2.0, 4001), lin(-3, 3, 101),
                               2.0 ** np.arange(-20, 21)])
    elif name == "log1p":
        grid = np.concatenate([lin(-1, 10, 20001), np.logspace(-40 if f32 else -300, 30, 2001),
                               -np.logspace(-40 if f32 else -300, 0, 2001), [-2.0]])
    elif name in ("tanh", "erf"):
        grid = np.concatenate([lin(-20, 20, 20001), lin(-1, 1, 2001), lin(-6, 6, 2001)])
        atol = 1e-7 if f32 else 1e-16
    elif name in ("sin", "cos"):
        grid = np.concatenate([lin(-100, 100, 20001), lin(-1e5, 1e5, 2001),
                               rng.uniform(-2.0**30, 2.0**30, 2001)])
        special = np.array(SPECIAL)
        # Accurate range is |x| < 2^30 (Cephes); beyond, see test_trig_huge_is_bounded.
        return [np.concatenate([grid, special[~(np.abs(special) >= 2.0**30)]])], rtol, (
            2e-7 if f32 else 1e-15)
    elif name == "tan":  # accurate for |x| < 2^30 like sin/cos (tests/codegen/test_vecmath_trig.py)
        grid = np.concatenate([lin(-100, 100, 20001), lin(-1e5, 1e5, 2001),
                               rng.uniform(-2.0**30, 2.0**30, 2001)])
        special = np.array(SPECIAL)
        return [np.concatenate([grid, special[~(np.abs(special) >= 2.0**30)]])], rtol, atol
    elif name in ("asin", "acos", "atanh"):
        grid = np.concatenate([lin(-1, 1, 20001), 1 - np.logspace(-7 if f32 else -15, 0, 2001),
                               -np.logspace(-40 if f32 else -300, 0, 2001), [1.5, -1.5]])
    elif name == "atan":
        grid = np.concatenate([lin(-20, 20, 20001), np.logspace(-40 if f32 else -300, 30, 2001),
                               -np.logspace(-40 if f32 else -300, 30, 2001)])
    elif name == "atan2":
        mags = np.concatenate([[0.0, 1e-40 if f32 else 5e-324, 1.0, np.inf, np.nan],
                               np.logspace(-30, 30, 41), lin(-3, 3, 61)])
        y, x = np.meshgrid(np.concatenate([mags, -mags]), np.concatenate([mags, -mags]))
        return [y.ravel(), x.ravel()], rtol, atol
    elif name in ("sinh", "cosh"):
        big = 90.0 if f32 else 711.0
        grid = np.concatenate([lin(-big, big, 20001), lin(-1, 1, 2001)])
    elif name in ("asinh", "acosh"):
        grid = np.concatenate([lin(-10, 10, 20001), np.logspace(-40 if f32 else -300, 38, 2001),
                               -np.logspace(-40 if f32 else -300, 38, 2001),
                               1 + np.logspace(-7 if f32 else -15, 0, 2001)])
    elif name == "exp10":
        grid = np.concatenate([lin(-46 if f32 else -324, 39 if f32 else 309, 20001),
                               lin(-1, 1, 2001), np.arange(-20.0, 21.0)])
    elif name == "hypot":
        mags = np.concatenate([[0.0, 5e-324, 1e-40, 1.0, np.inf, np.nan],
                               np.logspace(-320, 308, 61), np.logspace(-40, 38, 41),
                               lin(-3, 3, 31)])
        y, x = np.meshgrid(np.concatenate([mags, -mags]), np.concatenate([mags, -mags]))
        return [y.ravel(), x.ravel()], rtol, atol
    elif name in ("abs", "fabs", "floor", "ceil", "round", "trunc"):
        grid = np.concatenate([lin(-50, 50, 20001), np.arange(-10.5, 10.5, 0.5), [2.0**24 + 2]])
        rtol = 0.0
    elif name == "fma":
        a, b, c = (rng.uniform(-10, 10, 10000) for _ in range(3))
        return [a, b, c], (1e-6 if f32 else 1e-15), 1e-12
    else:  # power
        x, y = np.meshgrid(np.logspace(-8, 8, 151), lin(-8, 8, 101))
        xi, yi = np.meshgrid(-lin(0.1, 10, 51), np.arange(-9.0, 10.0))
        specials = [(0, 2), (0, 0), (0, -1), (-0.0, 3), (-0.0, -3), (-0.0, -2), (np.inf, 2),
                    (-np.inf, 3), (-np.inf, 0.5), (-np.inf, -3), (1, np.nan), (np.nan, 0),
                    (-1, np.inf), (-1, -np.inf), (2, np.inf), (0.5, np.inf), (2, -np.inf),
                    (-2, 0.5), (np.nan, 1), (1e30, 1e30), (2, 1e4), (2, -1e4), (-2, 3.0)]
        xs = np.concatenate([x.ravel(), xi.ravel(), [p[0] for p in specials]])
        ys = np.concatenate([y.ravel(), yi.ravel(), [p[1] for p in specials]])
        # f64: ~1 ulp, growing to ~2e-15 as |y log x| approaches 700 (double-double log).
        return [xs, ys], rtol if f32 else 4e-15, atol
    return [np.concatenate([grid, SPECIAL])], rtol, atol


def reference(name: str, dt: str, args: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Round inputs to dt, then evaluate the reference in float64."""
    with np.errstate(all="ignore"):
        typed = [np.asarray(a, dtype=NP[dt]) for a in args]
        return typed, REF[name](*(t.astype(np.float64) for t in typed))


@pytest.mark.parametrize(("name", "dt", "lanes"), CASES)
def test_accuracy(jit: Jit, name: str, dt: str, lanes: int) -> None:
    args, rtol, atol = inputs(name, dt)
    typed, ref = reference(name, dt, args)
    check(jit.run(name, dt, lanes, *typed), ref, dt, rtol, atol)


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_special_values(jit: Jit, dt: str) -> None:
    def f(name: str, *xs: float) -> np.ndarray:
        return jit.run(name, dt, LANES[dt][-1], *(np.array([x], NP[dt]) for x in xs))

    inf, nan = np.inf, np.nan
    assert f("exp", -inf)[0] == 0 and f("exp", inf)[0] == inf and np.isnan(f("exp", nan)[0])
    assert f("exp", 1000.0)[0] == inf and f("exp", -1000.0)[0] == 0
    assert f("log", 0.0)[0] == -inf and f("log", -0.0)[0] == -inf and f("log", inf)[0] == inf
    assert np.isnan(f("log", -1.0)[0]) and np.isnan(f("log", -inf)[0])
    assert f("tanh", inf)[0] == 1 and f("tanh", -inf)[0] == -1
    assert f("erf", inf)[0] == 1 and f("erf", -inf)[0] == -1
    assert f("sigmoid", 1e4)[0] == 1 and f("sigmoid", -1e4)[0] == 0
    assert f("sigmoid", inf)[0] == 1 and f("sigmoid", -inf)[0] == 0
    assert np.isnan(f("sin", inf)[0]) and np.isnan(f("cos", -inf)[0])
    assert f("power", 0.0, 2.0)[0] == 0 and f("power", 0.0, 0.0)[0] == 1
    assert f("power", 0.0, -1.0)[0] == inf and f("power", -2.0, 3.0)[0] == -8
    for name in ("tanh", "erf", "sin", "expm1", "log1p", "sqrt", "trunc", "round", "tan", "asin",
                 "atan"):
        z = f(name, -0.0)[0]
        assert z == 0 and np.signbit(z), f"{name}(-0) lost its sign"


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_trig_huge_is_bounded(jit: Jit, dt: str) -> None:
    x = np.array([2.0**30, -3e9, 1e30, -1e38, 3.4e38], NP[dt])
    for name in ("sin", "cos"):
        y = jit.run(name, dt, LANES[dt][-1], x)
        assert np.all(np.abs(y) <= 1.0), (name, y)


def test_exp_is_vector_code() -> None:
    """<16 x float> exp must stay vector code: no scalar libm/llvm.exp calls at all."""
    module = ir.Module(name="exp16")
    _kernel(module, "exp", "f32", 16)
    mod, _ = _optimized(module)
    text = str(mod)
    assert not re.search(r"@(expf|exp|llvm\.exp\.)", text), text
    callees = re.findall(r"call [^@]*@([\w.]+)\(", text)
    assert callees and all(".v16f32" in c for c in callees), callees
    assert "<16 x float>" in text


def test_errors() -> None:
    b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
                     .append_basic_block())
    one = ir.Constant(ir.FloatType(), 1.0)
    with pytest.raises(ValueError):
        emit_math(b, "gamma", [one])
    with pytest.raises(ValueError):
        emit_math(b, "power", [one])
    with pytest.raises(TypeError):
        emit_math(b, "exp", [ir.Constant(ir.IntType(32), 1)])


F32S = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=60, deadline=None)
@given(xs=st.lists(F32S, min_size=1, max_size=40), which=st.sampled_from(["exp", "log", "tanh"]))
def test_random_f32(jit: Jit, xs: list[float], which: str) -> None:
    typed, ref = reference(which, "f32", [np.array(xs)])
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    check(jit.run(which, "f32", 16, *typed), ref, "f32", 2e-6, 2 * tiny)
