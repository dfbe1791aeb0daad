"""te.scan on a cuda target (TVM's scan tutorial): the init is one kernel, the update a second
whose serial time loop runs in every thread around its thread loops. Emulated against numpy
(no GPU needed), PTX checked by ptxas for sm_80/sm_90 where it is installed; scans whose steps
read other threads' columns get a barrier per step in one block and are refused across blocks;
te.extern stays CPU-only with a specific message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import find_ptxas, ptxas_resources
from tecomp.errors import LoweringError
from tecomp.runtime.gpu_race import RaceError


def tutorial_scan(m: Any, n: Any) -> tuple[Any, list[Any]]:
    """https://tvm.apache.org/docs/v0.13.0/how_to/work_with_schedules/scan.html, verbatim."""
    X = te.placeholder((m, n), name="X")
    s_state = te.placeholder((m, n))
    s_init = te.compute((1, n), lambda _, i: X[0, i])
    s_update = te.compute((m, n), lambda t, i: s_state[t - 1, i] + X[t, i])
    s_scan = te.scan(s_init, s_update, s_state, inputs=[X])
    s = te.create_schedule(s_scan.op)
    num_thread = 256
    block_x = te.thread_axis("blockIdx.x")
    thread_x = te.thread_axis("threadIdx.x")
    xo, xi = s[s_init].split(s_init.op.axis[1], factor=num_thread)
    s[s_init].bind(xo, block_x)
    s[s_init].bind(xi, thread_x)
    xo, xi = s[s_update].split(s_update.op.axis[1], factor=num_thread)
    s[s_update].bind(xo, block_x)
    s[s_update].bind(xi, thread_x)
    return s, [X, s_scan]


def neighbour_scan(m: int, n: int, blocks: bool) -> tuple[Any, list[Any]]:
    """Row t reads row t-1 at the thread's own column and at the next one (another thread's)."""
    X = te.placeholder((m, n), name="X")
    state = te.placeholder((m, n), name="state")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    update = te.compute((m, n), lambda t, i: state[t - 1, i] + state[t - 1, (i + 1) % n] * 0.5
                        + X[t, i], name="update")
    res = te.scan(init, update, state, inputs=[X], name="nscan")
    s = te.create_schedule(res.op)
    for st in (init, update):
        if blocks:
            xo, xi = s[st].split(st.op.axis[1], factor=64)
            s[st].bind(xo, te.thread_axis("blockIdx.x"))
            s[st].bind(xi, te.thread_axis("threadIdx.x"))
        else:
            s[st].bind(st.op.axis[1], te.thread_axis("threadIdx.x"))
    return s, [X, res]


def neighbour_ref(x: np.ndarray) -> np.ndarray:
    ref = x.copy()
    for t in range(1, x.shape[0]):
        ref[t] = ref[t - 1] + np.roll(ref[t - 1], -1) * np.float32(0.5) + x[t]
    return ref


