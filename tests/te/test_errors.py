"""Every way to misuse tecomp gets a clear exception naming what is wrong, never a crash.

Schedules that cannot be honoured raise ScheduleError naming the stage and the axis; bad
declarations raise TecompError naming the compute and the axis; bad kernel arguments raise
TypeError/ValueError naming the argument and what was expected; ``debug=True`` builds raise
IndexError naming the buffer and the index. Also here: the user-facing surface around calls
(DLPack inputs, time_evaluator, tc.lower printing, target strings).
"""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp

RNG = np.random.default_rng(7)


def rand(shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def row_sum(n=16, k=8):
    A = te.placeholder((n, k), name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((n,), lambda i: te.sum(A[i, r], axis=r), name="B")
    return A, r, B


def chain(n=16):
    X = te.placeholder((n,), name="X")
    P = te.compute((n,), lambda i: X[i] + 1.0, name="P")
    Q = te.compute((n,), lambda i: X[i] * 2.0, name="Q")
    R = te.compute((n,), lambda i: P[i] + Q[i], name="R")
    return X, P, Q, R


def ew2d(n=16, m=8):
    A = te.placeholder((n, m), name="A")
    C = te.compute((n, m), lambda i, j: A[i, j] * 2.0, name="C")
    return A, C


# ScheduleError: the schedule cannot be honoured ---------------------------------------------


@pytest.mark.parametrize("prim", ["vectorize", "parallel"])
def test_annotate_reduction_axis(prim):
    A, r, B = row_sum()
    s = te.create_schedule(B.op)
    with pytest.raises(tc.ScheduleError, match=rf"stage B: cannot {prim} reduction axis 'r'"):
        getattr(s[B], prim)(r)
    ro, ri = s[B].split(r, factor=4)
    with pytest.raises(tc.ScheduleError, match=r"stage B.*'r\.inner'"):
        getattr(s[B], prim)(ri)


def test_compute_at_non_consumer():
    X, P, Q, R = chain()
    s = te.create_schedule(R.op)
    with pytest.raises(tc.ScheduleError, match=r"stage P.*Q does not consume P.*axis 'i'"):
        s[P].compute_at(s[Q], Q.op.axis[0])


def test_compute_at_reader_outside_the_loop():
    X = te.placeholder((16,), name="X")
    P = te.compute((16,), lambda i: X[i] + 1.0, name="P")
    Q = te.compute((16,), lambda i: P[i] * 2.0, name="Q")
    R = te.compute((16,), lambda i: P[i] + Q[i], name="R")
    s = te.create_schedule(R.op)
    s[P].compute_at(s[Q], Q.op.axis[0])  # R also reads P, outside Q's loop
    with pytest.raises(tc.ScheduleError, match=r"stage P is computed at Q \(axis 'i'\).*R"):
        tc.lower(s, [X, R])


def test_compute_at_bad_targets():
    X, P, Q, R = chain()
    A, C = ew2d()
    s = te.create_schedule(R.op)
    with pytest.raises(tc.ScheduleError, match=r"stage P: compute_at: expected a Stage"):
        s[P].compute_at(R, R.op.axis[0])
    with pytest.raises(tc.ScheduleError, match=r"stage R: compute_at of P: axis 'i' does not belong"):
        s[P].compute_at(s[R], C.op.axis[0])
    with pytest.raises(tc.ScheduleError, match=r"stage R: compute_at: a stage cannot be computed at itself"):
        s[R].compute_at(s[R], R.op.axis[0])


def test_reorder_across_fused_axis():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].fuse(i, j)
    with pytest.raises(tc.ScheduleError, match=r"stage C: reorder: axis 'j' has already been split or fused"):
        s[C].reorder(j, i)
    with pytest.raises(tc.ScheduleError, match=r"stage C: split: axis 'i' has already been"):
        s[C].split(i, factor=2)


def test_fuse_errors():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=4)
    with pytest.raises(tc.ScheduleError, match=r"stage C: fuse: axes must be adjacent.*j, i\.outer"):
        s[C].fuse(j, io)
    A2, r, B = row_sum()
    s2 = te.create_schedule(B.op)
    f = s2[B].fuse(B.op.axis[0], r)  # allowed, as in TVM (tests/te/test_fuse_reduce.py)
    with pytest.raises(tc.ScheduleError, match=r"stage B: cannot parallel reduction axis"):
        s2[B].parallel(f)


