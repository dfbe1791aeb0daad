"""The user flow of docs/design.md / README.md, verbatim, against numpy."""

from __future__ import annotations

import numpy as np

import tecomp as tc
from tecomp import te
from tecomp.codegen.target import Target


def test_design_flow():
    n = te.var("n")
    A = te.placeholder((n, 1024), "float32", name="A")
    B = te.placeholder((1024, 512), "float32", name="B")
    k = te.reduce_axis((0, 1024), name="k")
    C = te.compute((n, 512), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 32, 64)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=8)
    s[C].reorder(io, jo, ko, ki, ii, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)

    text = str(tc.lower(s, [A, B, C]))
    assert text.startswith("def main(A: float32[n, 1024], B: float32[1024, 512], C: float32[n, 512]):")
    assert "parallel" in text and "ramp(" in text
    f = tc.build(s, [A, B, C], target="llvm", name="matmul")
    rng = np.random.default_rng(0)
    for rows in (256, 45):  # n is bound from a.shape; 45 is not a multiple of the 32-row tile
        a = rng.random((rows, 1024), dtype=np.float32)
        b = rng.random((1024, 512), dtype=np.float32)
        c = np.empty((rows, 512), "float32")
        f(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4)
    res = f.time_evaluator(number=2, repeat=3)(a, b, c)
    assert len(res.results) == 3 and res.median > 0 and res.mean > 0
    reg = {128: "xmm", 256: "ymm", 512: "zmm"}[Target.host().vector_bits]
    assert f"%{reg}" in f.get_source("asm")  # AVX-512 host: zmm FMAs; AVX2: ymm
    assert "define" in f.get_source("ll")
