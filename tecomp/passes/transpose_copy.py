"""Move transposed copies through registers in 8 x 8 blocks.

A copy nest whose store runs along one loop and whose load runs along another -- the write-back
of a layout-rewritten convolution, ``conv[f, y, x] = conv_local[y, x, f]``, with pixels
contiguous in the output and channels in the accumulator -- compiles to one scalar load and
one scalar store per element: nothing can be vectorized along either loop without a gather or a
scatter. Here such a nest is tiled 8 x 8 over the two loops: 8 vector loads along the load's
contiguous loop, a 24-shuffle transpose in registers (unpack, shuffle and lane permute, the
usual AVX 8 x 8 transpose), 8 vector stores along the store's contiguous loop. The stem of
ResNet-50 spent 0.14 of its 1.47 ms in that copy.

Which nests: a perfect nest of serial loops (constant extents, starting at 0) around one store
whose value is a load of another buffer with the same 4-byte element type, both indices affine
in the loops; one loop is stride 1 in the store, another stride 1 in the load, each at least 8
iterations; and the store's index never repeats (its strides, sorted, each exceed the span of
the smaller ones), so the copy's iterations are independent and may run in any order. Where
the two loops are not multiples of 8, the leftover rows and columns are one more block each,
overlapping the last whole one (it stores some elements twice, with the same value). Loops
that together walk one contiguous run on both sides (the rows of a 7 x 7 tile, stored 7 apart
and loaded 7 x 160 apart) are merged into one first (`_merge`). A local
source of at most `SMALL_LOCAL` elements is left alone.

Runs on CPU IR after flattening and storage rewrite (indices are one affine expression per
access, loops final), before the last simplification, which tidies the block indices built
here; GPU kernels do not use it.
"""

from __future__ import annotations

import dataclasses
import math

from ..arith.simplify import Simplifier
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Expr, IntImm, Ramp, Shuffle, Var, const
from ..ir.functor import StmtMutator, free_vars, substitute
from ..ir.stmt import BufferStore, For, ForKind, LetStmt, PrimFunc, Stmt, seq

BLOCK = 8  # lanes of a 256-bit vector of 4-byte elements
# a local source this small (16 AVX2 registers) is left to LLVM: it unrolls such a copy and
# vectorizes it itself, and vector reads of the whole buffer let it promote the buffer to
# registers, live across the loops that fill it, which then spill (MobileNet-V2's pw
# 24->144@56 with a 2 x 8 x 8 accumulator: 0.19 -> 0.23 ms)
SMALL_LOCAL = 16 * BLOCK

# the three steps of an 8 x 8 transpose, as shufflevector lane lists over two 8-lane inputs
_UNPACK = ((0, 8, 1, 9, 4, 12, 5, 13), (2, 10, 3, 11, 6, 14, 7, 15))  # unpcklps / unpckhps
_PAIRS = ((0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15))  # shufps 0x44 / 0xEE
_HALVES = ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))  # vperm2f128 0x20 / 0x31


@dataclasses.dataclass(eq=False)  # by identity: a Var's == builds an expression
class _Dim:
    """One loop of the copy nest as the rewrite sees it: a loop of the nest, or several of
    them merged into one (`_merge`: ``loop`` None)."""

    var: Var
    extent: int
    loop: For | None


@dataclasses.dataclass
class _Copy:
    dims: list[_Dim]  # the nest, outermost first
    store: BufferStore
    src: Buffer
    sbase: Expr  # store index with every loop variable at 0
    lbase: Expr
    scoef: dict[Var, int]  # each dimension's stride in the store index
    lcoef: dict[Var, int]
    p: _Dim  # stride 1 in the load: the dimension a vector load runs along
    q: _Dim  # stride 1 in the store


def _affine(s: Simplifier, e: Expr, loop_vars: list[Var]) -> tuple[Expr, dict[Var, int]] | None:
    """``e`` as ``base + sum c_v * v`` over ``loop_vars`` with constant ``c_v`` and a base
    free of them; None when it is not."""
    terms, k = s.linear(e)
    coef: dict[Var, int] = {v: 0 for v in loop_vars}
    rest: list[tuple[Expr, int]] = []
    for t, c in terms.values():
        if isinstance(t, Var) and t in coef:
            coef[t] += c
        elif free_vars(t) & set(loop_vars):
            return None  # a loop variable under a division, a product of two...
        else:
            rest.append((t, c))
    return s.rebuild(rest, k, e.dtype), coef


