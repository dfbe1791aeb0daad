"""TVM's division family: floordiv, floormod, truncdiv, truncmod, indexdiv, indexmod, div and
ceildiv, in `te`, at the top level (`tc`) and as `tc.tir` spellings.

Every sign combination of both operands is checked against numpy/Python on integer and float
dtypes, with a tensor divisor and with constant divisors (positive, negative, powers of two:
each is a different codegen path), JIT-compiled scalar and vectorized, and in the interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.arith.evaluate import evaluate
from tecomp.arith.simplify import simplify
from tecomp.errors import CodegenError, TecompError
from tecomp.ir.expr import Div, Expr, FloorDiv, IntImm, Var
from tecomp.runtime import interp

N = 64
INT_DTYPES = ("int8", "int32", "int64", "uint8", "uint32")

# numpy references (int64 / float64 arithmetic, then the dtype)


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a - np.fmod(a, b)) // b  # exact: a - fmod(a, b) is a multiple of b


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -np.floor_divide(-a, b)


INT_REF: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "floordiv": np.floor_divide, "floormod": np.remainder, "indexdiv": np.floor_divide,
    "indexmod": np.remainder, "truncdiv": _trunc_div, "truncmod": np.fmod, "div": _trunc_div,
    "ceildiv": _ceil_div,
}


def _operands(dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every sign pair, zero dividends, exact and inexact quotients; no zero divisor and no
    value where ``a + b - 1`` (ceildiv) or ``INT_MIN / -1`` would wrap."""
    info = np.iinfo(dtype)
    lo, hi = max(int(info.min) // 2, -10**6), min(int(info.max) // 2, 10**6)
    rng = np.random.default_rng(seed)
    a = rng.integers(lo, hi, N, dtype=np.int64, endpoint=True)
    b = rng.integers(max(lo, -100), min(hi, 100), N, dtype=np.int64, endpoint=True)
    small = np.array([7, -7, 7, -7, 0, 0, 6, -6, 1, -1, 9, -9], np.int64)
    sdiv = np.array([2, 2, -2, -2, 3, -3, 3, 3, 5, 5, -9, -9], np.int64)
    a[: small.size], b[: sdiv.size] = small, sdiv
    if info.min == 0:
        a, b = np.abs(a), np.abs(b)
    b[b == 0] = 1
    return a.astype(dtype), b.astype(dtype)


def _schedules(C: te.Tensor, lanes: int) -> te.Schedule:
    s = te.create_schedule(C.op)
    if lanes > 1:
        _, xi = s[C].split(C.op.axis[0], factor=lanes)
        s[C].vectorize(xi)
    return s


def _build_all(kernels: dict[str, tuple[te.Tensor, list[te.Tensor]]], lanes: int
               ) -> tuple[Any, dict[str, Any]]:
    """One module holding every kernel (one LLVM compile), and each kernel's lowered func."""
    triples = []
    lowered = {}
    for name, (C, args) in kernels.items():
        s = _schedules(C, lanes)
        # "k_": a kernel may not take a C library function's name ("ceil", "fmod")
        triples.append((s, args, f"k_{name}"))
        lowered[name] = tc.lower(s, args, name=f"k_{name}")
    return tc.build(triples), lowered


def _check_all(kernels: dict[str, tuple[te.Tensor, list[te.Tensor]]], ins: list[np.ndarray],
               want: dict[str, np.ndarray], lanes: int) -> None:
    mod, lowered = _build_all(kernels, lanes)
    for name, w in want.items():
        out = np.zeros(w.shape, w.dtype)
        mod[f"k_{name}"](*ins, out)
        np.testing.assert_array_equal(out, w, err_msg=f"{name} lanes={lanes}")
        if lanes > 1 and len(want) > 8:
            continue  # the interpreter's vector path is covered by the tensor-divisor test
        ref = np.zeros(w.shape, w.dtype)
        interp.run(lowered[name], *ins, ref)
        np.testing.assert_array_equal(ref, w, err_msg=f"{name} (interpreter)")


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("lanes", [1, 8])
def test_integer_division_family_with_a_tensor_divisor(dtype: str, lanes: int) -> None:
    a, b = _operands(dtype)
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    kernels, want = {}, {}
    for name, ref in INT_REF.items():
        fn = getattr(te, name)
        C = te.compute((N,), (lambda f: lambda i: f(A[i], B[i]))(fn), name="C")
        kernels[name] = (C, [A, B, C])
        want[name] = ref(a.astype(np.int64), b.astype(np.int64)).astype(dtype)
    _check_all(kernels, [a, b], want, lanes)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32"])
def test_integer_division_family_with_constant_divisors(dtype: str) -> None:
    a, _ = _operands(dtype, seed=3)
    A = te.placeholder((N,), dtype, name="A")
    kernels, want = {}, {}
    for c in (3, 8, -1, -8):
        if c < 0 and dtype.startswith("u"):
            continue
        for name, ref in INT_REF.items():
            fn = getattr(te, name)
            C = te.compute((N,), (lambda f, c=c: lambda i: f(A[i], c))(fn), name="C")
            key = f"{name}_{'m' if c < 0 else ''}{abs(c)}"
            kernels[key] = (C, [A, C])
            want[key] = ref(a.astype(np.int64), np.int64(c)).astype(dtype)
    for lanes in (1, 8):
        _check_all(kernels, [a], want, lanes)


FLOAT_EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 7.0, -7.0, 2.5, -2.5, 1e30]