def test_reorder_same_axis_twice():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"stage C: reorder: an axis is listed twice"):
        s[C].reorder(C.op.axis[1], C.op.axis[1])


@pytest.mark.parametrize("kwargs,msg", [
    ({"factor": 2, "nparts": 2}, r"give exactly one of factor= or nparts="),
    ({}, r"give exactly one of factor= or nparts="),
    ({"factor": 0}, r"must be positive, got 0"),
    ({"nparts": -3}, r"must be positive, got -3"),
    ({"factor": 2.5}, r"must be an integer, got 2\.5"),
    ({"factor": "4"}, r"must be an integer, got '4'"),
])
def test_split_bad_factor(kwargs, msg):
    A, C = ew2d()
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"stage C: split of 'i': .*" + msg):
        s[C].split(C.op.axis[0], **kwargs)


def test_split_accepts_numpy_integer():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    s[C].split(C.op.axis[0], factor=np.int64(4))
    f = tc.build(s, [A, C])
    a = rand((16, 8))
    c = np.empty_like(a)
    f(a, c)
    np.testing.assert_allclose(c, a * 2)


def test_axis_of_another_stage():
    A, C = ew2d()
    X, P, Q, R = chain()
    s = te.create_schedule([C.op, R.op])
    with pytest.raises(tc.ScheduleError, match=r"stage R: vectorize: axis 'j' does not belong to this stage"):
        s[R].vectorize(C.op.axis[1])
    with pytest.raises(tc.ScheduleError, match=r"stage R: unroll: expected an IterVar of this stage, got 'i'"):
        s[R].unroll("i")


def test_vectorize_symbolic_extent():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(B.op.axis[0])
    with pytest.raises(tc.ScheduleError, match=r"stage B: cannot vectorize axis 'i' with non-constant extent n"):
        tc.lower(s, [A, B])


def test_compute_inline_errors():
    A, r, B = row_sum()
    C = te.compute((16,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"stage B: compute_inline: cannot inline a reduction"):
        s[B].compute_inline()
    with pytest.raises(tc.ScheduleError, match=r"stage C: compute_inline: cannot inline an output"):
        s[C].compute_inline()


def test_primitive_on_placeholder_or_foreign_tensor():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"stage A: split needs a compute stage"):
        s[A].split(C.op.axis[0], factor=2)
    with pytest.raises(tc.ScheduleError, match=r"Z is not part of this schedule"):
        s[te.placeholder((3,), name="Z")]


def test_storage_align_errors():
    A, C = ew2d()
    s = te.create_schedule(C.op)
    io, ii = s[C].split(C.op.axis[0], factor=4)
    with pytest.raises(tc.ScheduleError, match=r"stage C: storage_align: 'i\.outer' is not a root axis"):
        s[C].storage_align(io, 8, 0)
    with pytest.raises(tc.ScheduleError, match=r"stage C: storage_align: factor must be positive on 'j'"):
        s[C].storage_align(C.op.axis[1], 0, 0)


def test_rfactor_errors():
    A, r, B = row_sum()
    s = te.create_schedule(B.op)
    with pytest.raises(tc.ScheduleError, match=r"stage B: rfactor axis 'i' is not a reduction axis"):
        s.rfactor(B, B.op.axis[0])
    A2, C = ew2d()
    s2 = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"rfactor: stage C is not a reduction"):
        s2.rfactor(C, C.op.axis[0])