def run(f: Any, m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((m, n)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    f.emulate(x, out, seed=seed)
    return x, out


def test_tutorial_scan_constant_shape_is_a_cumsum() -> None:
    m, n = 7, 600  # 3 blocks, the last one ragged
    s, args = tutorial_scan(m, n)
    f = tc.build(s, args, "cuda", name="myscan")
    fn = f["myscan"]
    assert [k.name for k in fn.kernels] == ["myscan_kernel0", "myscan_kernel1"]
    tir = f.get_source("tir")
    assert "scan_time_loop" in tir and "syncthreads" not in tir  # each thread owns its column
    for seed in (0, 1):
        x, out = run(f, m, n, seed)
        np.testing.assert_allclose(out, np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)


def test_tutorial_lowered_text_has_the_time_loop_around_the_threads() -> None:
    s, args = tutorial_scan(te.var("m"), te.var("n"))
    # as the tutorial prints it: tvm.lower(s, [X, s_scan], simple_mode=True), no target
    text = str(tc.lower(s, args, simple_mode=True))
    assert text == str(tc.lower(s, args, simple_mode=True, target="cuda"))
    loop = text.index("for scan.idx in range(1, ")
    assert text.index("thread_tag=blockIdx.x", loop) > loop


@pytest.mark.parametrize(("m", "n"), [(5, 300), (1, 7), (4, 256), (3, 513)])
def test_tutorial_scan_symbolic_shapes(m: int, n: int) -> None:
    s, args = tutorial_scan(te.var("m"), te.var("n"))
    f = tc.build(s, args, "cuda", name="myscan")
    x, out = run(f, m, n)
    np.testing.assert_allclose(out, np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)


def test_launch_plan_maps_each_kernels_dims_by_identity() -> None:
    # two size vars: finding a kernel's dim among the function's must not compare Vars with ==
    s, args = tutorial_scan(te.var("m"), te.var("n"))
    plan = tc.build(s, args, "cuda", name="myscan")["myscan"].plan
    assert plan.spec.dims == ("m", "n") and [k.dims for k in plan.kernels] == [(0, 1), (0, 1)]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_ptxas_accepts_the_scan_kernels(arch: str, symbolic: bool) -> None:
    s, args = tutorial_scan(*((te.var("m"), te.var("n")) if symbolic else (16, 1024)))
    f = tc.build(s, args, f"cuda -arch={arch}", name="myscan")
    res = ptxas_resources(f.get_source("ptx"), arch)
    assert set(res) == {"myscan_kernel0", "myscan_kernel1"}
    assert all(res[k].spill_stores == 0 for k in res)


def test_neighbour_read_in_one_block_gets_a_barrier_per_step() -> None:
    m, n = 6, 96
    s, args = neighbour_scan(m, n, blocks=False)
    f = tc.build(s, args, "cuda")
    kernel = f.get_source("tir").split("def main_kernel1")[1]
    assert kernel.count("syncthreads()") == 1 and "scan_time_loop" in kernel
    for seed in (0, 3):
        x, out = run(f, m, n, seed)
        np.testing.assert_allclose(out, neighbour_ref(x), rtol=1e-5, atol=1e-5)
    if find_ptxas() is not None:
        res = ptxas_resources(f.get_source("ptx"), "sm_80")
        assert res["main_kernel1"].barriers == 1


def test_without_the_barrier_the_race_detector_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    # the barrier is what makes the neighbour scan correct: drop it and the emulator says so
    import tecomp.lowering.gpu_scan as gs

    monkeypatch.setattr(gs, "scan_step_needs_barrier", lambda *a: False)
    s, args = neighbour_scan(4, 64, blocks=False)
    f = tc.build(s, args, "cuda")
    assert "syncthreads" not in f.get_source("tir")
    with pytest.raises(RaceError, match="scan"):
        run(f, 4, 64)


def test_neighbour_read_across_blocks_is_refused() -> None:
    s, args = neighbour_scan(5, 600, blocks=True)
    with pytest.raises(LoweringError, match=r"scan nscan: .*update reads state\[t - 1, \(i \+ 1\) "
                       r"% 600\].*blockIdx.*grid-wide sync"):
        tc.build(s, args, "cuda")


def test_neighbour_read_across_blocks_would_race(monkeypatch: pytest.MonkeyPatch) -> None:
    # why it is refused: without a grid sync blocks read rows other blocks may not have written
    import tecomp.lowering.gpu_scan as gs

    monkeypatch.setattr(gs, "scan_step_needs_barrier", lambda *a: False)
    s, args = neighbour_scan(3, 256, blocks=True)
    f = tc.build(s, args, "cuda")
    with pytest.raises(RaceError):
        run(f, 3, 256)


def two_state_scan(m: int, n: int, cross: bool, blocks: bool,
                   factor2: int = 32) -> tuple[Any, list[Any]]:
    """Two states: h2 adds h1's new row to its own; with ``cross`` (TVM's multi-state test) it
    adds h1's column 0 of the previous row instead."""
    X = te.placeholder((m, n), name="X")
    st1 = te.placeholder((m, n), name="st1")
    st2 = te.placeholder((m, n), name="st2")
    init1 = te.compute((1, n), lambda _, i: X[0, i], name="init1")
    init2 = te.compute((1, n), lambda _, i: tc.const(0, "float32"), name="init2")
    up1 = te.compute((m, n), lambda t, i: st1[t - 1, i] + X[t, i], name="up1")
    if cross:
        up2 = te.compute((m, n), lambda t, i: st2[t - 1, i] + st1[t - 1, 0], name="up2")
    else:
        up2 = te.compute((m, n), lambda t, i: st2[t - 1, i] + up1[t, i], name="up2")
    h1, h2 = te.scan([init1, init2], [up1, up2], [st1, st2], inputs=[X], name="two")
    s = te.create_schedule(h1.op)
    for st in (init1, init2, up1, up2):
        if blocks:
            xo, xi = s[st].split(st.op.axis[1], factor=factor2 if st is up2 else 32)
            s[st].bind(xo, te.thread_axis("blockIdx.x"))
            s[st].bind(xi, te.thread_axis("threadIdx.x"))
        else:
            s[st].bind(st.op.axis[1], te.thread_axis("threadIdx.x"))
    return s, [X, h1, h2]


def test_two_state_scan_own_columns_across_blocks() -> None:
    m, n = 5, 100
    s, args = two_state_scan(m, n, cross=False, blocks=True)
    f = tc.build(s, args, "cuda")
    assert "syncthreads" not in f.get_source("tir")
    x = np.random.default_rng(2).standard_normal((m, n)).astype(np.float32)
    h1, h2 = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
    f.emulate(x, h1, h2)
    r1 = np.cumsum(x, axis=0)
    r2 = np.concatenate([np.zeros((1, n), np.float32), np.cumsum(r1[1:], axis=0)])
    np.testing.assert_allclose(h1, r1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h2, r2, rtol=1e-5, atol=1e-4)


def test_two_state_scan_reading_another_column_in_one_block() -> None:
    m, n = 5, 64
    s, args = two_state_scan(m, n, cross=True, blocks=False)
    f = tc.build(s, args, "cuda")
    assert f.get_source("tir").split("def main_kernel2")[1].count("syncthreads()") == 2
    x = np.random.default_rng(4).standard_normal((m, n)).astype(np.float32)
    h1, h2 = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
    f.emulate(x, h1, h2)
    r1 = np.cumsum(x, axis=0)
    r2 = np.zeros_like(r1)
    for t in range(1, m):
        r2[t] = r2[t - 1] + r1[t - 1, 0]
    np.testing.assert_allclose(h1, r1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h2, r2, rtol=1e-5, atol=1e-4)
    with pytest.raises(LoweringError, match=r"scan two: .*up2 reads st1\[t - 1, 0\]"):
        tc.build(*two_state_scan(m, n, cross=True, blocks=True), "cuda")


def test_updates_mapping_columns_to_threads_differently_are_refused_across_blocks() -> None:
    # up2 reads up1[t, i] at its own column, but split by another factor column i of up1 and of
    # up2 belong to different threads (and blocks)
    s, args = two_state_scan(4, 128, cross=False, blocks=True, factor2=64)
    with pytest.raises(LoweringError, match=r"scan two: .*up1, up2 map columns to threads "
                       r"differently.*grid-wide sync"):
        tc.build(s, args, "cuda")


def test_extern_on_cuda_is_refused_with_the_reason() -> None:
    A = te.placeholder((16,), name="A")
    B = te.extern((16,), [A], lambda ins, outs: te.call_extern("int32", "noop", ins[0].data,
                                                               outs[0].data), name="ext")
    s = te.create_schedule(B.op)
    with pytest.raises(LoweringError, match=r"te.extern stage\(s\) ext cannot be built for a cuda "
                       r"target: .*GPU kernel cannot call"):
        tc.build(s, [A, B], "cuda")


def test_a_state_not_passed_in_is_a_global_intermediate() -> None:
    # h2 is only needed inside the scan: its buffer lives in global memory between the kernels
    m, n = 5, 64
    s, args = two_state_scan(m, n, cross=False, blocks=True)
    f = tc.build(s, args[:2], "cuda")
    assert "global intermediates: two_v1: float32[5, 64]" in f.get_source("tir")
    x = np.random.default_rng(5).standard_normal((m, n)).astype(np.float32)
    h1 = np.zeros((m, n), np.float32)
    f.emulate(x, h1)
    np.testing.assert_allclose(h1, np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)


def test_an_unbound_update_is_refused_by_name() -> None:
    m, n = 4, 32
    X = te.placeholder((m, n), name="X")
    state = te.placeholder((m, n), name="state")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    update = te.compute((m, n), lambda t, i: state[t - 1, i] + X[t, i], name="update")
    res = te.scan(init, update, state, inputs=[X], name="sc")
    s = te.create_schedule(res.op)
    s[init].bind(init.op.axis[1], te.thread_axis("threadIdx.x"))
    with pytest.raises(tc.errors.TecompError, match=r"sc: loop 'i' runs outside every thread-bound"):
        tc.build(s, [X, res], "cuda")