def _float_operands(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    edges = np.array(FLOAT_EDGES, dtype)
    a = np.repeat(edges, edges.size)
    b = np.tile(edges, edges.size)
    rng = np.random.default_rng(1)
    pad = (-a.size) % N + N
    a = np.concatenate([a, (rng.standard_normal(pad) * 50).astype(dtype)])
    b = np.concatenate([b, (rng.standard_normal(pad) * 5).astype(dtype)])
    return a, b


def _same_floats(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=what)
    np.testing.assert_allclose(got[~nan], want[~nan], rtol=rtol, atol=0, err_msg=what)
    exact = ~nan & ((want == 0) | np.isinf(want))  # zeros and infinities keep their sign
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(want[exact]), err_msg=what)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lanes", [1, 4])
def test_float_division_family(dtype: str, lanes: int) -> None:
    """div is true division, floordiv floor(a / b), floormod a - floor(a / b) * b (TVM's
    lowering; FMA contraction may round the product once less) and truncmod C's fmod."""
    a, b = _float_operands(dtype)
    n = a.size
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    with np.errstate(all="ignore"):
        refs: dict[str, np.ndarray] = {
            "div": a / b, "floordiv": np.floor(a / b), "truncmod": np.fmod(a, b),
            "floormod": a - np.floor(a / b) * b,
        }
    kernels = {}
    for name in refs:
        fn = getattr(te, name)
        C = te.compute((n,), (lambda f: lambda i: f(A[i], B[i]))(fn), name="C")
        kernels[name] = (C, [A, B, C])
    mod, lowered = _build_all(kernels, lanes)
    for name, want in refs.items():
        out = np.zeros(n, dtype)
        mod[f"k_{name}"](a, b, out)
        ref = np.zeros(n, dtype)
        interp.run(lowered[name], a, b, ref)
        if name == "floormod":
            # a - q*b cancels: FMA contraction (allowed) may change the result by an ulp of a
            ok = np.isfinite(want)
            for got in (out, ref):
                assert (np.abs(got[ok] - want[ok]) <= 2 * np.spacing(np.abs(a[ok]))).all()
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            continue
        _same_floats(out, want, 0, f"{name} {dtype} lanes={lanes}")
        _same_floats(ref, want, 0, f"{name} {dtype} (interpreter)")


def _exact(e: Expr) -> int:
    assert isinstance(e, IntImm), f"{e} was not folded to a constant"
    return e.value


@settings(max_examples=120, deadline=None, derandomize=True)
@given(a=st.integers(-2**31 + 2**10, 2**31 - 2**10), b=st.integers(-1000, 1000).filter(bool))
def test_constant_operands_fold_to_python_semantics(a: int, b: int) -> None:
    assert _exact(te.floordiv(a, b)) == a // b == _exact(tc.indexdiv(a, b))
    assert _exact(te.floormod(a, b)) == a % b == _exact(tc.indexmod(a, b))
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    assert _exact(te.truncdiv(a, b)) == q == _exact(tc.div(a, b))
    assert _exact(te.truncmod(a, b)) == a - q * b == int(math.fmod(a, b))
    assert _exact(te.ceildiv(a, b)) == -(-a // b)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(c=st.integers(-12, 12).filter(bool), k=st.integers(-5, 5), x=st.integers(-60, 60),
       op=st.sampled_from(["truncdiv", "truncmod", "ceildiv", "floordiv", "floormod"]))
