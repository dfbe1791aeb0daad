"""Several stages computed at root on a cuda target: one kernel each, launched in order (as TVM
does), the tensors between them in global memory allocated per call. Emulated against numpy,
PTX checked by ptxas, the call without a GPU refused with the argument checks first."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import TecompError


def two_elementwise(n: Any = 1000) -> tuple[Any, list[Any]]:
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2, name="B")
    C = te.compute((n,), lambda i: B[i] + B[n - 1 - i], name="C")  # reads B written by other blocks
    s = te.create_schedule(C.op)
    for st, f in ((B, 128), (C, 64)):
        xo, xi = s[st].split(st.op.axis[0], factor=f)
        s[st].bind(xo, te.thread_axis("blockIdx.x"))
        s[st].bind(xi, te.thread_axis("threadIdx.x"))
    return s, [A, C]


def tvm_topi_softmax(n: int, m: int) -> tuple[Any, list[Any]]:
    """topi.cuda.schedule_softmax (TVM 0.x) for the 2-D softmax: four kernels (max, exp, the
    rfactored sum across 64 threads, the division)."""
    A = te.placeholder((n, m), name="A")
    k1 = te.reduce_axis((0, m), "k1")
    k2 = te.reduce_axis((0, m), "k2")
    max_elem = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="max_elem")
    expv = te.compute((n, m), lambda i, j: te.exp(A[i, j] - max_elem[i]), name="exp")
    expsum = te.compute((n,), lambda i: te.sum(expv[i, k2], axis=k2), name="expsum")
    softmax = te.compute((n, m), lambda i, j: expv[i, j] / expsum[i], name="softmax")
    s = te.create_schedule(softmax.op)
    num_thread = 64
    block_x = te.thread_axis("blockIdx.x")
    thread_x = te.thread_axis((0, num_thread), "threadIdx.x")
    s[expv].bind(expv.op.axis[0], block_x)
    s[max_elem].bind(max_elem.op.axis[0], block_x)
    k = expsum.op.reduce_axis[0]
    ko, ki = s[expsum].split(k, factor=num_thread)
    EF = s.rfactor(expsum, ki)
    s[expsum].bind(s[expsum].op.axis[0], block_x)
    s[expsum].bind(s[expsum].op.reduce_axis[0], thread_x)
    s[EF].compute_at(s[expsum], s[expsum].op.reduce_axis[0])
    s[expsum].set_store_predicate(thread_x.var.equal(0))
    tx, xi = s[softmax].split(softmax.op.axis[1], nparts=num_thread)
    s[softmax].bind(softmax.op.axis[0], block_x)
    s[softmax].bind(tx, thread_x)
    return s, [A, softmax]


def test_two_root_stages_are_two_kernels() -> None:
    s, args = two_elementwise()
    f = tc.build(s, args, target="cuda")
    fn = f["main"]
    assert [k.name for k in fn.kernels] == ["main_kernel0", "main_kernel1"]
    launch = {k: {t: int(e.value) for t, e in v.items()} for k, v in fn.launch.items()}
    assert launch == {"main_kernel0": {"blockIdx.x": 8, "threadIdx.x": 128},
                      "main_kernel1": {"blockIdx.x": 16, "threadIdx.x": 64}}
    assert [[b.name for b in k.params] for k in fn.kernels] == [["A", "B"], ["C", "B"]]
    tir = f.get_source("tir")
    assert "launch_kernel('main_kernel0')" in tir and "def main_kernel1(C" in tir
    assert "global intermediates: B: float32[1000]" in tir
    assert f.get_source("ptx").count(".entry") == 2
    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c = np.zeros(1000, np.float32)
    for seed in (0, 1):
        f.emulate(a, c, seed=seed)
        np.testing.assert_array_equal(c, a * 2 + (a * 2)[::-1])
    if find_ptxas() is not None:
        r = f.resources
        assert set(r) == {"main_kernel0", "main_kernel1"} and r["main_kernel1"].spill_stores == 0
    from tecomp.runtime.cuda import cuda_available

    if not cuda_available()[0]:
        with pytest.raises(TypeError, match="argument"):
            f(a)  # the argument checks come first, as for one kernel
        with pytest.raises(TecompError, match=r"emulate\(\*numpy_arrays\)"):
            f(a, c)


@pytest.mark.parametrize("n", [5, 300])
def test_symbolic_sizes_size_the_intermediates(n: int) -> None:
    s, args = two_elementwise(te.var("n"))
    f = tc.build(s, args, target="cuda")
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    c = np.zeros(n, np.float32)
    f.emulate(a, c)
    np.testing.assert_array_equal(c, a * 2 + (a * 2)[::-1])


def test_tvm_topi_softmax_schedule_runs_unchanged() -> None:
    n, m = 6, 300
    s, args = tvm_topi_softmax(n, m)
    f = tc.build(s, args, target="cuda")
    assert len(f["main"].kernels) == 4
    a = np.random.default_rng(1).standard_normal((n, m)).astype(np.float32) * 3
    o = np.zeros((n, m), np.float32)
    f.emulate(a, o)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(o, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-8)
    assert "shfl.sync.bfly" in f.get_source("ptx")


def test_an_intermediate_never_written_reads_as_nan() -> None:
    # the emulator starts intermediates as NaN: a kernel that reads before any write shows it
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1, name="B")
    C = te.compute((64,), lambda i: B[i] * 3, name="C")
    s = te.create_schedule(C.op)
    for st in (B, C):
        s[st].bind(st.op.axis[0], te.thread_axis("threadIdx.x"))
    s[B].set_store_predicate(B.op.axis[0].var < 60)  # B[60:] is never written
    f = tc.build(s, [A, C], target="cuda")
    c = np.zeros(64, np.float32)
    f.emulate(np.ones(64, np.float32), c)
    assert np.all(c[:60] == 6) and np.all(np.isnan(c[60:]))
