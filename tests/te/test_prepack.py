"""hoist_layout: a layout copy of an input taken out of the kernel as a pre-transform run once
(the packed weight becomes the kernel's argument)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
from tecomp import te
from tecomp.errors import ScheduleError
from tecomp.te.layout import cache_read_layout, cache_write_layout, hoist_layout, pack_at_root, tile_block


def _conv(args: tuple[int, ...]) -> tuple[te.Tensor, te.Tensor, te.Tensor, te.Tensor]:
    n, ci, h, w, co, kh, kw, stride, pad = args
    data = te.placeholder((n, ci, h, w), "float32", name="data")
    kernel = te.placeholder((co, ci, kh, kw), "float32", name="kernel")
    padded = te.compute(
        (n, ci, h + 2 * pad, w + 2 * pad),
        lambda b, c, y, x: te.if_then_else(te.all(y >= pad, y < h + pad, x >= pad, x < w + pad),
                                           data[b, c, y - pad, x - pad], 0.0), name="pad")
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    rc, ry, rx = (te.reduce_axis((0, e), name=nm) for nm, e in (("rc", ci), ("ry", kh), ("rx", kw)))
    out = te.compute((n, co, oh, ow), lambda b, f, y, x: te.sum(
        padded[b, rc, y * stride + ry, x * stride + rx] * kernel[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv")
    return data, kernel, padded, out


def _relayout(args: tuple[int, ...]) -> tuple[te.Schedule, te.Tensor, te.Tensor, te.Tensor, te.Tensor]:
    """The relayout schedule by hand: accumulator NHWC, weight packed [CI, KH, KW, CO] and
    copied per output-channel tile (compute_at), vector over output channels."""
    data, kernel, padded, out = _conv(args)
    s = te.create_schedule(out.op)
    s[padded].compute_inline()
    acc = cache_write_layout(s, out, "local", (0, 2, 3, 1))
    packed = cache_read_layout(s, kernel, "pack", [acc], (1, 2, 3, 0))
    _, _, _, f = s[acc].op.axis  # type: ignore[attr-defined]
    fo, fi = s[acc].split(f, factor=8)
    s[acc].vectorize(fi)
    s[packed].compute_at(s[acc], fo)
    return s, data, kernel, packed, out


def _arrays(args: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n, ci, h, w, co, kh, kw, _, _ = args
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, ci, h, w)).astype("float32"),
            rng.standard_normal((co, ci, kh, kw)).astype("float32"))


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("args", [(1, 8, 9, 9, 16, 3, 3, 1, 1), (1, 8, 9, 9, 16, 3, 3, 2, 1),
                                  (2, 4, 7, 7, 8, 3, 3, 1, 0), (1, 8, 8, 8, 16, 1, 1, 1, 0),
                                  (1, 6, 10, 10, 12, 3, 3, 2, 2)])
def test_hoisted_kernel_and_pre_transform_match_numpy(args: tuple[int, ...], blocked: bool) -> None:
    _, ci, _, _, co, kh, kw, _, _ = args
    s, data, kernel, packed, out = _relayout(args)
    # the copy is computed per tile of 8 output channels: blocked, the packed array holds each
    # tile's weights together, [CO/8, CI, KH, KW, 8] (not for 12 channels: a tile of 8 does
    # not divide them, nor for 8: one tile is the whole)
    tiled = co > 8 and co % 8 == 0
    block = tile_block(s, packed)
    assert block == (None, None, None, 8 if tiled else None)
    h = hoist_layout(s, packed, block if blocked else None)
    assert h.order == (1, 2, 3, 0) and h.source.op is kernel.op and h.packed.name == "kernel_pack"
    shape = [int(d.value) for d in h.packed.shape]  # type: ignore[attr-defined]
    assert shape == ([co // 8, ci, kh, kw, 8] if blocked and tiled else [ci, kh, kw, co])
    # the kernel no longer reads the plain weight: nothing but the pre-transform copies it
    text = str(tc.lower(s, [data, h.packed, out]))
    assert "kernel[" not in text and "kernel_pack[ramp(" in text, text
    x, w = _arrays(args)
    fpack = tc.build(h.schedule, h.args, name=h.name)
    wp = np.full(shape, np.nan, np.float32)
    fpack(w, wp)
    plain = w.transpose(1, 2, 3, 0)
    np.testing.assert_array_equal(wp, plain.reshape(ci, kh, kw, co // 8, 8).transpose(3, 0, 1, 2, 4)
                                  if len(shape) == 5 else plain)
    np.testing.assert_array_equal(wp, h.numpy(w))
    want = numpy_conv(x, w, args[7], args[8])
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(s, [data, h.packed, out])(x, wp, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args", [(1, 8, 9, 9, 16, 3, 3, 1, 1), (1, 6, 10, 10, 12, 3, 3, 2, 2),
                                  (1, 8, 8, 8, 16, 1, 1, 1, 0)])
def test_pack_at_root_copies_once_in_the_tile_layout(args: tuple[int, ...]) -> None:
    _, ci, _, _, co, kh, kw, _, _ = args
    s, data, kernel, packed, out = _relayout(args)
    tiled = co > 8 and co % 8 == 0
    t = pack_at_root(s, packed, tile_block(s, packed))
    assert t.name == "kernel_pack" and s[t].attach_type == "root"
    shape = [int(d.value) for d in t.shape]  # type: ignore[attr-defined]
    assert shape == ([co // 8, ci, kh, kw, 8] if tiled else [ci, kh, kw, co])
    # the kernel still takes the plain weight; the copy is one loop nest of its own, before
    # the convolution's, storing whole vectors
    text = str(tc.lower(s, [data, kernel, out]))
    assert text.count("kernel_pack[ramp(") >= 2 and text.index("kernel_pack[") < text.index("conv_local["), text
    x, w = _arrays(args)
    want = numpy_conv(x, w, args[7], args[8])
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(s, [data, kernel, out])(x, w, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_pack_at_root_refuses_what_hoist_refuses() -> None:
    data, kernel, padded, out = _conv((1, 4, 6, 6, 8, 3, 3, 1, 1))
    s = te.create_schedule(out.op)
    with pytest.raises(ScheduleError, match=r"pack_at_root: stage conv is an output"):
        pack_at_root(s, "conv")
    with pytest.raises(ScheduleError, match=r"no stage named 'nope'"):
        pack_at_root(s, "nope")


def test_hoist_by_stage_name_and_identity_copy() -> None:
    # a plain cache_read (identity order) hoists too; the stage is named as steps name it
    A = te.placeholder((6, 5), "float32", name="A")
    B = te.placeholder((5, 7), "float32", name="B")
    r = te.reduce_axis((0, 5), name="r")
    C = te.compute((6, 7), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    s.cache_read(B, "global", [C])
    h = hoist_layout(s, "B.global")
    assert h.order == (0, 1) and h.packed.name == "B_global"
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 5)).astype("float32"), rng.standard_normal((5, 7)).astype("float32")
    bp = np.empty((5, 7), "float32")
    tc.build(h.schedule, h.args)(b, bp)
    c = np.empty((6, 7), "float32")
    tc.build(s, [A, h.packed, C])(a, bp, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_hoist_refuses_what_is_not_a_plain_copy_of_an_input() -> None:
    args = (1, 4, 6, 6, 8, 3, 3, 1, 1)
    # a copy of a computed tensor (the padded input), not of a placeholder
    data, kernel, padded, out = _conv(args)
    s = te.create_schedule(out.op)
    pp = cache_read_layout(s, padded, "pack", [out], (0, 2, 3, 1))
    with pytest.raises(ScheduleError, match=r"stage pad\.pack copies pad, which is computed"):
        hoist_layout(s, pp)
    # a compute stage that is not a copy (the padding selects), and a reduction
    with pytest.raises(ScheduleError, match=r"stage pad is not a plain permuted copy of an input: "
                                            r"its body is .*, not a load"):
        hoist_layout(te.create_schedule(out.op), "pad")
    cs = te.create_schedule(out.op)
    with pytest.raises(ScheduleError, match=r"stage conv.local is not a plain copy \(it reduces"):
        hoist_layout(cs, cache_write_layout(cs, out, "local", (0, 2, 3, 1)))
    # an input itself, and a name the schedule does not have
    with pytest.raises(ScheduleError, match=r"stage kernel is a PlaceholderOp"):
        hoist_layout(te.create_schedule(out.op), kernel)
    with pytest.raises(ScheduleError, match=r"no stage named 'kernel\.pack'"):
        hoist_layout(te.create_schedule(out.op), "kernel.pack")
    # a stage that reads an input at computed indices (a shifted copy, not a permutation)
    W = te.placeholder((8, 4), "float32", name="W")
    shifted = te.compute((7, 4), lambda i, j: W[i + 1, j], name="shifted")
    use = te.compute((7, 4), lambda i, j: shifted[i, j] * 2.0, name="use")
    with pytest.raises(ScheduleError, match=r"stage shifted is not a plain permuted copy of W: "
                                            r"it reads W at i \+ 1, j"):
        hoist_layout(te.create_schedule(use.op), "shifted")
    # an output of the schedule
    copy = te.compute((4, 8), lambda i, j: W[j, i], name="copy")
    with pytest.raises(ScheduleError, match=r"stage copy is an output"):
        hoist_layout(te.create_schedule(copy.op), copy)
    # blocks that do not divide the copy, or do not match its dimensions
    s2, _, _, packed, _ = _relayout((1, 4, 6, 6, 16, 3, 3, 1, 1))
    with pytest.raises(ScheduleError, match=r"block \(None, None, None, 6\) does not divide the "
                                            r"copy's shape \(4, 3, 3, 16\) \(dimension 3\)"):
        hoist_layout(s2, packed, (None, None, None, 6))
    with pytest.raises(ScheduleError, match=r"has 2 entries for a copy of 4 dimensions"):
        hoist_layout(s2, packed, (4, 8))


def test_plain_input_still_read_elsewhere_stays_an_argument() -> None:
    # B is packed for C but D reads B too: the kernel takes both arrays
    A = te.placeholder((6, 5), "float32", name="A")
    B = te.placeholder((7, 5), "float32", name="B")
    r = te.reduce_axis((0, 5), name="r")
    C = te.compute((6, 7), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
    D = te.compute((6, 7), lambda i, j: C[i, j] + B[j, 0], name="D")
    s = te.create_schedule(D.op)
    bp = cache_read_layout(s, B, "pack", [C], (1, 0))
    h = hoist_layout(s, bp)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((6, 5)).astype("float32"), rng.standard_normal((7, 5)).astype("float32")
    d = np.empty((6, 7), "float32")
    tc.build(s, [A, B, h.packed, D])(a, b, h.numpy(b), d)
    np.testing.assert_allclose(d, a @ b.T + b[:, 0], rtol=1e-5, atol=1e-5)
    with pytest.raises(tc.LoweringError, match="placeholder B is read but not passed"):
        tc.lower(s, [A, h.packed, D])


def test_kernel_and_pre_transform_export_in_one_library(tmp_path: Path) -> None:
    args = (1, 8, 9, 9, 16, 3, 3, 2, 1)
    s, data, _, packed, out = _relayout(args)
    h = hoist_layout(s, packed, tile_block(s, packed))
    mod = tc.build([(s, [data, h.packed, out], "conv"), (h.schedule, h.args, "conv_pack_kernel")])
    files = mod.export_library(str(tmp_path / "conv.so"))
    lib = tc.runtime.load_module(files.library)
    x, w = _arrays(args, 7)
    wp = np.empty((2, 8, 3, 3, 8), "float32")
    lib["conv_pack_kernel"](w, wp)
    want = numpy_conv(x, w, 2, 1)
    got = np.full(want.shape, np.nan, np.float32)
    lib["conv"](x, wp, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_pre_transform_reads_eight_rows_at_a_time() -> None:
    """Unblocked too, the pack's outermost loop walks blocks of 8 output channels, each row
    then read along its length (one float of every row per step was 7x slower on a 1x1
    weight), and every store is one vector."""
    args = (1, 64, 4, 4, 32, 1, 1, 1, 0)
    s, data, kernel, packed, out = _relayout(args)
    h = hoist_layout(s, packed, None)
    text = str(tc.lower(h.schedule, h.args))
    loops = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("for ")]
    assert loops[0].startswith("for i3.outer in range(4)"), text
    assert "kernel_pack[ramp(" in text
    w = _arrays(args)[1]
    wp = np.empty(h.shape, "float32")
    tc.build(h.schedule, h.args)(w, wp)
    np.testing.assert_array_equal(wp, w.transpose(1, 2, 3, 0))
