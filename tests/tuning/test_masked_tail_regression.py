"""A tuning candidate that compiled to a wrong depthwise convolution (MobileNet-V2's 192@28,
found by the suite's correctness check, 2026-11-25): its padded input tile is copied by
16-lane vectors of which 9 are in the tile, and the last tile's copy masks lane 8 (the
padding column) by a row condition and the tile's edge. LLVM 22's x86 backend loaded that
lane from memory instead of taking the masked load's pass-through zero; tecomp's codegen
now zeroes masked-off lanes with a select on the frozen load (`codegen.memory`)."""

from __future__ import annotations

import numpy as np

import tecomp as tc
import tuning
from tuning import workloads
from tuning.steps import steps_from_json

STEPS = [
    {"kind": "compute_inline", "stage": "pad"},
    {"kind": "cache_write", "stage": "dwconv", "scope": "local"},
    {"kind": "cache_read", "stage": "pad", "scope": "global", "readers": ["dwconv.local"]},
    {"kind": "split", "stage": "dwconv", "axis": 0, "factors": [1, 1]},
    {"kind": "split", "stage": "dwconv", "axis": 3, "factors": [1, 24]},
    {"kind": "split", "stage": "dwconv", "axis": 6, "factors": [2, 14]},
    {"kind": "split", "stage": "dwconv", "axis": 9, "factors": [7, 1]},
    {"kind": "reorder", "stage": "dwconv", "order": [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]},
    {"kind": "fuse", "stage": "dwconv", "axes": [0, 1]},
    {"kind": "annotate", "stage": "dwconv", "axis": 0, "annotation": "parallel"},
    {"kind": "compute_at", "stage": "dwconv.local", "target": "dwconv", "target_axis": 2},
    {"kind": "compute_at", "stage": "pad.global", "target": "dwconv", "target_axis": 2},
    {"kind": "split", "stage": "pad.global", "axis": 3, "factors": [16]},
    {"kind": "annotate", "stage": "pad.global", "axis": 4, "annotation": "vectorize"},
    {"kind": "split", "stage": "dwconv.local", "axis": 0, "factors": [1]},
    {"kind": "split", "stage": "dwconv.local", "axis": 2, "factors": [8]},
    {"kind": "split", "stage": "dwconv.local", "axis": 4, "factors": [14]},
    {"kind": "split", "stage": "dwconv.local", "axis": 6, "factors": [1]},
    {"kind": "split", "stage": "dwconv.local", "axis": 8, "factors": [1]},
    {"kind": "split", "stage": "dwconv.local", "axis": 10, "factors": [3]},
    {"kind": "reorder", "stage": "dwconv.local", "order": [8, 10, 0, 2, 4, 6, 9, 11, 1, 3, 5, 7]},
    {"kind": "pragma", "stage": "dwconv.local", "axis": 0, "key": "auto_unroll_max_step", "value": 512},
]


def test_the_padded_tile_of_a_depthwise_candidate_is_zero_past_the_edge() -> None:
    task = tuning.SearchTask(workloads.depthwise_conv2d, (1, 192, 28, 28, 3, 3, 1, 1))
    s, args = task.apply_steps(steps_from_json(STEPS))
    f = tc.build(s, args)
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (1, 192, 28, 28)).astype("float32")
    kernel = rng.uniform(-1, 1, (192, 3, 3)).astype("float32")
    out = np.zeros((1, 192, 28, 28), "float32")
    f(data, kernel, out)
    pad = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(pad[:, :, dy:dy + 28, dx:dx + 28] * kernel[None, :, dy, dx, None, None]
              for dy in range(3) for dx in range(3))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
