"""tan, asin, acos, atan, atan2 (and float64 exp10, hypot, sinh, cosh, asinh, acosh, atanh)
as vector code (tecomp.codegen.vecmath_trig).

Each function is built as a real te kernel, vectorized 8 wide for float32 and 4 wide for
float64 over a length that leaves a tail, and compared in ulps with numpy evaluated in a
wider type (float64 for float32, long double for float64) and rounded once: dense random
samples over the whole exponent range plus the edge values (NaN, +-inf, +-0, subnormals,
the largest finite values, the interval boundaries of the kernels).  NaN positions and the
sign of zeros and infinities must agree exactly.  The generated code must not call the
per-lane libm functions (the point of the vector kernels), and scalar kernels give the same
bits as vector ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.vecmath_trig import TAN_ACCURATE_BELOW

UNARY = ("tan", "asin", "acos", "atan", "exp10", "sinh", "cosh", "asinh", "acosh", "atanh")
BINARY = ("atan2", "hypot")
NAMES = (*UNARY, *BINARY)
NP: dict[str, Callable[..., Any]] = {"tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
                                     "atan": np.arctan, "atan2": np.arctan2, "hypot": np.hypot,
                                     "exp10": lambda x: np.power(x.dtype.type(10), x),
                                     "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
                                     "acosh": np.arccosh, "atanh": np.arctanh,
                                     "sin": np.sin, "cos": np.cos}
WIDTH = {"float32": 8, "float64": 4}
ULPS = {"float32": 2, "float64": 4}
N = (1 << 15) + 3  # not a multiple of the vector width: the tail is exercised too


def _build(name: str, dtype: str, n: int, width: int) -> Any:
    """``C[i] = name(A[i] [, B[i]])``, split by ``width`` and vectorized (width 1: scalar)."""
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    f = getattr(te, name)
    binary = name in BINARY
    C = te.compute((n,), (lambda i: f(A[i], B[i])) if binary else (lambda i: f(A[i])), name="C")
    s = te.create_schedule(C.op)
    if width > 1:
        _, vi = s[C].split(C.op.axis[0], factor=width)
        s[C].vectorize(vi)
    return tc.build(s, [A, B, C] if binary else [A, C], target="llvm", name=f"k_{name}")


def _run(name: str, dtype: str, args: list[np.ndarray], width: int | None = None) -> np.ndarray:
    n = args[0].size
    f = _build(name, dtype, n, WIDTH[dtype] if width is None else width)
    out = np.zeros(n, dtype)
    f(*args, out)
    return out


def _reference(name: str, dtype: str, args: list[np.ndarray]) -> np.ndarray:
    wide = np.float64 if dtype == "float32" else np.longdouble
    with np.errstate(all="ignore"):
        return np.asarray(NP[name](*(a.astype(wide) for a in args))).astype(dtype)


def _ulp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place, via the ordered integer representation (+0 and
    -0 coincide).  The integers are split in 32-bit halves so that no float64 conversion
    rounds them: the distance is exact whenever it is below 2^53."""
    it = np.int32 if a.dtype == np.float32 else np.int64
    top = np.iinfo(it).min

    def ordered(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = v.view(it)
        i = np.where(i < 0, top - i, i).astype(np.int64)
        return (i >> 32).astype(np.float64), (i & 0xFFFFFFFF).astype(np.float64)

    (ah, al), (bh, bl) = ordered(a), ordered(b)
    return np.abs((ah - bh) * 2.0**32 + (al - bl))


def assert_ulps(got: np.ndarray, want: np.ndarray, ulps: int, what: str) -> None:
    nan = np.isnan(want)
    where = np.nonzero(np.isnan(got) != nan)
    assert (np.isnan(got) == nan).all(), f"{what}: NaN mismatch at {where}"
    special = ~nan & ((want == 0) | np.isinf(want))
    bad = special & ((got != want) | (np.signbit(got) != np.signbit(want)))
    assert not bad.any(), f"{what}: got {got[bad][:5]} want {want[bad][:5]} (zeros/infinities)"
    d = _ulp_diff(got[~nan], want[~nan])
    worst = int(d.argmax()) if d.size else 0
    assert d.max(initial=0) <= ulps, (
        f"{what}: {d.max()} ulp at {got[~nan][worst]!r}, want {want[~nan][worst]!r}")


def _edges(dtype: str) -> np.ndarray:
    fi = np.finfo(dtype)
    tiny = float(fi.smallest_subnormal)
    t3p8 = 1 + math.sqrt(2.0)
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny, 1000 * tiny, float(fi.tiny),
            -float(fi.tiny), float(fi.max), -float(fi.max), 1.0, -1.0, 0.5, -0.5, 0.625, -0.625,
            0.66, -0.66, t3p8, -t3p8, math.sqrt(2) - 1, 1 - float(fi.epsneg), -1 + float(fi.epsneg),
            1 + float(fi.eps), -1 - float(fi.eps), 1.5, -1.5, math.pi / 2, -math.pi / 2,
            math.pi / 4, 3 * math.pi / 4, math.pi, 1e-7, 1e-20, 10.0, 1e4, 1e10, -1e10,
            TAN_ACCURATE_BELOW, -TAN_ACCURATE_BELOW, TAN_ACCURATE_BELOW * (1 - 1e-7), 1e15, 1e30]
    with np.errstate(over="ignore"):
        e = np.array(vals, dtype)
    # every edge value next to its neighbours (nextafter both ways)
    with np.errstate(all="ignore"):
        return np.concatenate([e, np.nextafter(e, np.inf), np.nextafter(e, -np.inf)])


