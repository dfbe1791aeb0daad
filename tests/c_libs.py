"""Small C libraries the tests compile with gcc and load into the process (extern calls)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import tecomp as tc

# row-major C[n, m] = A[n, l] * B[l, m], A and C with leading dimensions (BLAS's lda/ldc, in
# elements; int64 like the kernels' dims and strides)
SGEMM_C = r"""
#include <stdint.h>
int32_t tc_test_sgemm(const float* a, const float* b, float* c, int32_t n, int32_t l,
                      int32_t m, int64_t lda, int64_t ldc) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      float s = 0.0f;
      for (int k = 0; k < l; ++k) s += a[i * lda + k] * b[k * m + j];
      c[i * ldc + j] = s;
    }
  return 0;
}
"""


def build_c_library(tmp_path_factory: pytest.TempPathFactory, source: str, name: str) -> str:
    """Compile ``source`` into ``lib<name>.so`` with gcc, load it for kernels' extern calls
    (`tc.load_extern_library`) and return its path; skips the test without gcc."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp(name)
    src, lib = d / f"{name}.c", d / f"lib{name}.so"
    src.write_text(source)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    tc.load_extern_library(str(lib))
    return str(lib)


def load_numpy_openblas() -> str:
    """Load numpy's bundled scipy-openblas64 (its ILP64 ``scipy_cblas_sgemm64_``) for extern
    calls and return its path; skips the test when numpy ships none."""
    import glob
    import os

    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs",
                                  "libscipy_openblas64_*.so"))
    if not libs:
        pytest.skip("numpy has no bundled scipy-openblas64")
    tc.load_extern_library(libs[0])
    return libs[0]
