"""Row softmax on an NVIDIA GPU with cross-thread reductions: tecomp vs torch.softmax.

Two schedules of ``softmax(A, axis=1)`` for an ``rows x cols`` fp32 matrix:

* ``one-kernel``: a block per row; the row max and the row sum are cross-thread reductions over
  ``--threads`` threads (warp shuffles, then one partial per warp in shared memory), computed
  at the row's blockIdx loop, so the three passes are one kernel;
* ``topi``: TVM's ``topi.cuda.schedule_softmax`` as written for TVM (four kernels: max, exp,
  the sum rfactored onto 64 threads, the division), unchanged apart from the import.

What runs everywhere: ptxas's resource report for each kernel (registers, spills, shared
memory, for ``--arch``), and an emulation on the CPU at ``--emulate-rows`` rows checked
against numpy. With a GPU: GB/s of each (one read + one write of the matrix is the useful
traffic) and of ``torch.softmax`` measured in the same run; without one it says plainly
"no GPU: skipped".

    python benchmarks/gpu_softmax.py                       # 4096 x 4096, sm_80
    python benchmarks/gpu_softmax.py --arch sm_90 --cols 1000
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import tecomp as tc
from tecomp import te


def one_kernel(rows: int, cols: int, nthread: int) -> tuple[Any, list[Any]]:
    A = te.placeholder((rows, cols), name="A")
    k1 = te.reduce_axis((0, cols), "k1")
    k2 = te.reduce_axis((0, cols), "k2")
    M = te.compute((rows,), lambda i: te.max(A[i, k1], axis=k1), name="M")
    E = te.compute((rows, cols), lambda i, j: te.exp(A[i, j] - M[i]), name="E")
    S = te.compute((rows,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    O = te.compute((rows, cols), lambda i, j: E[i, j] / S[i], name="O")
    s = te.create_schedule(O.op)
    tx = te.thread_axis("threadIdx.x")
    s[E].compute_inline()
    s[O].bind(O.op.axis[0], te.thread_axis("blockIdx.x"))
    jo, ji = s[O].split(O.op.axis[1], factor=nthread)  # consecutive threads, consecutive columns
    s[O].bind(ji, tx)
    for R in (M, S):
        _, ki = s[R].split(R.op.reduce_axis[0], factor=nthread)
        s[R].bind(ki, tx)
        s[R].compute_at(s[O], O.op.axis[0])
        s[R].set_store_predicate(tx.var.equal(0))
    return s, [A, O]


def topi(rows: int, cols: int) -> tuple[Any, list[Any]]:
    A = te.placeholder((rows, cols), name="A")
    k1 = te.reduce_axis((0, cols), "k1")
    k2 = te.reduce_axis((0, cols), "k2")
    max_elem = te.compute((rows,), lambda i: te.max(A[i, k1], axis=k1), name="max_elem")
    expv = te.compute((rows, cols), lambda i, j: te.exp(A[i, j] - max_elem[i]), name="exp")
    expsum = te.compute((rows,), lambda i: te.sum(expv[i, k2], axis=k2), name="expsum")
    softmax = te.compute((rows, cols), lambda i, j: expv[i, j] / expsum[i], name="softmax")
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


def _report(f: Any, arch: str) -> None:
    res = f.resources
    if res is None:
        print(f"  ptxas: not run ({f['softmax'].resources_why})")
        return
    launches = f["softmax"].launch
    multi = isinstance(res, dict)
    for name, r in (res.items() if multi else [("softmax", res)]):
        launch = launches[name] if multi else launches
        threads = 1
        for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            threads *= int(launch.get(tag, 1))
        lim = f.target.gpu
        print(f"  ptxas {arch} {name}: {r.registers} registers x {threads} threads = "
              f"{r.registers * threads} of {lim.registers_per_sm} per SM; spills "
              f"{r.spill_stores}/{r.spill_loads} B; shared {r.shared_bytes} B of {lim.static_smem}; "
              f"stack {r.stack_frame} B")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--threads", type=int, default=256, help="threads per row (one-kernel)")
    p.add_argument("--arch", default="sm_80")
    p.add_argument("--emulate-rows", type=int, default=4, help="rows emulated on the CPU (0: skip)")
    p.add_argument("--repeat", type=int, default=20)
    ns = p.parse_args()
    target = f"cuda -arch={ns.arch}"
    schedules = {"one-kernel": lambda r: one_kernel(r, ns.cols, ns.threads),
                 "topi": lambda r: topi(r, ns.cols)}
    built = {}
    for name, make in schedules.items():
        s, args = make(ns.rows)
        f = tc.build(s, args, target=target, name="softmax")
        built[name] = f
        print(f"{name}: softmax {ns.rows} x {ns.cols} for {target}")
        _report(f, ns.arch)
        if ns.emulate_rows:
            se, ae = make(ns.emulate_rows)
            fe = tc.build(se, ae, target=target, name="softmax")
            a = np.random.default_rng(0).standard_normal((ns.emulate_rows, ns.cols), dtype=np.float32)
            o = np.zeros_like(a)
            t0 = time.perf_counter()
            fe.emulate(a, o)
            dt = time.perf_counter() - t0
            e = np.exp(a - a.max(1, keepdims=True))
            err = float(np.max(np.abs(o - e / e.sum(1, keepdims=True))))
            print(f"  emulated {ns.emulate_rows} x {ns.cols} on the CPU in {dt:.2f} s (race "
                  f"detector on); max abs error vs numpy {err:.1e}")

    from tecomp.runtime.cuda import cuda_available

    ok, why = cuda_available()
    if not ok:
        print(f"no GPU: skipped ({why})")
        return
    import torch

    dev = torch.device("cuda")
    a_t = torch.randn(ns.rows, ns.cols, device=dev)
    o_t = torch.empty_like(a_t)
    nbytes = 2 * a_t.numel() * 4
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.softmax(a_t, dim=1)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(ns.repeat):
            torch.softmax(a_t, dim=1)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / ns.repeat)
    t_torch = float(np.median(times))
    print(f"torch.softmax: {nbytes / t_torch / 1e9:.1f} GB/s")
    for name, f in built.items():
        f(a_t, o_t)
        torch.testing.assert_close(o_t, torch.softmax(a_t, dim=1), rtol=1e-4, atol=1e-6)
        t = f.time_evaluator(number=ns.repeat, repeat=3)(a_t, o_t).median
        print(f"{name}: {nbytes / t / 1e9:.1f} GB/s = {t_torch / t:.2f}x torch.softmax")


if __name__ == "__main__":
    main()