def _samples(name: str, dtype: str, n: int, seed: int) -> np.ndarray:
    """Dense random values: the natural domain, plus magnitudes spread over all exponents."""
    rng = np.random.default_rng(seed)
    lo, hi = (-149, 127) if dtype == "float32" else (-1074, 1023)
    q = n // 4
    spread = np.ldexp(rng.uniform(1, 2, n - 3 * q), rng.integers(lo, hi, n - 3 * q))
    spread *= rng.choice([-1.0, 1.0], spread.size)
    if name in ("asin", "acos", "atanh"):
        near = rng.uniform(-1, 1, 2 * q)
        ends = np.sign(rng.uniform(-1, 1, q)) * (1 - np.ldexp(1.0, -rng.integers(1, 53, q)))
        parts = [near, ends]
    elif name == "tan":
        parts = [rng.uniform(-10, 10, 2 * q), rng.uniform(-1e6, 1e6, q)]
    elif name in ("sinh", "cosh"):
        top = 90 if dtype == "float32" else 711
        parts = [rng.uniform(-3, 3, 2 * q), rng.uniform(-top, top, q)]
    elif name == "acosh":
        parts = [1 + np.abs(rng.standard_normal(2 * q)), 1 + np.ldexp(1.0, -rng.integers(1, 53, q))]
    elif name == "exp10":
        top = 39 if dtype == "float32" else 309
        parts = [rng.uniform(-top - 8, top, 2 * q), rng.uniform(-2, 2, q)]
    else:
        parts = [rng.uniform(-10, 10, 2 * q), rng.standard_normal(q) * 1e3]
    with np.errstate(over="ignore"):
        return np.concatenate([*parts, spread]).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", UNARY)
def test_unary_random_and_edges(name: str, dtype: str) -> None:
    x = np.concatenate([_edges(dtype), _samples(name, dtype, N, seed=len(name))])
    x = x[:N]  # keep the odd length: a vector tail
    got = _run(name, dtype, [x])
    assert_ulps(got, _reference(name, dtype, [x]), ULPS[dtype], f"{name} {dtype}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", BINARY)