def test_cache_errors():
    A, r, B = row_sum()
    C = te.compute((16,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"cache_read: stage C does not read A"):
        s.cache_read(A, "local", [C])
    s[B].split(B.op.axis[0], factor=4)
    with pytest.raises(tc.ScheduleError, match=r"cache_write on stage B must come before"):
        s.cache_write(B, "local")
    with pytest.raises(tc.ScheduleError, match=r"cache_write: A is a placeholder"):
        s.cache_write(A, "local")


def test_pragma_and_prefetch_errors():
    A, r, B = row_sum()
    C = te.compute((16,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    with pytest.raises(tc.ScheduleError, match=r"stage C: pragma: unknown pragma 'unrol' on axis 'i'"):
        s[C].pragma(C.op.axis[0], "unrol")
    s[C].prefetch(A, C.op.axis[0], 1)
    with pytest.raises(tc.ScheduleError, match=r"stage C: prefetch of A, which it does not read"):
        tc.lower(s, [A, C])


def _vadd8():
    a = te.placeholder((8,), name="a")
    b = te.placeholder((8,), name="b")
    c = te.compute((8,), lambda i: a[i] + b[i], name="c")
    return te.decl_tensor_intrin(c.op, lambda ins, outs: te.call_extern(
        "int32", "vadd8", ins[0].access_ptr(), ins[1].access_ptr(), outs[0].access_ptr("w")),
        name="vadd8")


@pytest.mark.parametrize("body,factor,msg", [
    ("mul", 8, r"body does not match"),
    ("add", 4, r"loop 'i\.inner' has extent 4"),
])
def test_tensorize_mismatch(body, factor, msg):
    X = te.placeholder((32,), name="X")
    Y = te.placeholder((32,), name="Y")
    Z = te.compute((32,), (lambda i: X[i] * Y[i]) if body == "mul" else (lambda i: X[i] + Y[i]),
                   name="Z")
    s = te.create_schedule(Z.op)
    zo, zi = s[Z].split(Z.op.axis[0], factor=factor)
    s[Z].tensorize(zi, _vadd8())
    with pytest.raises(tc.ScheduleError, match=r"stage Z: cannot tensorize at axis 'i\.inner' with vadd8.*" + msg):
        tc.lower(s, [X, Y, Z])


# declaration errors -----------------------------------------------------------------------------


def test_index_uses_axis_of_another_compute():
    A, C = ew2d()
    with pytest.raises(tc.TecompError, match=r"compute E: expression uses axis 'j' that is neither an axis of E"):
        te.compute((16,), lambda i: A[i, C.op.axis[1].var], name="E")


def test_reduce_axis_outside_reduction():
    A, r, B = row_sum()
    with pytest.raises(tc.TecompError, match=r"compute E: expression uses axis 'r'.*reduce axis"):
        te.compute((16,), lambda i: A[i, r] * 2.0, name="E")


def test_reduction_declaration_errors():
    A, r, B = row_sum()
    A2, C = ew2d()
    with pytest.raises(tc.TecompError, match=r"sum: axis .*j.* is not a reduce axis"):
        te.compute((16,), lambda i: te.sum(A[i, 0], axis=C.op.axis[1]), name="E")
    with pytest.raises(tc.TecompError, match=r"sum: give axis="):
        te.sum(A[0, 0])
    with pytest.raises(tc.TecompError, match=r"compute E: a reduction must be the whole body"):
        te.compute((16,), lambda i: te.sum(A[i, r], axis=r) / 8, name="E")
    with pytest.raises(tc.TecompError, match=r"sum: the same reduce axis is listed twice"):
        te.sum(A[0, r], axis=[r, r])


def test_indexing_and_shape_errors():
    A, C = ew2d()
    with pytest.raises(tc.TecompError, match=r"tensor A has 2 dimensions but was indexed with 1"):
        A[1] + 1  # A[1] alone is a slice (TVM's TensorSlice, completed by A[1][j])
    with pytest.raises(tc.TecompError, match=r"tensor A has 2 dimensions but was indexed with 3"):
        A[1, 0, 0]
    with pytest.raises(tc.TecompError, match=r"index 0 of tensor A must be a scalar integer, got float32"):
        A[1.5, 0]
    with pytest.raises(tc.TecompError, match=r"compute E: fcompute takes 1 arguments but the shape has 2"):
        te.compute((4, 2), lambda i: A[i, 0], name="E")
    with pytest.raises(tc.TecompError, match=r"dimension 0 of P is negative \(-1\)"):
        te.placeholder((-1,), name="P")
    with pytest.raises(tc.TecompError, match=r"dimension 0 of P must be an integer"):
        te.placeholder((2.5,), name="P")
    with pytest.raises(tc.TecompError, match=r"unsupported dtype 'complex64'"):
        te.placeholder((3,), "complex64", name="P")
    with pytest.raises(tc.TecompError, match=r"as a Python bool"):
        bool(A[0, 0] < 1)


def test_lower_and_build_argument_errors():
    A, r, B = row_sum()
    C = te.compute((16,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    with pytest.raises(tc.LoweringError, match=r"output C is missing from the arguments"):
        tc.lower(s, [A])
    with pytest.raises(tc.LoweringError, match=r"placeholder A is read but not passed"):
        tc.lower(s, [C])
    with pytest.raises(tc.LoweringError, match=r"argument 1 of main must be a te.Tensor, got int"):
        tc.lower(s, [A, 3])
    with pytest.raises(tc.TecompError, match=r"build: pass the argument tensors"):
        tc.build(s)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(tc.LoweringError, match=r"argument B is computed at C"):
        tc.lower(s, [A, B, C])


@pytest.mark.parametrize("target,msg", [
    ("opencl", r"unsupported target 'opencl'"),
    ("cuda", r"loop 'i' runs outside every thread-bound loop"),  # a CPU schedule on a GPU
    ("llvm -mcpu=notacpu", r"LLVM does not know the CPU 'notacpu'"),
    ("llvm -O3", r"unknown target option '-O3'"),
])
def test_bad_target(target, msg):
    A, C = ew2d()
    with pytest.raises(tc.TecompError, match=msg):
        tc.build(te.create_schedule(C.op), [A, C], target=target)


# call-time argument checks ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def row_sum_kernel():
    A, r, B = row_sum()
    return tc.build(te.create_schedule(B.op), [A, B])


def test_wrong_argument_count(row_sum_kernel):
    a = rand((16, 8))
    with pytest.raises(TypeError, match=r"main\(\) takes 2 array arguments \(A, B\), got 1"):
        row_sum_kernel(a)
    with pytest.raises(TypeError, match=r"got 3"):
        row_sum_kernel(a, np.zeros(16, "float32"), a)


@pytest.mark.parametrize("case,exc,msg", [
    ("dtype", TypeError, r"argument 0 \('A'\) of main: expected dtype float32, got float64"),
    ("shape", ValueError, r"argument 0 \('A'\) of main: expected shape \(16, 8\), got \(4, 8\)"),
    ("rank", ValueError, r"argument 1 \('B'\) of main: expected shape \(16,\), got \(16, 1\)"),
    ("noncontig", ValueError, r"argument 0 \('A'\) of main: the array must be C-contiguous"),
    ("noncontig_out", ValueError, r"argument 1 \('B'\) of main: the array must be C-contiguous"),
    ("readonly_out", ValueError, r"argument 1 \('B'\) of main: the kernel writes this argument, but the "
                                 r"array is read-only"),
    ("list", TypeError, r"argument 0 \('A'\) of main: expected a numpy array or an object with __dlpack__"),
    ("scalar", TypeError, r"argument 1 \('B'\) of main: expected a numpy array.*got float"),
    ("none", TypeError, r"argument 0 \('A'\) of main: .*got NoneType"),
])
def test_bad_arguments(row_sum_kernel, case, exc, msg):
    a, b = rand((16, 8)), np.zeros(16, "float32")
    if case == "dtype":
        a = a.astype("float64")
    elif case == "shape":
        a = a[:4].copy()
    elif case == "rank":
        b = b.reshape(16, 1)
    elif case == "noncontig":
        a = np.asfortranarray(a)
    elif case == "noncontig_out":
        b = np.zeros((16, 2), "float32")[:, 0]
    elif case == "readonly_out":
        b.flags.writeable = False
    elif case == "list":
        a = a.tolist()
    elif case == "scalar":
        b = 0.0
    elif case == "none":
        a = None
    with pytest.raises(exc, match=msg):
        row_sum_kernel(a, b)


def test_read_only_input_is_fine(row_sum_kernel):
    a = rand((16, 8))
    a.flags.writeable = False
    b = np.zeros(16, "float32")
    row_sum_kernel(a, b)
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)


def test_output_overlapping_input():
    A, C = ew2d()
    f = tc.build(te.create_schedule(C.op), [A, C])
    a = rand((16, 8))
    with pytest.raises(ValueError, match=r"argument 1 \('C'\) of main overlaps the memory of argument 0"):
        f(a, a)


def test_inconsistent_symbolic_dims():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    D = te.compute((n - 2,), lambda i: A[i] + A[i + 2], name="D")
    f = tc.build(te.create_schedule([C.op, D.op]), [A, B, C, D])
    z = lambda k: np.zeros(k, "float32")  # noqa: E731
    with pytest.raises(ValueError, match=r"argument 1 \('B'\) of main: axis 0 has extent 4, but n = 3 "
                                         r"from the shape of argument 0 \('A'\)"):
        f(z(3), z(4), z(3), z(1))
    with pytest.raises(ValueError, match=r"argument 3 \('D'\) of main: expected shape \(\(n - 2\),\) = \(1,\)"):
        f(z(3), z(3), z(3), z(3))
    a, b, c, d = rand(9), rand(9), z(9), z(7)
    f(a, b, c, d)
    np.testing.assert_allclose(c, a + b)
    np.testing.assert_allclose(d, a[:-2] + a[2:])


class DLPackWrapper:
    """Any object exposing the DLPack protocol (what torch CPU tensors look like to tecomp)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_objects(row_sum_kernel):
    a, b = rand((16, 8)), np.zeros(16, "float32")
    row_sum_kernel(DLPackWrapper(a), DLPackWrapper(b))  # the output is written in place
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match=r"argument 0 \('A'\) of main: expected dtype float32, got float64"):
        row_sum_kernel(DLPackWrapper(a.astype("float64")), b)
    with pytest.raises(ValueError, match=r"argument 0 \('A'\) of main: the array must be C-contiguous"):
        row_sum_kernel(DLPackWrapper(np.asfortranarray(a)), b)
    ro = np.zeros(16, "float32")
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 1 \('B'\) of main: .*read-only"):
        row_sum_kernel(a, DLPackWrapper(ro))

    class Broken:
        def __dlpack__(self, **kwargs):
            raise BufferError("no export")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match=r"argument 0 \('A'\) of main: cannot import it through DLPack"):
        row_sum_kernel(Broken(), b)


def test_torch_cpu_tensors(row_sum_kernel):
    torch = pytest.importorskip("torch")
    a = torch.randn(16, 8)
    b = torch.zeros(16)
    row_sum_kernel(a, b)
    np.testing.assert_allclose(b.numpy(), a.numpy().sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sched", ["serial", "vectorize", "parallel"])
@pytest.mark.parametrize("op", ["truediv", "floordiv", "mod"])
def test_integer_division_by_zero_in_data(sched, op):
    # x86 traps on a zero divisor (SIGFPE would kill the interpreter): the kernel reports it
    n = 37
    A = te.placeholder((n,), "int32", name="A")
    B = te.placeholder((n,), "int32", name="B")
    fn = {"truediv": lambda x, y: te.truncdiv(x, y), "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y}[op]
    C = te.compute((n,), lambda i: fn(A[i], B[i]), name="C")
    s = te.create_schedule(C.op)
    if sched == "vectorize":
        s[C].vectorize(s[C].split(C.op.axis[0], factor=8)[1])
    elif sched == "parallel":
        s[C].parallel(C.op.axis[0])
    f = tc.build(s, [A, B, C])
    a = RNG.integers(-100, 100, n).astype("int32")
    b = RNG.integers(1, 9, n).astype("int32")
    c = np.zeros(n, "int32")
    f(a, b, c)  # fine without a zero
    b[n - 3] = 0
    with pytest.raises(ZeroDivisionError, match=r"kernel main: integer division or modulo by zero"):
        f(a, b, c)
    with pytest.raises(ZeroDivisionError):
        interp.run(tc.lower(s, [A, B, C]), a, b, c)
    b[n - 3] = 1
    f(a, b, c)  # the error state does not stick
    np.testing.assert_array_equal(c, fn(a, b) if op != "truediv" else np.trunc(a / b).astype("int32"))


@pytest.mark.parametrize("dtype,value", [("uint8", 300), ("uint8", -1), ("int8", 1000), ("int32", 2**40)])
def test_python_int_out_of_range_for_operand(dtype, value):
    # it would wrap silently (300 -> 44 for uint8); numpy 2 raises too
    A = te.placeholder((4,), dtype, name="A")
    with pytest.raises(tc.TecompError, match=rf"the Python integer {value} does not fit in {dtype}"):
        te.compute((4,), lambda i: A[i] + value, name="B")
    B = te.compute((4,), lambda i: A[i].astype("int64") + value, name="B")
    assert B.dtype == "int64"


def test_storage_align_symbolic_row():
    n = te.var("n")
    A = te.placeholder((n, n), name="A")
    B = te.compute((n, n), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((n, n), lambda i, j: B[i, j] + 1.0, name="C")
    s = te.create_schedule(C.op)
    s[B].storage_align(B.op.axis[0], 16, 0)
    with pytest.raises(tc.ScheduleError, match=r"stage B: storage_align of axis 'i' needs constant"):
        tc.lower(s, [A, C])


# debug builds: bounds checks ---------------------------------------------------------------------


@pytest.mark.parametrize("sched", ["serial", "parallel", "vectorize", "vectorize+parallel"])
@pytest.mark.parametrize("shift", [1, -1])
def test_debug_out_of_bounds(sched, shift):
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i + shift], name="B")  # reads one past an end
    s = te.create_schedule(B.op)
    if "vectorize" in sched:
        xo, xi = s[B].split(B.op.axis[0], factor=16)
        s[B].vectorize(xi)
        if "parallel" in sched:
            s[B].parallel(xo)
    elif sched == "parallel":
        s[B].parallel(B.op.axis[0])
    f = tc.build(s, [A, B], debug=True)
    a, b = rand(n), np.zeros(n, "float32")
    bad = r"-1" if shift < 0 else r"6\d"
    for _ in range(2):  # the error state is re-armed after each report
        with pytest.raises(IndexError, match=rf"out-of-bounds access to buffer 'A': flat index {bad} "
                                             r"not in \[0, 64\)"):
            f(a, b)
    # the interpreter (reference semantics) agrees
    with pytest.raises(IndexError, match=r"buffer 'A'"):
        interp.run(tc.lower(s, [A, B]), a, np.zeros(n, "float32"))


def test_debug_build_in_bounds_is_silent_and_correct():
    n = 50
    A = te.placeholder((n, n), name="A")
    B = te.compute((n - 2, n), lambda i, j: A[i, j] + A[i + 2, j], name="B")
    s = te.create_schedule(B.op)
    io, jo, ii, ji = s[B].tile(*B.op.axis, 8, 16)
    s[B].vectorize(ji)
    s[B].parallel(io)
    f = tc.build(s, [A, B], debug=True)
    a, b = rand((n, n)), np.zeros((n - 2, n), "float32")
    f(a, b)
    np.testing.assert_allclose(b, a[:-2] + a[2:])


def test_debug_out_of_bounds_on_one_axis():
    A = te.placeholder((8, 8), name="A")
    B = te.compute((7, 8), lambda i, j: A[i, j + 1], name="B")  # A[i, 8] for j = 7
    s = te.create_schedule(B.op)
    f = tc.build(s, [A, B], debug=True)
    with pytest.raises(IndexError, match=r"buffer 'A': index 8 on axis 1 not in \[0, 8\)"):
        f(rand((8, 8)), np.zeros((7, 8), "float32"))
    from tecomp.lowering import lower

    with pytest.raises(IndexError, match=r"index 8 on axis 1"):  # the interpreter agrees
        interp.run(lower(s, [A, B], debug=True), rand((8, 8)), np.zeros((7, 8), "float32"))
    # padding reads under a false if_then_else condition are not errors
    P = te.compute((10, 10), lambda i, j: te.if_then_else(
        te.all(i >= 1, i < 9, j >= 1, j < 9), A[i - 1, j - 1], 0.0), name="P")
    sp = te.create_schedule(P.op)
    sp[P].vectorize(sp[P].op.axis[1])
    p = np.zeros((10, 10), "float32")
    tc.build(sp, [A, P], debug=True)(np.ones((8, 8), "float32"), p)
    assert p.sum() == 64


# the surface around a compiled kernel -------------------------------------------------------------


def test_lower_prints_a_readable_loop_nest():
    n = te.var("n")
    A = te.placeholder((n, 8), name="A")
    B = te.compute((n, 8), lambda i, j: A[i, j] * 2.0, name="B")
    s = te.create_schedule(B.op)
    jo, ji = s[B].split(B.op.axis[1], factor=4)
    s[B].parallel(B.op.axis[0])
    s[B].unroll(ji)
    text = str(tc.lower(s, [A, B], name="double"))
    assert text.splitlines()[0] == "def double(A: float32[n, 8], B: float32[n, 8]):"
    assert "  parallel i in range(n):" in text
    assert "    for j.outer in range(2):" in text
    assert "B[i * 8 + j.outer * 4 + 3] = A[i * 8 + j.outer * 4 + 3] * 2.0f" in text
    assert str(tc.lower(s, [A, B])) == str(tc.lower(s, [A, B]))  # deterministic


def test_get_source_and_time_evaluator(row_sum_kernel):
    assert "define" in row_sum_kernel.get_source("ll")
    assert "ret" in row_sum_kernel.get_source("asm")
    with pytest.raises(ValueError, match=r"unknown source format 'foo'"):
        row_sum_kernel.get_source("foo")
    a, b = rand((16, 8)), np.zeros(16, "float32")
    res = row_sum_kernel.time_evaluator(number=3, repeat=4, min_repeat_ms=2)(a, b)
    assert len(res.results) == 4 and all(t > 0 for t in res.results)
    assert res.number >= 3 and res.median * res.number * 1e3 >= 2 * 0.99
    assert res.mean == pytest.approx(sum(res.results) / 4)
    assert res.median == pytest.approx(float(np.median(res.results)))
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"number and repeat must be at least 1"):
        row_sum_kernel.time_evaluator(number=0)
    with pytest.raises(TypeError, match=r"takes 2 array arguments"):
        row_sum_kernel.time_evaluator()(a)


def test_bool_arithmetic_is_rejected_at_declaration():
    A = te.placeholder((4,), "bool", name="A")
    with pytest.raises(tc.TecompError, match=r"arithmetic \(Add\) on bool"):
        te.compute((4,), lambda i: A[i] + A[i], name="B")
    B = te.compute((4,), lambda i: A[i].astype("int32") + A[i].astype("int32"), name="B")
    f = tc.build(te.create_schedule(B.op), [A, B])
    a = np.array([True, False, True, True])
    b = np.zeros(4, "int32")
    f(a, b)
    np.testing.assert_array_equal(b, a.astype("int32") * 2)


def test_unbound_scalar_variable_is_a_clear_error():
    A = te.placeholder((4,), name="A")
    alpha = te.var("alpha", "float32")
    B = te.compute((4,), lambda i: A[i] * alpha, name="B")
    with pytest.raises(tc.TecompError, match="alpha.*not a dimension of any argument"):
        tc.build(te.create_schedule(B.op), [A, B])
