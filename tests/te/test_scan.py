"""te.scan: recurrences over a time axis (TVM's ScanOp and its "Scan and Recurrent Kernel"
tutorial, with only the import changed)."""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tvm
from tecomp import te
from tecomp.errors import TecompError
from tecomp.runtime import interp


def _cumsum_decl():
    m = te.var("m")
    n = te.var("n")
    X = te.placeholder((m, n), name="X")
    s_state = te.placeholder((m, n))
    s_init = te.compute((1, n), lambda _, i: X[0, i])
    s_update = te.compute((m, n), lambda t, i: s_state[t - 1, i] + X[t, i])
    s_scan = tvm.te.scan(s_init, s_update, s_state, inputs=[X])
    return X, s_init, s_update, s_scan


def test_tutorial_cumsum_cpu() -> None:
    # the tutorial's first kernel, scheduled for a CPU (split + parallel instead of bind)
    X, s_init, s_update, s_scan = _cumsum_decl()
    s = te.create_schedule(s_scan.op)
    xo, xi = s[s_init].split(s_init.op.axis[1], factor=16)
    xo, xi = s[s_update].split(s_update.op.axis[1], factor=16)
    s[s_update].parallel(xo)
    s[s_update].vectorize(xi)
    text = str(tvm.lower(s, [X, s_scan], simple_mode=True))
    assert "scan.idx" in text
    fscan = tvm.build(s, [X, s_scan], "llvm", name="myscan")
    m, n = 33, 70
    a_np = np.random.uniform(size=(m, n)).astype(s_scan.dtype)
    b = np.zeros((m, n), dtype=s_scan.dtype)
    fscan(a_np, b)
    np.testing.assert_allclose(b, np.cumsum(a_np, axis=0), rtol=1e-5)
    ref = np.zeros_like(b)
    interp.run(tvm.lower(s, [X, s_scan]), a_np, ref)
    np.testing.assert_allclose(ref, b, rtol=1e-6)