def test_simplifier_keeps_each_rounding(c: int, k: int, x: int, op: str) -> None:
    """The simplifier knows Div as truncating: floor rules must not leak into trunc ops."""
    v = Var("v")
    e = getattr(te, op)(v * c + k, c)
    want = evaluate(e, {v: x})
    got = evaluate(simplify(e), {v: x})
    assert got == want, f"{e} -> {simplify(e)} at v={x}"


def test_index_expressions_with_trunc_and_ceil_lower_and_run() -> None:
    """Bound inference through truncmod / ceildiv indices and a ceildiv shape."""
    n = 10
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((tc.ceildiv(n, 4),), lambda i: A[i * 4], name="B")
    assert isinstance(B.shape[0], IntImm) and B.shape[0].value == 3
    C = te.compute((n,), lambda i: A[te.truncmod(i, 4)] + A[te.truncdiv(i, 4)], name="C")
    a = np.arange(n, dtype="float32")
    for T, want in ((B, a[::4]), (C, a[np.arange(n) % 4] + a[np.arange(n) // 4])):
        s = te.create_schedule(T.op)
        out = np.zeros(T.shape[0].value, "float32")
        tc.build(s, [A, T])(a, out)
        np.testing.assert_array_equal(out, want)


def test_symbolic_ceildiv_and_truncmod_forms() -> None:
    n = te.var("n")
    assert str(te.ceildiv(n, 4)) == "(n + 3) // 4"  # TVM's form for a positive divisor
    assert str(te.ceildiv(n, -4)) == "(n + -3) // -4"
    assert isinstance(te.truncdiv(n, 3), Div)
    assert isinstance(te.floordiv(n, 3), FloorDiv)
    assert "fmod" in str(te.truncmod(te.var("x", "float32"), 2.0))
    assert te.indexdiv is te.floordiv and tc.indexmod is te.floormod
    for name in ("floordiv", "floormod", "truncdiv", "truncmod", "indexdiv", "indexmod", "div",
                 "ceildiv"):
        assert getattr(tc, name) is getattr(te, name) is getattr(tc.tir, name)


def test_variable_divisor_ceildiv_every_sign() -> None:
    a, b = _operands("int32", seed=5)
    b[::3] *= -1
    A = te.placeholder((N,), "int32", name="A")
    B = te.placeholder((N,), "int32", name="B")
    C = te.compute((N,), lambda i: te.ceildiv(A[i], B[i]), name="C")
    want = _ceil_div(a.astype(np.int64), b.astype(np.int64)).astype("int32")
    _check_all({"ceil": (C, [A, B, C])}, [a, b], {"ceil": want}, 1)


@pytest.mark.parametrize("name", ["truncdiv", "truncmod", "ceildiv", "floordiv"])
def test_zero_divisor_is_an_error_never_a_crash(name: str) -> None:
    A = te.placeholder((4,), "int32", name="A")
    B = te.placeholder((4,), "int32", name="B")
    fn = getattr(te, name)
    C = te.compute((4,), lambda i: fn(A[i], B[i]), name="C")
    for lanes in (1, 4):
        s = _schedules(C, lanes)
        f = tc.build(s, [A, B, C])
        a, b = np.arange(4, dtype="int32"), np.array([1, 0, 2, 3], "int32")
        with pytest.raises(ZeroDivisionError):
            f(a, b, np.zeros(4, "int32"))
        with pytest.raises(ZeroDivisionError):
            interp.run(tc.lower(s, [A, B, C]), a, b, np.zeros(4, "int32"))
    # a constant zero divisor is refused when the expression is built, as TVM does
    with pytest.raises(TecompError, match=f"{name}.*division by the constant 0"):
        fn(A[0], 0)
    # built behind the helpers' back (x // 0), codegen still refuses it
    D = te.compute((4,), lambda i: A[i] // 0, name="D")
    with pytest.raises(CodegenError, match="division by zero"):
        tc.build(te.create_schedule(D.op), [A, D])


@pytest.mark.parametrize("name", ["truncdiv", "ceildiv"])
def test_integer_only_members_refuse_floats(name: str) -> None:
    x = te.var("x", "float32")
    with pytest.raises(TypeError, match=f"{name} is integer division.*float32"):
        getattr(te, name)(x, 2.0)


def test_bool_operands_are_refused() -> None:
    c = te.var("i") > 0
    for name in ("floordiv", "floormod", "div"):
        with pytest.raises(TecompError, match="bool"):
            getattr(te, name)(c, c)


# ``/`` on expressions: TVM's PrimExpr.__truediv__ ------------------------------------------------

def _int_operand_pairs() -> list[tuple[str, Callable[[], Any]]]:
    i, j = te.var("i"), te.var("j", "int64")
    A = te.placeholder((4,), "int32", name="A")
    k = te.reduce_axis((0, 4), name="k")
    return [
        ("var / var", lambda: i / j), ("var / int", lambda: i / 2), ("int / var", lambda: 7 / i),
        ("load / load", lambda: A[0] / A[1]), ("load / numpy int", lambda: A[0] / np.int64(3)),
        ("numpy int / var", lambda: np.int32(3) / i), ("itervar / int", lambda: k / 2),
        ("int8 / int8", lambda: i.astype("int8") / i.astype("int8")),
        ("vector / int", lambda: te.var("v", "int32x4") / 2),
        ("bool-valued int / var", lambda: True / i),  # a Python bool is an int, as in TVM
    ]


@pytest.mark.parametrize("what", [w for w, _ in _int_operand_pairs()])
def test_true_division_of_two_integers_raises_like_tvm(what: str) -> None:
    build = dict(_int_operand_pairs())[what]
    with pytest.raises(RuntimeError, match=r"^TVM supports multiple types of integer divisions, "
                                           r"please call div, indexdiv/indexmod, floordiv/floormod "
                                           r"or truncdiv/truncmod directly to avoid ambiguity in "
                                           r"the code\. Both operands of .* are integers"):
        build()
    with pytest.raises(TecompError, match="te.truncdiv rounds toward zero"):
        build()  # a TecompError too, which names the remedies


def test_true_division_with_a_float_operand_divides_in_float() -> None:
    i = te.var("i")
    x = te.var("x", "float32")
    for e, dtype in [(i / 2.0, "float32"), (2.0 / i, "float32"), (x / i, "float32"),
                     (i / x, "float32"), (i.astype("float64") / 4, "float64"),
                     (x / np.int32(2), "float32")]:
        assert isinstance(e, Div) and e.dtype == dtype, e
    assert evaluate(i / 2.0, {i: -7}) == -3.5
    assert evaluate(3 / x, {x: np.float32(-2.0)}) == -1.5
    # unsigned: truncating and flooring agree, so TVM (and tecomp) still divide
    u = te.var("u", "uint32")
    assert isinstance(u / 2, Div) and u.dtype == "uint32" and evaluate(u / 2, {u: 7}) == 3
    # // stays floor division on integers, as TVM defines it
    assert isinstance(i // 2, FloorDiv) and evaluate(i // 2, {i: -7}) == -4


def test_true_division_of_float_tensors_and_rejected_int_compute() -> None:
    A = te.placeholder((N,), "float32", name="A")
    B = te.compute((N,), lambda i: A[i] / (i + 1).astype("float32") + A[i] / 4, name="B")
    f = tc.build(te.create_schedule(B.op), [A, B])
    a = np.random.default_rng(0).standard_normal(N).astype("float32")
    b = np.zeros_like(a)
    f(a, b)
    idx = np.arange(1, N + 1, dtype="float32")
    np.testing.assert_allclose(b, a / idx + a / np.float32(4), rtol=1e-6)
    C = te.placeholder((N,), "int32", name="C")
    with pytest.raises(RuntimeError, match="truncdiv/truncmod"):
        te.compute((N,), lambda i: C[i] / 2, name="D")
    # the explicit spellings of what '/' used to do, built and checked against numpy
    D = te.compute((N,), lambda i: te.truncdiv(C[i], 3) + te.floordiv(C[i], 3) * 100, name="D")
    g = tc.build(te.create_schedule(D.op), [C, D])
    c = np.arange(-N // 2, N // 2, dtype="int32")
    d = np.zeros_like(c)
    g(c, d)
    np.testing.assert_array_equal(d, np.trunc(c / 3).astype("int32") + (c // 3) * 100)


def test_reflected_operators_on_iter_vars() -> None:
    # an IterVar (not its Var) on the right of //, % and /: what TVM users write with
    # s[C].op.axis; / of two ints raises TVM's ambiguity error, as on the left
    from tecomp.ir.expr import DivisionAmbiguityError

    A = te.placeholder((8,), "float32", name="A")
    C = te.compute((8,), lambda i: A[i], name="C")
    iv = C.op.axis[0]
    assert str(17 // iv) == str(17 // iv.var) and str(17 % iv) == str(17 % iv.var)
    with pytest.raises(DivisionAmbiguityError):
        _ = 2 / iv
    assert (2.0 / iv).dtype == "float32"