def _injective(coef: dict[Var, int], extents: dict[Var, int]) -> bool:
    """Every iteration stores to its own element: the strides, sorted by size, each exceed
    the span the smaller ones cover (a mixed-radix number)."""
    span = 0
    for v in sorted(coef, key=lambda v: abs(coef[v])):
        if extents[v] == 1:
            continue
        if abs(coef[v]) <= span:
            return False
        span += abs(coef[v]) * (extents[v] - 1)
    return True


def _merge(dims: list[_Dim], scoef: dict[Var, int], lcoef: dict[Var, int]) -> list[_Dim]:
    """Merge two dimensions into one wherever the outer one's strides are the inner one's
    times its extent, in the store and in the load alike (``a * sb * eb + b * sb`` is
    ``(a * eb + b) * sb``): the same elements in another order, which a copy of independent
    iterations allows. A 7 x 7 write-back, ``conv[f, y, x] = acc[y, x, f]`` over whole rows,
    is then one run of 49 contiguous pixels: a loop long enough for 8-lane blocks, where
    rows of 7 had none. ``scoef`` and ``lcoef`` trade the merged variables for the new one."""
    dims = list(dims)
    merged = True
    while merged:
        merged = False
        for a in dims:
            b = next((b for b in dims if b is not a and a.extent > 1 and b.extent > 1 and scoef[b.var]
                      and scoef[a.var] == scoef[b.var] * b.extent and lcoef[a.var] == lcoef[b.var] * b.extent),
                     None)
            if b is None:
                continue
            v = Var(f"{a.var.name}.{b.var.name}.m", a.var.dtype)
            scoef[v], lcoef[v] = scoef[b.var], lcoef[b.var]
            for old in (a.var, b.var):
                del scoef[old], lcoef[old]
            dims = [_Dim(v, a.extent * b.extent, None) if d is a else d for d in dims if d is not b]
            merged = True
            break
    return dims


def _match(s: For) -> _Copy | None:
    loops: list[For] = []
    node: Stmt = s
    while isinstance(node, For):
        if (node.kind is not ForKind.SERIAL or not isinstance(node.min, IntImm) or node.min.value != 0
                or not isinstance(node.extent, IntImm)):
            return None
        loops.append(node)
        node = node.body
    st = node
    if (len(loops) < 2 or not isinstance(st, BufferStore) or st.predicate is not None
            or len(st.indices) != 1 or not isinstance(st.value, BufferLoad)):
        return None
    ld = st.value
    src, dst = ld.buffer, st.buffer
    if (ld.predicate is not None or len(ld.indices) != 1 or src.data is dst.data
            or dt.lanes(st.indices[0].dtype) != 1 or dt.lanes(ld.dtype) != 1
            or ld.dtype != dst.dtype or dt.itemsize(ld.dtype) != 4):
        return None
    if src.scope != "global" and all(isinstance(d, IntImm) for d in src.shape) \
            and math.prod(d.value for d in src.shape) <= SMALL_LOCAL:  # type: ignore[attr-defined]
        return None
    lv = [f.var for f in loops]
    simp = Simplifier()
    sa, la = _affine(simp, st.indices[0], lv), _affine(simp, ld.indices[0], lv)
    if sa is None or la is None:
        return None
    (sbase, scoef), (lbase, lcoef) = sa, la
    dims = [_Dim(f.var, f.extent.value, f) for f in loops]  # type: ignore[attr-defined]
    if not _injective(scoef, {d.var: d.extent for d in dims}):
        return None
    dims = _merge(dims, scoef, lcoef)
    q = next((d for d in dims if scoef[d.var] == 1 and d.extent >= BLOCK), None)
    p = next((d for d in dims if lcoef[d.var] == 1 and d.extent >= BLOCK and d is not q), None)
    if p is None or q is None or lcoef[q.var] == 1 or scoef[p.var] == 1:
        return None  # no transpose: some loop is contiguous on both sides, or too short
    return _Copy(dims, st, src, sbase, lbase, scoef, lcoef, p, q)


def _index(base: Expr, coef: dict[Var, int], at: dict[Var, Expr]) -> Expr:
    e = base
    for v, c in coef.items():
        if c:
            e = e + at[v] * c
    return e


