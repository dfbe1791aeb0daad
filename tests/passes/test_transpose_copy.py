"""The transposed-copy pass (`tecomp.passes.transpose_copy`): 8 x 8 blocks through registers,
checked against numpy when compiled and when interpreted, and left alone where it must not fire."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.ir import expr as E  # noqa: N812
from tecomp.runtime import interp


def _transpose(rows: int, cols: int, dtype: str = "float32"):  # type: ignore[no-untyped-def]
    A = te.placeholder((rows, cols), dtype, name="A")
    B = te.compute((cols, rows), lambda j, i: A[i, j], name="B")
    return te.create_schedule(B.op), [A, B]


def _shuffles(func: object) -> int:
    return str(func).count("shuffle(")


@pytest.mark.parametrize("rows,cols", [(8, 8), (64, 40), (28, 20), (13, 30), (9, 8)])
def test_transpose_matches_numpy(rows: int, cols: int) -> None:
    s, args = _transpose(rows, cols)
    func = tc.lower(s, args)
    # a block body has 16 shuffles bound and 8 stored; a leftover row or column block (an
    # extent not a multiple of 8) is one more body each, and their corner one more
    assert _shuffles(func) == 24 * (1 + (rows % 8 > 0)) * (1 + (cols % 8 > 0))
    assert re.search(r"\bB\[(?!ramp)", str(func)) is None  # no scalar store left
    a = np.random.default_rng(0).standard_normal((rows, cols)).astype("float32")
    b = np.zeros((cols, rows), "float32")
    tc.build(s, args)(a, b)
    np.testing.assert_array_equal(b, a.T)
    c = np.zeros((cols, rows), "float32")
    interp.run(func, a, c)  # the shuffles' semantics, independently of LLVM
    np.testing.assert_array_equal(c, a.T)


def test_conv_write_back_is_blocked() -> None:
    """``out[f, y, x] = acc[y, x, f]`` in that loop order: the two loops are not adjacent (y
    between them); whole rows of y and x are one contiguous run on both sides, merged into
    one loop of 4 x 28 pixels (14 blocks, no leftover columns)."""
    acc = te.placeholder((4, 28, 32), "float32", name="acc")
    out = te.compute((32, 4, 28), lambda f, y, x: acc[y, x, f], name="out")
    s = te.create_schedule(out.op)
    func = tc.lower(s, [acc, out])
    assert _shuffles(func) == 24 and "y.x.m.b8 in range(14)" in str(func)
    a = np.random.default_rng(1).standard_normal((4, 28, 32)).astype("float32")
    o = np.zeros((32, 4, 28), "float32")
    tc.build(s, [acc, out])(a, o)
    np.testing.assert_array_equal(o, a.transpose(2, 0, 1))


def test_seven_by_seven_write_back_is_blocked() -> None:
    """A 7 x 7 tile's rows are too short for a block, but the 49 pixels are one run: all of
    it moves in blocks (6, and one overlapping the last of them), no scalar store left."""
    acc = te.placeholder((7, 7, 40), "float32", name="acc")
    out = te.compute((40, 7, 7), lambda f, y, x: acc[y, x, f], name="out")
    s = te.create_schedule(out.op)
    func = tc.lower(s, [acc, out])
    assert _shuffles(func) == 24 * 2 and re.search(r"\bout\[(?!ramp)", str(func)) is None
    a = np.random.default_rng(2).standard_normal((7, 7, 40)).astype("float32")
    o = np.zeros((40, 7, 7), "float32")
    tc.build(s, [acc, out])(a, o)
    np.testing.assert_array_equal(o, a.transpose(2, 0, 1))
    o2 = np.zeros((40, 7, 7), "float32")
    interp.run(func, a, o2)
    np.testing.assert_array_equal(o2, a.transpose(2, 0, 1))


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(ny=st.integers(1, 9), nx=st.integers(1, 12), nf=st.integers(1, 20), split=st.integers(1, 8),
       order=st.permutations(range(4)))
def test_random_write_backs(ny: int, nx: int, nf: int, split: int, order: list[int]) -> None:
    """``out[f, y, x] = acc[y, x, f]`` with random extents (rows shorter and longer than a
    block, merged or not), a split of f (tails of every size) and any loop order."""
    acc = te.placeholder((ny, nx, nf), "float32", name="acc")
    out = te.compute((nf, ny, nx), lambda f, y, x: acc[y, x, f], name="out")
    s = te.create_schedule(out.op)
    f, y, x = s[out].op.axis
    fo, fi = s[out].split(f, split)
    s[out].reorder(*[(fo, fi, y, x)[k] for k in order])
    a = np.random.default_rng(ny * 400 + nx * 20 + nf).standard_normal((ny, nx, nf)).astype("float32")
    want = a.transpose(2, 0, 1)
    o = np.zeros((nf, ny, nx), "float32")
    tc.build(s, [acc, out])(a, o)
    np.testing.assert_array_equal(o, want)
    o2 = np.zeros((nf, ny, nx), "float32")
    interp.run(tc.lower(s, [acc, out]), a, o2)
    np.testing.assert_array_equal(o2, want)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), split=st.integers(1, 16), swap=st.booleans())
def test_random_transposes(rows: int, cols: int, split: int, swap: bool) -> None:
    """Random extents, a split of one loop (tails of every size) and either loop order."""
    s, args = _transpose(rows, cols)
    j, i = s[args[1]].op.axis
    io, ii = s[args[1]].split(i, split)
    if swap:
        s[args[1]].reorder(io, ii, j)
    a = np.random.default_rng(rows * 41 + cols).standard_normal((rows, cols)).astype("float32")
    b = np.zeros((cols, rows), "float32")
    tc.build(s, args)(a, b)
    np.testing.assert_array_equal(b, a.T)
    c = np.zeros((cols, rows), "float32")
    interp.run(tc.lower(s, args), a, c)
    np.testing.assert_array_equal(c, a.T)


def test_left_alone_where_it_must_not_fire() -> None:
    # 8-byte elements: no 8-lane 256-bit block
    s, args = _transpose(16, 16, "float64")
    assert _shuffles(tc.lower(s, args)) == 0
    a = np.arange(256, dtype="float64").reshape(16, 16)
    b = np.zeros((16, 16))
    tc.build(s, args)(a, b)
    np.testing.assert_array_equal(b, a.T)
    # a plain copy (contiguous on both sides) is no transpose
    A = te.placeholder((16, 16), "float32", name="A")
    C = te.compute((16, 16), lambda i, j: A[i, j], name="C")
    assert _shuffles(tc.lower(te.create_schedule(C.op), [A, C])) == 0
    # a store whose index repeats (B[i + j]): the order of the iterations matters
    from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, PrimFunc, Var, const
    from tecomp.passes.transpose_copy import transpose_copy

    Ab, Bb = Buffer("A", (const(256),), "float32"), Buffer("B", (const(31),), "float32")
    i, j = Var("i"), Var("j")
    body = For(i, const(0), const(16), ForKind.SERIAL, For(j, const(0), const(16), ForKind.SERIAL,
               BufferStore(Bb, BufferLoad(Ab, (i + j * 16,)), (i + j,))))
    func = PrimFunc("f", [Ab, Bb], body)
    assert transpose_copy(func) is func
    # the same nest storing B[i * 16 + j] is a transpose
    Cb = Buffer("C", (const(256),), "float32")
    body = For(i, const(0), const(16), ForKind.SERIAL, For(j, const(0), const(16), ForKind.SERIAL,
               BufferStore(Cb, BufferLoad(Ab, (i + j * 16,)), (i * 16 + j,))))
    func = PrimFunc("f", [Ab, Cb], body)
    assert _shuffles(transpose_copy(func)) == 24


def test_small_local_source_is_left_to_llvm() -> None:
    """A local source of at most 16 vectors (a small accumulator) is not transposed here: LLVM
    vectorizes that copy itself, and whole-buffer vector reads made it keep the buffer in
    registers across the loops that fill it, which spilled."""
    from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, PrimFunc, Var, const
    from tecomp.passes.transpose_copy import SMALL_LOCAL, transpose_copy

    out = Buffer("out", (const(1024),), "float32")
    i, j = Var("i"), Var("j")
    for n, fires in ((SMALL_LOCAL, False), (2 * SMALL_LOCAL, True)):
        local = Buffer("acc", (const(n),), "float32", scope="local")
        rows = n // 16
        body = For(i, const(0), const(rows), ForKind.SERIAL, For(j, const(0), const(16), ForKind.SERIAL,
                   BufferStore(out, BufferLoad(local, (i + j * rows,)), (i * 16 + j,))))
        func = PrimFunc("f", [out], body)
        assert (_shuffles(transpose_copy(func)) > 0) is fires


def test_shuffle_node_checks_its_operands() -> None:
    v = E.Ramp(E.const(0), E.const(1), 8)
    with pytest.raises(TecompError, match="out of range"):
        E.Shuffle((v, v), (0, 16))
    with pytest.raises(TecompError, match="different types"):
        E.Shuffle((v, E.Broadcast(E.const(1.0), 8)), (0,))
    assert E.Shuffle((v, v), (1, 9, 2)).dtype == "int32x3"


def test_shuffle_of_several_vectors_of_different_widths() -> None:
    """Codegen lays three inputs (8, 4 and 8 lanes) end to end before picking lanes, and one
    input shuffles alone; the interpreter agrees."""
    from tecomp.ir import Buffer, BufferLoad, BufferStore, PrimFunc, const, seq

    A = Buffer("A", (const(32),), "float32")
    B = Buffer("B", (const(16),), "float32")
    ld = [BufferLoad(A, (E.Ramp(const(o), const(1), n),)) for o, n in ((0, 8), (8, 4), (16, 8))]
    pick = (19, 0, 8, 11, 12, 7, 3, 15, 9, 10)
    one = (7, 6, 5, 4, 3, 2)
    body = seq(BufferStore(B, E.Shuffle(tuple(ld), pick), (E.Ramp(const(0), const(1), len(pick)),)),
               BufferStore(B, E.Shuffle((ld[0],), one), (E.Ramp(const(10), const(1), len(one)),)))
    func = PrimFunc("shuf", [A, B], body)
    a = np.arange(32, dtype="float32")
    lanes = np.concatenate([a[0:8], a[8:12], a[16:24]])
    want = np.concatenate([lanes[list(pick)], a[list(one)]])
    b = np.zeros(16, "float32")
    tc.build(func)(a, b)
    np.testing.assert_array_equal(b, want)
    c = np.zeros(16, "float32")
    interp.run(func, a, c)
    np.testing.assert_array_equal(c, want)