def test_binary_random_and_edges(name: str, dtype: str) -> None:
    e = _edges(dtype)
    ey, ex = (g.ravel() for g in np.meshgrid(e, e))  # every pair of edge values
    rng = np.random.default_rng(7)
    y = np.concatenate([ey, _samples(name, dtype, N, 1)])
    x = np.concatenate([ex, _samples(name, dtype, N, 2)[rng.permutation(N)]])
    got = _run(name, dtype, [y, x])
    assert_ulps(got, _reference(name, dtype, [y, x]), ULPS[dtype], f"{name} {dtype}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ieee_special_cases(dtype: str) -> None:
    inf, nan, pi = np.inf, np.nan, math.pi
    tiny = float(np.finfo(dtype).smallest_subnormal)

    def one(name: str, *xs: float) -> float:
        args = [np.full(WIDTH[dtype] + 1, v, dtype) for v in xs]  # a full vector and a tail
        out = _run(name, dtype, args)
        assert out[0] == out[-1] or (np.isnan(out[0]) and np.isnan(out[-1]))
        return float(out[0])

    def same(got: float, want: float) -> bool:
        if math.isnan(want):
            return math.isnan(got)
        rounded = float(np.asarray(want, dtype))
        return got == rounded and math.copysign(1, got) == math.copysign(1, want)

    cases = [
        ("atan", (-0.0,), -0.0), ("atan", (0.0,), 0.0), ("atan", (inf,), pi / 2),
        ("atan", (-inf,), -pi / 2), ("atan", (nan,), nan), ("atan", (-tiny,), -tiny),
        ("asin", (-0.0,), -0.0), ("asin", (1.0,), pi / 2), ("asin", (-1.0,), -pi / 2),
        ("asin", (1.5,), nan), ("asin", (-inf,), nan), ("asin", (nan,), nan),
        ("asin", (tiny,), tiny),
        ("acos", (1.0,), 0.0), ("acos", (-1.0,), pi), ("acos", (0.0,), pi / 2),
        ("acos", (-0.0,), pi / 2), ("acos", (-1.5,), nan), ("acos", (inf,), nan),
        ("tan", (-0.0,), -0.0), ("tan", (0.0,), 0.0), ("tan", (inf,), nan), ("tan", (-inf,), nan),
        ("tan", (nan,), nan), ("tan", (-tiny,), -tiny),
        ("atan2", (0.0, 0.0), 0.0), ("atan2", (-0.0, 0.0), -0.0), ("atan2", (0.0, -0.0), pi),
        ("atan2", (-0.0, -0.0), -pi), ("atan2", (0.0, -1.0), pi), ("atan2", (-0.0, -1.0), -pi),
        ("atan2", (0.0, 1.0), 0.0), ("atan2", (-0.0, 1.0), -0.0), ("atan2", (1.0, 0.0), pi / 2),
        ("atan2", (-1.0, -0.0), -pi / 2), ("atan2", (1.0, -inf), pi), ("atan2", (-1.0, -inf), -pi),
        ("atan2", (1.0, inf), 0.0), ("atan2", (-1.0, inf), -0.0), ("atan2", (inf, 5.0), pi / 2),
        ("atan2", (-inf, -5.0), -pi / 2), ("atan2", (inf, inf), pi / 4),
        ("atan2", (-inf, inf), -pi / 4), ("atan2", (inf, -inf), 3 * pi / 4),
        ("atan2", (-inf, -inf), -3 * pi / 4), ("atan2", (nan, 1.0), nan),
        ("atan2", (1.0, nan), nan),
        ("atan2", (inf, nan), nan), ("atan2", (tiny, 1.0), tiny), ("atan2", (tiny, tiny), pi / 4),
        ("exp10", (-inf,), 0.0), ("exp10", (inf,), inf), ("exp10", (nan,), nan),
        ("exp10", (0.0,), 1.0), ("exp10", (-0.0,), 1.0), ("exp10", (1e4,), inf),
        ("exp10", (-1e4,), 0.0),
        ("hypot", (inf, nan), inf), ("hypot", (nan, -inf), inf), ("hypot", (nan, 1.0), nan),
        ("hypot", (-0.0, -0.0), 0.0), ("hypot", (3.0, -4.0), 5.0), ("hypot", (-tiny, 0.0), tiny),
        ("sinh", (-0.0,), -0.0), ("sinh", (-inf,), -inf), ("sinh", (nan,), nan),
        ("sinh", (-tiny,), -tiny), ("cosh", (-0.0,), 1.0), ("cosh", (-inf,), inf),
        ("cosh", (nan,), nan), ("asinh", (-0.0,), -0.0), ("asinh", (-inf,), -inf),
        ("asinh", (tiny,), tiny), ("acosh", (1.0,), 0.0), ("acosh", (inf,), inf),
        ("acosh", (0.5,), nan), ("acosh", (-inf,), nan), ("atanh", (-0.0,), -0.0),
        ("atanh", (1.0,), inf), ("atanh", (-1.0,), -inf), ("atanh", (1.5,), nan),
        ("atanh", (-tiny,), -tiny),
    ]
    bad = [(n, a, one(n, *a), w) for n, a, w in cases if not same(one(n, *a), w)]
    assert not bad, bad


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tan_large_arguments(dtype: str) -> None:
    """From 2^30 up the lanes are recomputed by libm (exact reduction): numpy's accuracy,
    also when only some lanes of a vector are large."""
    rng = np.random.default_rng(3)
    big = np.ldexp(rng.uniform(1, 2, 4000), rng.integers(30, 127 if dtype == "float32" else 1023,
                                                             4000))
    mixed = np.where(rng.uniform(size=4000) < 0.3, big, rng.uniform(-3, 3, 4000))
    x = np.concatenate([big, -big, mixed]).astype(dtype)
    assert_ulps(_run("tan", dtype, [x]), _reference("tan", dtype, [x]), ULPS[dtype],
                f"tan {dtype} large")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_near_their_zeros_and_beyond_2_30(name: str, dtype: str) -> None:
    """sin and cos share tan's five-part reduction and libm lanes (vecmath._sincos): next to
    k pi/2, where the three-part split once left float64 sin(k pi) thousands of ulp off, and
    for huge arguments (libm's exact reduction), also in vectors where only some lanes are."""
    rng = np.random.default_rng(5)
    k = np.concatenate([np.arange(1, 400), rng.integers(1, int(TAN_ACCURATE_BELOW / 1.58), 3000)])
    pi_ld = np.longdouble("3.14159265358979323846264338327950288")
    near = (k.astype(np.longdouble) * pi_ld / 2).astype(dtype)
    big = np.ldexp(rng.uniform(1, 2, 2000), rng.integers(30, 127 if dtype == "float32" else 1023, 2000))
    mixed = np.where(rng.uniform(size=2000) < 0.3, big, rng.uniform(-3, 3, 2000))
    with np.errstate(all="ignore"):
        x = np.concatenate([near, np.nextafter(near, np.inf), big.astype(dtype), mixed.astype(dtype)])
    x = np.concatenate([x, -x, np.array([0.0, -0.0], dtype)])
    got = _run(name, dtype, [x])
    assert_ulps(got, _reference(name, dtype, [x]), ULPS[dtype], f"{name} {dtype} near k pi/2 / huge")
    if name == "sin":
        assert np.signbit(got[-1]) and not np.signbit(got[-2])  # sin(-0) = -0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tan_near_zeros_and_poles(dtype: str) -> None:
    """x next to k pi/2 (below 2^30): the reduced argument is tiny, so the reduction must
    be exact to full relative precision (tan(fl(pi/2)) ~ 1.6e16 included)."""
    rng = np.random.default_rng(11)
    k = np.concatenate([np.arange(1, 200), rng.integers(1, int(TAN_ACCURATE_BELOW / 1.58), 3000)])
    pi_ld = np.longdouble("3.14159265358979323846264338327950288")  # 64-bit pi on x86
    near = (k.astype(np.longdouble) * pi_ld / 2).astype(dtype)
    with np.errstate(all="ignore"):
        x = np.concatenate([near, np.nextafter(near, np.inf), np.nextafter(near, -np.inf)])
    x = np.concatenate([x, -x])
    assert_ulps(_run("tan", dtype, [x]), _reference("tan", dtype, [x]), ULPS[dtype],
                f"tan {dtype} near k pi/2")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_scalar_and_vector_agree(name: str, dtype: str) -> None:
    """Scalar code uses the same kernels (no libm/vector discrepancy between loops)."""
    rng = np.random.default_rng(5)
    args = [np.concatenate([_edges(dtype), rng.uniform(-4, 4, 1001).astype(dtype)])
            for _ in range(2 if name in BINARY else 1)]
    v = _run(name, dtype, args)
    s = _run(name, dtype, args, width=1)
    np.testing.assert_array_equal(v.view(f"u{v.itemsize}"), s.view(f"u{s.itemsize}"))




@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_no_per_lane_libm_calls(name: str, dtype: str) -> None:
    """The vector kernel is vector code: no llvm.<fn>.v* intrinsic (which LLVM scalarizes
    into one libm call per lane) and no libm call at all, except tan's guarded branch for
    arguments >= 2^30."""
    m = _build(name, dtype, 1003, WIDTH[dtype])
    ir_text, asm = m.get_source("ll"), m.get_source("asm")
    assert not re.search(rf"@llvm\.{name}\.v\d+f(32|64)", ir_text), ir_text
    assert f"<{WIDTH[dtype]} x double>" in ir_text  # float32 is evaluated in float64 vectors
    if name != "tan":
        libm = re.search(rf"\b{name}f?(@PLT)?\b", asm)
        assert not libm, libm
        return
    assert "tanf" not in asm
    # tan's only libm calls sit in the block that runs when some lane is >= 2^30
    unopt = m.get_source("ll-unopt")
    block = ""
    for line in unopt.splitlines():
        if re.match(r'^"?[\w.]+"?:', line):
            block = line
        elif "call" in line and "@llvm.tan." in line:
            assert "tan.libm_lanes" in block, (block, line)
