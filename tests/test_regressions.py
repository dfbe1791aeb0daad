"""Regression tests for compiler bugs found by differential testing (tests/test_differential.py).

Each test is the smallest program that showed the bug, checked against numpy, compiled
(bounds-checked where that is what failed) and interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp

RNG = np.random.default_rng(0)


def run_both(s, args, inputs, ref, rtol=1e-6):
    """Compiled (debug build: bounds-checked) and interpreted results must both match ``ref``."""
    out = np.zeros(ref.shape, ref.dtype)
    tc.build(s, args, debug=True)(*inputs, out)
    np.testing.assert_allclose(out, ref, rtol=rtol)
    out2 = np.zeros(ref.shape, ref.dtype)
    interp.run(tc.lower(s, args), *inputs, out2, poison=True)
    np.testing.assert_allclose(out2, ref, rtol=rtol)


def test_cache_read_of_a_stage_whose_op_was_replaced():
    # te/schedule.py: cache_read matched readers against the stage's *current* op, but readers
    # load the tensor through the op they were declared with; after an earlier cache_read,
    # cache_write or rfactor had replaced that op, it raised "stage C does not read B".
    A = te.placeholder((6, 5), name="A")
    B = te.compute((6, 5), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((6, 5), lambda i, j: B[i, j] + 1.0, name="C")
    a = RNG.standard_normal((6, 5)).astype("float32")

    s = te.create_schedule(C.op)
    AL = s.cache_read(A, "local", [B])  # replaces B's op
    BL = s.cache_read(B, "local", [C])
    s[AL].compute_at(s[B], s[B].op.axis[0])
    s[BL].compute_at(s[C], s[C].op.axis[0])
    run_both(s, [A, C], [a], a * 2 + 1)

    s = te.create_schedule(C.op)
    s.cache_write(B, "local")  # replaces B's op too
    s.cache_read(B, "local", [C])
    run_both(s, [A, C], [a], a * 2 + 1)


def test_compute_at_region_below_domain_and_wider_than_it():
    # lowering/bound.py: a guarded read P[i - 6] makes the region start below P's domain and
    # its extent bound exceed the domain's; the extent was clamped to the domain's but the
    # window kept starting below it, so reads near the top (P[7 - i]) fell outside the buffer.
    A = te.placeholder((8,), name="A")
    P = te.compute((8,), lambda i: A[i] * 2.0, name="P")
    C = te.compute((8,), lambda i: te.if_then_else(i >= 6, P[i - 6], 0.0) + P[7 - i], name="C")
    s = te.create_schedule(C.op)
    io, _ = s[C].split(s[C].op.axis[0], factor=4)
    s[P].compute_at(s[C], io)
    a = np.arange(8, dtype="float32")
    idx = np.arange(8)
    ref = np.where(idx >= 6, 2 * a[np.maximum(idx - 6, 0)], 0) + 2 * a[::-1]
    run_both(s, [A, C], [a], ref.astype("float32"))


def test_compute_at_region_extent_depending_on_outer_loop_with_symbolic_dim():
    # lowering/bound.py: with a symbolic n the region extent min(4*io + 4, n - 1) - 4*io + 1
    # has no constant bound and was kept as is: the allocation depended on the loop variable
    # io and codegen failed ("cannot generate AxisVar (i.outer)").
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    P = te.compute((n,), lambda i: A[i] * 2.0, name="P")
    C = te.compute((n,), lambda i: P[i] + P[te.min(i + 1, n - 1)], name="C")
    s = te.create_schedule(C.op)
    io, _ = s[C].split(s[C].op.axis[0], factor=4)
    s[P].compute_at(s[C], io)
    for m in (1, 5, 8, 11):
        a = RNG.standard_normal(m).astype("float32")
        ref = 2 * a + 2 * a[np.minimum(np.arange(m) + 1, m - 1)]
        run_both(s, [A, C], [a], ref)


def test_loop_partition_does_not_take_floordiv_mod_for_linear():
    # passes/loop_partition.py: a guard was taken as linear in the loop variable from three
    # samples (v = 0, 1, 2); x // 6 * 15 + x % 6 equals x there, so the fused loop of a tile
    # was cut as if the guard were x + 6*io < 17 and its steady part wrote past the end.
    A = te.placeholder((17,), name="A")
    B = te.compute((17,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    o, i = s[B].split(s[B].op.axis[0], factor=15)
    _, _, oi, ii = s[B].tile(o, i, 2, 6)
    s[B].fuse(oi, ii)
    a = RNG.standard_normal(17).astype("float32")
    run_both(s, [A, B], [a], a * 2)


def test_integer_division_in_a_masked_vector_tail_ignores_the_masked_lanes():
    # the tail of a vectorized loop is a predicated vector store whose masked-off lanes load 0:
    # the interpreter and the GPU emulator divided by those zeros (ZeroDivisionError) although
    # no lane that is stored divides by zero (LLVM's code divides them by 1)
    n = 35
    A = te.placeholder((n,), "int32", name="A")
    C = te.placeholder((n,), "int32", name="C")
    B = te.compute((n,), lambda i: A[i] // C[i], name="B")
    a = (np.arange(n) - 10).astype("int32")
    c = RNG.integers(1, 5, n).astype("int32")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=12)
    _, iii = s[B].split(ii, factor=3)
    s[B].vectorize(iii)
    run_both(s, [A, C, B], [a, c], a // c)

    g = te.create_schedule(B.op)
    io, ii = g[B].split(B.op.axis[0], factor=12)
    iio, iii = g[B].split(ii, factor=3)
    g[B].bind(io, te.thread_axis("blockIdx.x"))
    g[B].bind(iio, te.thread_axis("threadIdx.x"))
    g[B].vectorize(iii)
    f = tc.build(g, [A, C, B], target="cuda")
    out = np.zeros(n, "int32")
    f.emulate(a, c, out)
    np.testing.assert_array_equal(out, a // c)
    c[5] = 0  # a zero in a stored lane is still an error
    with pytest.raises(ZeroDivisionError, match="thread"):
        f.emulate(a, c, out)
    with pytest.raises(ZeroDivisionError):
        interp.run(tc.lower(s, [A, C, B]), a, c, out)


@pytest.mark.parametrize("name", ["tan", "sin", "hypot", "expf", "memcpy"])
def test_a_kernel_named_like_a_c_library_function_is_refused(name):
    # LLVM lowers math to calls of libm's symbols; a kernel of that name was called instead
    # (a kernel "tan" computing tan recursed until the process segfaulted)
    A = te.placeholder((16,), "float64", name="A")
    B = te.compute((16,), lambda i: te.tan(A[i]), name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(tc.CodegenError, match=f"kernel name '{name}' is a C library function"):
        tc.build(s, [A, B], name=name)
    f = tc.build(s, [A, B], name=f"{name}_kernel")
    a, b = np.linspace(-1, 1, 16), np.zeros(16)
    f(a, b)
    np.testing.assert_allclose(b, np.tan(a), rtol=1e-12)