def test_tutorial_multi_stage_scan_cell() -> None:
    m = te.var("m")
    n = te.var("n")
    X = te.placeholder((m, n), name="X")
    s_state = te.placeholder((m, n))
    s_init = te.compute((1, n), lambda _, i: X[0, i])
    s_update_s1 = te.compute((m, n), lambda t, i: s_state[t - 1, i] * 2, name="s1")
    s_update_s2 = te.compute((m, n), lambda t, i: s_update_s1[t, i] + X[t, i], name="s2")
    s_scan = tvm.te.scan(s_init, s_update_s2, s_state, inputs=[X])

    s = te.create_schedule(s_scan.op)
    xo, xi = s[s_update_s2].split(s_update_s2.op.axis[1], factor=32)
    s[s_update_s1].compute_at(s[s_update_s2], xo)
    print(tvm.lower(s, [X, s_scan], simple_mode=True))

    f = tvm.build(s, [X, s_scan])
    x = np.random.rand(9, 45).astype("float32")
    out = np.zeros_like(x)
    f(x, out)
    ref = x.copy()
    for t in range(1, 9):
        ref[t] = ref[t - 1] * 2 + x[t]
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    # s1 at the default place (root of the scan body: one row per time step)
    s = te.create_schedule(s_scan.op)
    f = tvm.build(s, [X, s_scan])
    out[:] = 0
    f(x, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_tutorial_multiple_states() -> None:
    m = te.var("m")
    n = te.var("n")
    l = m  # noqa: E741 (the tutorial's name)
    X = te.placeholder((m, n), name="X")
    s_state1 = te.placeholder((m, n))
    s_state2 = te.placeholder((m, l))
    s_init1 = te.compute((1, n), lambda _, i: X[0, i])
    s_init2 = te.compute((1, l), lambda _, i: 0.0)
    s_update1 = te.compute((m, n), lambda t, i: s_state1[t - 1, i] + X[t, i])
    s_update2 = te.compute((m, l), lambda t, i: s_state2[t - 1, i] + s_state1[t - 1, 0])
    s_scan1, s_scan2 = tvm.te.scan([s_init1, s_init2], [s_update1, s_update2], [s_state1, s_state2])
    s = te.create_schedule(s_scan1.op)
    print(tvm.lower(s, [X, s_scan1, s_scan2], simple_mode=True))

    f = tvm.build(s, [X, s_scan1, s_scan2])
    x = np.random.rand(6, 5).astype("float32")
    o1, o2 = np.zeros((6, 5), "float32"), np.zeros((6, 6), "float32")
    f(x, o1, o2)
    r1 = np.cumsum(x, axis=0)
    r2 = np.zeros((6, 6), "float32")
    for t in range(1, 6):
        r2[t] = r2[t - 1] + r1[t - 1, 0]
    np.testing.assert_allclose(o1, r1, rtol=1e-5)
    np.testing.assert_allclose(o2, r2, rtol=1e-5)


def test_rnn_like_cell_two_states_and_consumer() -> None:
    # h[t] = tanh(W h[t-1] + x[t]); c[t] = c[t-1] + h[t-1]; a compute stage reads the scan
    T, H = 7, 12
    X = te.placeholder((T, H), name="X")
    W = te.placeholder((H, H), name="W")
    h_state = te.placeholder((T, H), name="h")
    c_state = te.placeholder((T, H), name="c")
    h_init = te.compute((1, H), lambda _, i: tvm.const(0.0, "float32"), name="h0")
    c_init = te.compute((1, H), lambda _, i: X[0, i], name="c0")
    k = te.reduce_axis((0, H), name="k")
    wh = te.compute((T, H), lambda t, i: te.sum(W[i, k] * h_state[t - 1, k], axis=k), name="wh")
    h_upd = te.compute((T, H), lambda t, i: te.tanh(wh[t, i] + X[t, i]), name="h_upd")
    c_upd = te.compute((T, H), lambda t, i: c_state[t - 1, i] + h_state[t - 1, i], name="c_upd")
    h_out, c_out = te.scan([h_init, c_init], [h_upd, c_upd], [h_state, c_state], inputs=[X, W],
                           name="rnn")
    Y = te.compute((T, H), lambda t, i: h_out[t, i] + c_out[t, i], name="Y")
    s = te.create_schedule(Y.op)
    io, ii = s[h_upd].split(h_upd.op.axis[1], factor=4)
    s[wh].compute_at(s[h_upd], io)
    f = tvm.build(s, [X, W, Y])
    x = np.random.rand(T, H).astype("float32")
    w = (np.random.rand(H, H).astype("float32") - 0.5) * 0.5
    y = np.zeros((T, H), "float32")
    f(x, w, y)
    h = np.zeros((T, H), "float32")
    c = np.zeros((T, H), "float32")
    c[0] = x[0]
    for t in range(1, T):
        h[t] = np.tanh(w @ h[t - 1] + x[t])
        c[t] = c[t - 1] + h[t - 1]
    np.testing.assert_allclose(y, h + c, rtol=1e-4, atol=1e-5)
    ref = np.zeros_like(y)
    interp.run(tvm.lower(s, [X, W, Y]), x, w, ref)
    np.testing.assert_allclose(ref, h + c, rtol=1e-4, atol=1e-5)


def test_scan_errors() -> None:
    m = te.var("m")
    X = te.placeholder((m, 4), name="X")
    st = te.placeholder((m, 4), name="st")
    init = te.compute((1, 4), lambda _, i: X[0, i], name="init")
    bad = te.compute((m, 5), lambda t, i: X[t, 0], name="bad")
    with pytest.raises(TecompError, match="dimension 1 of update"):
        te.scan(init, bad, st)
    with pytest.raises(TecompError, match="must be a te.placeholder"):
        te.scan(init, init, init)
    upd = te.compute((m, 4), lambda t, i: st[t - 1, i] + X[t, i], name="upd")
    with pytest.raises(TecompError, match="same number"):
        te.scan([init, init], [upd], [st])
    f64 = te.placeholder((m, 4), "float64", name="f64")
    with pytest.raises(TecompError, match="float64"):
        te.scan(init, upd, f64)
    sc = te.scan(init, upd, st)
    s = te.create_schedule(sc.op)
    # cuda builds scans (tests/runtime/test_gpu_scan.py), but their loops must be bound
    with pytest.raises(TecompError, match="runs outside every thread-bound loop"):
        tvm.lower(s, [X, sc], target="cuda -arch=sm_80")
    from tecomp.te.serialize import dag_to_json

    with pytest.raises(TecompError, match="cannot be tuned"):
        dag_to_json([X, sc])