def _block(c: _Copy, at: dict[Var, Expr]) -> Stmt:
    """One 8 x 8 block at ``at`` (p and q at the block's first row and column): load 8 vectors
    along p (one per q), transpose, store 8 vectors along q (one per p)."""
    p, q = c.p.var, c.q.var
    rows: list[Expr] = []
    lets: list[tuple[Var, Expr]] = []

    def bind(name: str, e: Expr) -> Var:
        v = Var(name, e.dtype)
        lets.append((v, e))
        return v

    for k in range(BLOCK):
        idx = _index(c.lbase, c.lcoef, {**at, q: at[q] + k})
        rows.append(bind(f"tr_row{k}", BufferLoad(c.src, (Ramp(idx, const(1, idx.dtype), BLOCK),))))
    # the transpose of rows[k][l] (element p0 + l, q0 + k) into columns j (element p0 + j,
    # q0 + k in lane k); each step's shuffles bound to variables: one instruction each
    t = [bind(f"tr_t{i}", Shuffle((rows[i // 2 * 2], rows[i // 2 * 2 + 1]), _UNPACK[i % 2]))
         for i in range(BLOCK)]
    u = [bind(f"tr_u{i}", Shuffle((t[i // 4 * 4 + i % 4 // 2], t[i // 4 * 4 + i % 4 // 2 + 2]), _PAIRS[i % 2]))
         for i in range(BLOCK)]
    stores: list[Stmt] = []
    for j in range(BLOCK):
        col = Shuffle((u[j % 4], u[j % 4 + 4]), _HALVES[j // 4])
        idx = _index(c.sbase, c.scoef, {**at, p: at[p] + j})
        stores.append(BufferStore(c.store.buffer, col, (Ramp(idx, const(1, idx.dtype), BLOCK),)))
    body = seq(*stores)
    for v, e in reversed(lets):
        body = LetStmt(v, e, body)
    return body


def _loop(var: Var, start: int, extent: int, body: Stmt) -> Stmt:
    """``for var in [start, start + extent)`` (nothing when empty, the body when one)."""
    if extent <= 0:
        return seq()
    if extent == 1:
        return substitute(body, {var: const(start, var.dtype)})
    return For(var, const(start, var.dtype), const(extent, var.dtype), ForKind.SERIAL, body)


def _rewrite(c: _Copy) -> Stmt:
    p, q = c.p.var, c.q.var
    ep, eq = c.p.extent, c.q.extent
    pb, qb = Var(p.name + ".b8", p.dtype), Var(q.name + ".b8", q.dtype)
    at: dict[Var, Expr] = {d.var: d.var for d in c.dims}

    def block_at(p0: Expr, q0: Expr) -> Stmt:
        return _block(c, {**at, p: p0, q: q0})

    blocks = [_loop(pb, 0, ep // BLOCK, _loop(qb, 0, eq // BLOCK, block_at(pb * BLOCK, qb * BLOCK)))]
    # leftovers: one more block that ends at the last row or column and overlaps the one
    # before it (both extents are at least 8). Its overlap stores the same values again,
    # which is harmless: every element is stored once per block that covers it, always from
    # the same source element, and nothing here writes the source. The scalar loops these
    # replace copied a 14-pixel row's last 6 columns one element at a time: 3/7 of the
    # write-back of MobileNet-V2's 14 x 14 pointwise layers
    if eq % BLOCK:
        blocks.append(_loop(pb, 0, ep // BLOCK, block_at(pb * BLOCK, const(eq - BLOCK, q.dtype))))
    if ep % BLOCK:
        blocks.append(_loop(qb, 0, eq // BLOCK, block_at(const(ep - BLOCK, p.dtype), qb * BLOCK)))
    if ep % BLOCK and eq % BLOCK:
        blocks.append(block_at(const(ep - BLOCK, p.dtype), const(eq - BLOCK, q.dtype)))
    body = seq(*blocks)
    for d in reversed(c.dims):
        if d is not c.p and d is not c.q:
            f = d.loop
            body = (For(f.var, f.min, f.extent, f.kind, body, f.annotations) if f is not None
                    else _loop(d.var, 0, d.extent, body))
    return body


class _TransposeCopies(StmtMutator):
    def visit_For(self, s: For) -> Stmt:  # type: ignore[override]
        c = _match(s)
        if c is not None:
            return _rewrite(c)
        return super().visit_For(s)


def transpose_copy(func: PrimFunc) -> PrimFunc:
    body = _TransposeCopies().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)
