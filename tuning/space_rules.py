"""Rules of the CPU search space that do not need a live schedule: analysis of the compute
DAG (which loads read what, reuse, packable inputs, the layout rewrite of a convolution-like
reduction) and random tile sizes. `tuning.space` builds sketches and candidates from them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from tecomp.errors import TecompError
from tecomp.ir.expr import Call, Expr, FloorDiv, IntImm, ProducerLoad, Reduce, Var
from tecomp.ir.functor import ExprVisitor
from tecomp.te.tensor import ComputeOp, IterVar

MAX_INNERMOST = 64  # an innermost tile beyond this is a huge vector or unrolled body
NON_DIVISOR_PROB = 0.1
VECTOR_TILE_PRIOR = 0.7  # odds that a fresh tile of the vectorizable axis fills whole vectors

# calls costly enough that a stage making them is not inlined into several readers
EXPENSIVE_CALLS = frozenset({"exp", "exp2", "log", "log2", "log10", "tanh", "sigmoid", "erf",
                             "pow", "sin", "cos", "sqrt", "rsqrt"})

# analysis of the DAG --------------------------------------------------------------------------


def readers(stages: Sequence[Any], name: str) -> list[Any]:
    """The compute stages among ``stages`` that read the tensor of operation ``name``."""
    return [st for st in stages
            if isinstance(st.op, ComputeOp) and any(t.op.name == name for t in st.op.input_tensors)]


class _Loads(ExprVisitor):
    def __init__(self) -> None:
        self.loads: list[ProducerLoad] = []
        self.calls: set[str] = set()

    def visit_ProducerLoad(self, e: ProducerLoad) -> None:
        self.loads.append(e)
        super().visit_ProducerLoad(e)

    def visit_Call(self, e: Call) -> None:
        self.calls.add(e.name)
        super().visit_Call(e)


def _scan(exprs: Sequence[Expr]) -> _Loads:
    v = _Loads()
    for e in exprs:
        if isinstance(e, Reduce):
            for x in (*e.source, e.condition):
                v.visit(x)
        else:
            v.visit(e)
    return v


def _vars_in(e: Expr) -> set[Var]:
    out: set[Var] = set()

    class _V(ExprVisitor):
        def visit_Var(self, x: Var) -> None:
            out.add(x)

    _V().visit(e)
    return out


def _extent(iv: IterVar) -> int:
    ext = iv.dom.extent if iv.dom is not None else None
    if not isinstance(ext, IntImm):
        raise TecompError(f"axis {iv.name} needs a constant extent for tuning")
    return ext.value


def _has_reuse(op: ComputeOp, body: Sequence[Expr]) -> bool:
    """Some input is read independently of some spatial axis (so tiles can share it)."""
    spatial = {a.var for a in op.axis}
    for ld in _scan(body).loads:
        used: set[Var] = set()
        for i in ld.indices:
            used |= _vars_in(i)
        if spatial - used:
            return True
    return False


def _packable(op: ComputeOp) -> tuple[str, ...]:
    """Inputs of a tiled reduction worth packing: read directly (not through an inlined stage,
    which cache_read cannot reach), at least 2-D, and with a spatial axis in the last index, so
    a tile of the output reads short pieces of many rows of it (B[r, j] in a GEMM). Copying
    the tile's region into a buffer of its own makes those rows contiguous: the panel packing
    of BLAS libraries, which removes the cache-set and TLB conflicts of a strided panel."""
    spatial = {a.var for a in op.axis}
    out: list[str] = []
    for ld in _scan(op.body).loads:
        name = ld.producer.op.name
        if len(ld.indices) < 2 or name in out or name == op.name:
            continue
        if _vars_in(ld.indices[-1]) & spatial:
            out.append(name)
    return tuple(out)


# tile sizes --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=1024)
def factorizations(extent: int, levels: int, max_inner: int) -> tuple[tuple[int, ...], ...]:
    """All ``levels`` inner factors whose product divides ``extent``, innermost <= max_inner."""
    out: list[tuple[int, ...]] = []

    def rec(rest: int, prefix: tuple[int, ...]) -> None:
        if len(prefix) == levels:
            if prefix[-1] <= max_inner:
                out.append(prefix)
            return
        for d in divisors(rest):
            rec(rest // d, prefix + (d,))

    rec(extent, ())
    return tuple(out)


def sample_tile(extent: int, levels: int, rng: np.random.Generator,
                max_inner: int = MAX_INNERMOST, vector: bool = False) -> tuple[int, ...]:
    """Random inner factors: mostly an exact factorization, sometimes powers of two that
    leave a tail (prime extents need them, and a tail can beat a bad exact factorization).

    ``vector``: the innermost factor may become a vector loop, so most draws take one that
    fills whole registers (a multiple of 8 lanes) when the extent has such factorizations --
    uniform draws mostly give 1-4 lanes, which waste the vector units."""
    if rng.random() < NON_DIVISOR_PROB:
        for _ in range(8):
            f = tuple(int(2 ** rng.integers(0, 7)) for _ in range(levels))
            if f[-1] <= max_inner and math.prod(f) <= extent:
                return f
    facts = factorizations(extent, levels, max_inner)
    if vector and rng.random() < VECTOR_TILE_PRIOR:
        wide = [f for f in facts if f[-1] % 8 == 0]
        if wide:
            return wide[int(rng.integers(len(wide)))]
    return facts[int(rng.integers(len(facts)))]


def mutate_tile(old: tuple[int, ...], extent: int, rng: np.random.Generator,
                max_inner: int = MAX_INNERMOST) -> tuple[int, ...]:
    """Move a prime factor between two tile levels (the outermost level included). A tile
    that does not divide the extent (a GEMM micro-kernel's 6 rows in 1024) has no factors to
    move: it is cut anew (`recut_tile`), keeping its inner tiles."""
    inner = math.prod(old)
    if extent % inner and len(old) >= 2:
        cut = recut_tile(old, extent, rng)
        if cut is not None:
            return cut
    if extent % inner == 0:
        levels = [extent // inner, *old]
        for _ in range(8):
            src = int(rng.integers(len(levels)))
            if levels[src] == 1:
                continue
            primes = [p for p in divisors(levels[src])[1:] if all(p % q for q in range(2, p))]
            p = primes[int(rng.integers(len(primes)))]
            dst = int(rng.integers(len(levels) - 1))
            dst = dst + 1 if dst >= src else dst
            new = list(levels)
            new[src] //= p
            new[dst] *= p
            if new[-1] <= max_inner:
                return tuple(new[1:])
    return sample_tile(extent, len(old), rng, max_inner)


TAIL_BLOCKS_MAX = 8  # a re-cut tile's blocks (`recut_tile`): thread-sized pieces, not many small ones


def recut_tile(old: tuple[int, ...], extent: int, rng: np.random.Generator) -> tuple[int, ...] | None:
    """``old`` with its outermost given level re-cut: the ``u`` tiles of the level below it
    that cover ``extent`` (the last one partial) shared among another number of equal
    blocks, at most `TAIL_BLOCKS_MAX` (the rows of a 6-row GEMM micro-kernel in 1024: 171
    tiles in one block of 171, two of 86, three of 57, ...). This is how a tile with a tail
    mutates: a prime-factor move (`mutate_tile`) needs a tile that divides the extent, and a
    fresh draw would lose the tiles below. None when no other cut exists."""
    below = math.prod(old[1:])
    units = -(-extent // below)
    cuts = sorted(c for c in {-(-units // b) for b in range(1, min(units, TAIL_BLOCKS_MAX) + 1)} - {old[0]}
                  if tile_fits((c, *old[1:]), len(old), extent, old[-1]))
    if not cuts:
        return None
    return (cuts[int(rng.integers(len(cuts)))], *old[1:])


# layout rewrite ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Relayout:
    """The layout rewrite of a convolution-like reduction (TVM's NCHWc, oneDNN's blocked
    layouts, reached by permutation): ``weight`` is copied with its dimensions in the order
    ``weight_order`` (the output-channel dimension last), the reduction accumulates into a
    buffer whose axes are in the order ``out_order`` (the output-channel axis last), and a
    copy puts the result back in the user's layout. The vector then runs over output
    channels: one input element broadcast times a contiguous vector of weights, one FMA per
    element, for any stride, dilation or padding (1x1 included) -- where the plain layout
    vectorizes over output columns and has to gather ``x * stride + rx``.

    ``group``: a grouped convolution (``data[b, f // group * cig + rc, ...]``, ``group`` output
    channels per group): the other inputs read the output-channel axis only through
    ``f // group``, so a vector of output channels within one group reads one broadcast input
    element. Up to `LAYOUT_VECTOR_MAX` channels per group the vector is the whole group; a
    wider group (a multiple of 8) is cut into whole 8-lane vectors that divide it
    (`vector_max`, `draw_register_tile`, `space_grouped.layout_tile`): the simplifier proves
    that every lane of ``ramp(k * v, 1, v) // g`` has one quotient, ``k // (g / v)``, when
    ``v`` divides ``g``, and the input element is one broadcast per vector."""

    weight: str
    weight_order: tuple[int, ...]
    out_order: tuple[int, ...]
    group: int | None = None


MIN_GROUP = 4  # fewer output channels per group: no vector of them is worth the rewrite


def vector_max(rel: Relayout | None) -> int:
    """The widest output-channel tile of a relayout accumulator (the vector loop): a group's
    channels in a grouped convolution, or for a group wider than `LAYOUT_VECTOR_MAX` the
    widest whole 8-lane vectors that divide it (`group_vectors`)."""
    if rel is None or rel.group is None:
        return LAYOUT_VECTOR_MAX
    return max(group_vectors(rel.group))


def group_vectors(group: int) -> tuple[int, ...]:
    """The output-channel vector widths a grouped relayout may use: the group itself up to
    `LAYOUT_VECTOR_MAX` channels, else the multiples of 8 within it that divide it."""
    if group <= LAYOUT_VECTOR_MAX:
        return (group,)
    return tuple(v for v in range(8, LAYOUT_VECTOR_MAX + 1, 8) if group % v == 0)


def _group_reads(ld: ProducerLoad, f: Var) -> set[int] | None:
    """The constants ``c`` of the ``f // c`` through which ``ld`` reads ``f``; None when it
    reads ``f`` otherwise too."""
    found: set[int] = set()
    bare = False

    class _V(ExprVisitor):
        def visit_FloorDiv(self, e: FloorDiv) -> None:
            if e.a is f and isinstance(e.b, IntImm) and e.b.value > 1:
                found.add(e.b.value)
            else:
                super().visit_BinaryOp(e)

        def visit_Var(self, x: Var) -> None:
            nonlocal bare
            bare = bare or x is f

    for i in ld.indices:
        _V().visit(i)
    return None if bare else found


def relayout_rule(op: ComputeOp) -> Relayout | None:
    """The rewrite of `Relayout` for ``op``, if it applies: some spatial axis ``f`` other than
    the innermost is read by exactly one input (the weight), as a bare index that is not that
    input's last one, next to no other spatial axis (so the other inputs broadcast along
    ``f``), and the innermost axis reaches some input through a computed index (a sliding
    window ``x * stride + rx``). GEMM-like ops (``B[r, j]``: the innermost axis is a bare,
    contiguous index) keep their plain layout and do not get the rewrite. The other inputs may
    read ``f`` as ``f // c`` (a grouped convolution, `Relayout.group`): ``c`` a multiple of 4
    from `MIN_GROUP` to `LAYOUT_VECTOR_MAX` (one vector of whole lanes per group), or a wider
    multiple of 8 (whole 8-lane vectors within one group)."""
    spatial = [a.var for a in op.axis]
    if len(spatial) < 2 or not op.reduce_axis or op.num_outputs != 1:
        return None
    loads = _scan(op.body).loads
    last = spatial[-1]
    if not any(last in _vars_in(i) and i is not last for ld in loads for i in ld.indices):
        return None
    for d, f in enumerate(spatial[:-1]):
        users = [ld for ld in loads if any(f in _vars_in(i) for i in ld.indices)]
        grouped = [g for ld in users if (g := _group_reads(ld, f)) is not None]
        users = [ld for ld in users if _group_reads(ld, f) is None]
        group = set().union(*grouped)
        if len(group) > 1 or any(c < MIN_GROUP or c % 4 or (c > LAYOUT_VECTOR_MAX and c % 8) for c in group):
            continue
        names = {ld.producer.op.name for ld in users}
        if len(names) != 1 or op.name in names:
            continue
        positions = set()
        ok = True
        for ld in users:
            pos = [k for k, i in enumerate(ld.indices) if f in _vars_in(i)]
            others = set().union(*(_vars_in(i) for k, i in enumerate(ld.indices) if k not in pos))
            if (len(pos) != 1 or ld.indices[pos[0]] is not f or pos[0] == len(ld.indices) - 1
                    or others & set(spatial)):
                ok = False
            positions.update(pos)
        if not ok or len(positions) != 1:
            continue
        p = positions.pop()
        ndim = len(users[0].indices)
        return Relayout(weight=names.pop(),
                        weight_order=tuple(k for k in range(ndim) if k != p) + (p,),
                        out_order=tuple(k for k in range(len(spatial)) if k != d) + (d,),
                        group=min(group, default=None))
    return None


# register and cache tiles of the relayout sketch ---------------------------------------------

LAYOUT_VECTOR_MAX = 32  # innermost output-channel tile (4 AVX2 vectors)
LAYOUT_BLOCK_MAX = 8  # innermost tile of every other axis (pixels in registers)
REGISTER_TILE_PRIOR = 0.8  # odds that a fresh relayout candidate draws a balanced register tile
# accumulators (8-lane vectors) of a drawn register tile: AVX2 has 16 ymm registers, and the
# broadcast input element and the weight vectors need some; 8-12 keep both FMA ports fed
# (4 cycles latency x 2 ports) with no spills, so they are the mode, 4-7 a tail
REGISTER_ACC = range(4, 13)
REGISTER_ACC_MODE = range(8, 13)
REGISTER_ACC_MODE_PRIOR = 0.8  # odds of a tile in the mode, when the extents have one
CACHE_COLUMNS_MAX = 32  # columns of the cache tile (one weight vector reused across them from L1)
# fresh reduction order of the relayout sketch: the kernel taps innermost (input channels
# outermost), the input channels innermost, or a uniform draw of the reduction tiles
REDUCE_ORDER_PRIOR = (0.45, 0.35, 0.2)


def draw_register_tile(ef: int, ex: int, ey: int | None, rng: np.random.Generator,
                       group: int | None = None) -> tuple[int, int, int] | None:
    """Innermost tiles (channels, columns, rows) of a relayout accumulator: whole 8-lane
    vectors of output channels times a block of output pixels, `REGISTER_ACC` accumulators
    with `REGISTER_ACC_MODE` the likeliest. Rows (``ey``; None without a row axis) widen the
    choice where the width has few divisors (14 = 2 x 7). ``group`` (`Relayout.group`): the
    channel tile is the group (ResNeXt-50 32x4d: 4 to 32 channels; 4 lanes are one xmm
    accumulator), or one of `group_vectors` for a wider group. None when no tile fits."""
    mode: list[tuple[int, int, int]] = []
    tail: list[tuple[int, int, int]] = []
    for fv in range(8, LAYOUT_VECTOR_MAX + 1, 8) if group is None else group_vectors(group):
        if ef % fv:
            continue
        for xv in divisors(ex):
            for yv in divisors(ey) if ey is not None else (1,):
                acc = -(-fv // 8) * xv * yv
                if xv <= LAYOUT_BLOCK_MAX and yv <= LAYOUT_BLOCK_MAX and acc in REGISTER_ACC:
                    (mode if acc in REGISTER_ACC_MODE else tail).append((fv, xv, yv))
    pick = mode if mode and (not tail or rng.random() < REGISTER_ACC_MODE_PRIOR) else tail
    return pick[int(rng.integers(len(pick)))] if pick else None


def draw_cache_columns(rest: int, xv: int, rng: np.random.Generator) -> int:
    """The middle tile of the column axis over a register tile of ``xv`` columns: the loop
    between the outer and the inner reduction loops, whose accumulators live in L1 while
    every weight vector loaded for one step of the outer reduction serves all its columns.
    A divisor of ``rest`` (the columns left), mostly the largest ones within
    `CACHE_COLUMNS_MAX` (more reuse per weight load)."""
    opts = [m for m in divisors(rest) if m * xv <= CACHE_COLUMNS_MAX] or [1]
    w = np.arange(1, len(opts) + 1, dtype=float) ** 2
    return opts[int(rng.choice(len(opts), p=w / w.sum()))]


def draw_reduce_order(extents: Sequence[int], rng: np.random.Generator) -> list[tuple[int]] | None:
    """Inner reduction tiles (R1) of a relayout accumulator, which fix the reduction order
    around the register tile: the kernel taps innermost (the first reduction axis, the input
    channels, outermost: each weight vector is used once per channel step), or a few input
    channels innermost (consecutive weight rows, the input read along its channel planes).
    None: the caller draws the tiles uniformly, as for any other reduction."""
    mode = int(rng.choice(3, p=np.asarray(REDUCE_ORDER_PRIOR)))
    if mode == 2 or not extents:
        return None
    if mode == 0:
        return [(1,)] + [(e,) for e in extents[1:]]
    opts = [d for d in divisors(extents[0]) if 2 <= d <= 16] or [1]
    return [(opts[int(rng.integers(len(opts)))],)] + [(1,) for _ in extents[1:]]


# GEMM micro-kernels --------------------------------------------------------------------------

# registers left besides the accumulators of an ``mr x nv`` micro-kernel: the ``nv`` vectors of
# the packed B row and one broadcast A element
MICROKERNEL_SPARE = 1
MICROKERNEL_MR_MAX = 16  # rows of a micro-kernel (each is one broadcast per k step)


def vector_registers(vector_bits: int) -> int:
    """Architectural SIMD registers of an x86 target whose widest vector is ``vector_bits``
    (`tecomp.codegen.target.Target.vector_bits`): 32 zmm with AVX-512, else 16 ymm/xmm."""
    return 32 if vector_bits >= 512 else 16


def microkernel_shapes(lanes: int, registers: int, columns: int | None = None) -> list[tuple[int, int]]:
    """GEMM register tiles ``(mr, nv)`` -- ``mr`` rows of A broadcast against ``nv`` vectors
    of ``lanes`` floats of B -- whose ``mr * nv`` accumulators, the ``nv`` B vectors and the
    broadcast fit ``registers`` (no spill in the k loop), best first: most FMAs per load
    (``mr * nv / (mr + nv)``: on AVX2 6x2 and 4x3 vectors, on AVX-512 6x4, 8x3), then most
    accumulators (4-5 cycles of FMA latency times 2 ports need 8-10 independent chains).
    ``columns``: keep only tiles whose ``nv * lanes`` divides it (the packed B panels are
    whole)."""
    out = []
    for nv in range(1, registers):
        for mr in range(1, MICROKERNEL_MR_MAX + 1):
            if mr * nv + nv + MICROKERNEL_SPARE > registers or mr * nv < 4:
                continue
            if columns is not None and columns % (nv * lanes):
                continue
            out.append((mr, nv))
    return sorted(out, key=lambda t: (-t[0] * t[1] / (t[0] + t[1]), -t[0] * t[1], t[0]))


MICROKERNEL_PRIOR = 0.5  # odds that a fresh GEMM candidate draws a register-file-sized micro-kernel
# k blocks: the innermost reduction tile. The large ones keep the accumulators in registers
# across more of k (each block ends in a load and store of all of them); the mr x kc piece of
# A stays in L1 up to 1024 (6 x 1024 floats = 24 KiB). Measured on GEMM 1024^3 (Zen 3, AVX2,
# benchmarks/gemm.py, 6 x 16 tile): kc 256 86.7%, 512 88.1%, 1024 91.2% of the FMA peak.
MICROKERNEL_KC = (32, 64, 256, 512, 1024)
# columns of a cache block: the micro-kernels of a row run along nc columns, whose B panel
# (all of k: the accumulators are placed at the column loop) the row blocks reread. A GEMM
# with no block of the last three sizes dividing its row is small (`small_gemm`).
MICROKERNEL_NC = (64, 128, 256, 512)
_BLOCKED_NC = MICROKERNEL_NC[1:]  # the widths whose dividing a GEMM's row makes it blocked
# A panel within this many bytes stays in L2 (half of Zen 3's 512 KiB; Zen 5 and recent Intel
# cores have 1-2 MiB), and such widths are drawn `MICROKERNEL_NC_FIT_WEIGHT` times as often.
# Measured on GEMM 1024^3 (Zen 3, 6 x 16 tile, all rows, kc 256/512/1024): nc 64 (a 256 KiB
# panel) 89.6-91.2% of the FMA peak, nc 128 77.4-78.5%, 256 68.9-70.1%, 512 67.0-67.9%.
MICROKERNEL_PANEL_BYTES = 256 * 1024
MICROKERNEL_NC_FIT_WEIGHT = 4.0
# rows of a cache block, or 0: all the rows in one block (the last micro-kernel partial), so
# each column block's B is packed once and every parallel iteration does the same work. A
# size is a target: the rows are cut into as many blocks as it gives, of equal size in whole
# micro-kernels (`_row_block`). Measured on GEMM 1024^3 (Zen 3, 6 x 16 tile, 64 columns):
# 384-row blocks (the last of 256) 76-78% of the peak, three equal blocks of 342 rows 81-82%,
# all rows 91-92%; 1020 rows (a 4-row block of its own, B packed again for it) 46%. All rows
# is drawn as often as the three sizes together.
MICROKERNEL_MC = (96, 192, 384, 0)
MICROKERNEL_MC_WEIGHTS = (1.0, 1.0, 1.0, 3.0)
_MC_P = np.array(MICROKERNEL_MC_WEIGHTS) / sum(MICROKERNEL_MC_WEIGHTS)  # drawn per fresh candidate


SMALL_GEMM_KU = (1, 4, 8)  # k unrolled by the small-GEMM register tile (`draw_small_gemm`)


def draw_small_gemm(ei: int, ej: int, ek: int, vector_bits: int,
                    rng: np.random.Generator) -> dict[str, tuple[int, ...]] | None:
    """Tiles (the plain tile's SSRSRS levels) of a GEMM too small for cache blocks of columns
    (`draw_microkernel` draws nothing for it): each head of BERT's attention, 128 x 64 x 128.
    Its B fits the caches whole, so the kernel is the register tile alone: an ``mr x nr``
    tile of `microkernel_shapes` whose rows divide the matrix's (a partial tile would guard
    the unrolled body) and whose columns divide its row, k innermost but for 1, 4 or 8
    unrolled steps, every outer loop parallel. Keys "i", "j", "k"; None for the share
    ``1 - MICROKERNEL_PRIOR`` of the draws and when no tile fits (decided before any draw,
    so such a GEMM's other candidates are sampled as before).

    Measured on the attention GEMM 12 x 128x128x64 (Zen 1, AVX2), 24 trials, seeds 0-2: the
    tuned kernel ran at 1.05-1.07x PyTorch, 0.82-1.01x without these draws."""
    lanes = max(vector_bits // 32, 1)
    shapes = [(mr, nv) for mr, nv in microkernel_shapes(lanes, vector_registers(vector_bits), ej)
              if ei % mr == 0 and mr < ei and nv * lanes <= MAX_INNERMOST][:3]
    if not shapes or rng.random() >= MICROKERNEL_PRIOR:
        return None
    w = np.array([4.0, 2.0, 1.0][:len(shapes)])
    mr, nv = shapes[int(rng.choice(len(shapes), p=w / w.sum()))]
    kus = [k for k in SMALL_GEMM_KU if ek % k == 0]
    ku = kus[int(rng.integers(len(kus)))]
    return {"i": (1, 1, mr), "j": (1, 1, nv * lanes), "k": (ku,)}


def small_gemm(ei: int, ej: int, ek: int) -> bool:
    """A GEMM for `draw_small_gemm`: no cache block of 128 or more `MICROKERNEL_NC` columns
    divides its row, and large enough (2^18 multiply-adds per matrix) that the tile matters."""
    return not any(ej % c == 0 for c in _BLOCKED_NC) and ei * ej * ek >= 1 << 18


@functools.lru_cache(maxsize=256)  # by identity: the search asks it of a task's own ops every build
def gemm_like(op: ComputeOp) -> bool:
    """A 2-D-or-more reduction whose innermost spatial axis is the bare last index of one
    input (``B[r, j]``: contiguous vectors along it) and whose next axis is a bare index of
    another input that does not read the innermost one (``A[i, r]``: one broadcast per row)
    -- the shape a BLIS micro-kernel computes."""
    if len(op.axis) < 2 or not op.reduce_axis or op.num_outputs != 1:
        return False
    j, i = op.axis[-1].var, op.axis[-2].var
    loads = _scan(op.body).loads
    reads_j = [ld for ld in loads if any(j in _vars_in(x) for x in ld.indices)]
    reads_i = [ld for ld in loads if any(i in _vars_in(x) for x in ld.indices)]
    return (len(reads_j) == 1 and reads_j[0].indices[-1] is j
            and not any(i in _vars_in(x) for x in reads_j[0].indices)
            and len(reads_i) == 1 and reads_i[0].producer.op is not reads_j[0].producer.op
            and any(x is i for x in reads_i[0].indices))


def draw_microkernel(ei: int, ej: int, ek: int, vector_bits: int,
                     rng: np.random.Generator) -> dict[str, tuple[int, ...]] | None:
    """Tiles (SSRSRS, 3 inner levels per spatial axis, 1 per reduction) of a BLIS-like GEMM
    on rows ``ei`` x columns ``ej`` x depth ``ek``: innermost an ``mr x nr`` register tile of
    `microkernel_shapes` (fits the target's register file: no spills), around it ``nc / nr``
    micro-kernels of one row block (S1 of the columns), a cache block of ``mc`` rows (S1 of
    the rows: its B panel, k x nc, is reread from cache by all of them) and a ``kc`` k block.
    The column micro-kernels sit outside the k loops, so each one's accumulators (the cached
    sketch puts them at S1) stay in registers through all of k and the A piece (mr x k) stays
    in L1 across them. Drawn at S2, inside the k block, ``nc / nr`` tiles of accumulators went
    to memory and back at every k block: GEMM 1024^3 ran at 85-89% of the FMA peak that way,
    90.5-91% this way (nc 64, any kc; alike at wider nc: docs/benchmark-notes.md). ``mr``
    need not divide ``ei`` (6 rows on AVX2): the last block is partial. Keys "i", "j", "k"; None for the
    share ``1 - MICROKERNEL_PRIOR`` of the draws, when no shape fits, or when no cache block
    of 128 or more `MICROKERNEL_NC` columns divides ``ej`` (a GEMM that small fits the caches
    whole, and its few blocked candidates would mostly repeat). Widths whose B panel fits
    `MICROKERNEL_PANEL_BYTES` are drawn more often."""
    lanes = max(vector_bits // 32, 1)
    # a small GEMM (no cache block of columns): cache blocks are moot, and the uniform draws
    # cover its tiles; decided before any draw, so its candidates are sampled as before
    shapes = [(mr, nv) for mr, nv in microkernel_shapes(lanes, vector_registers(vector_bits), ej)[:3]
              if any(c % (nv * lanes) == 0 and ej % c == 0 for c in _BLOCKED_NC)]
    if not shapes or rng.random() >= MICROKERNEL_PRIOR:
        return None
    # mostly the best shape; the next ones in case the model prefers them on this machine
    w = np.array([4.0, 2.0, 1.0][:len(shapes)])
    mr, nv = shapes[int(rng.choice(len(shapes), p=w / w.sum()))]
    nr = nv * lanes
    ncs = [c for c in MICROKERNEL_NC if c % nr == 0 and ej % c == 0]
    fit = np.array([MICROKERNEL_NC_FIT_WEIGHT if 4 * ek * c <= MICROKERNEL_PANEL_BYTES else 1.0 for c in ncs])
    nc = ncs[int(rng.choice(len(ncs), p=fit / fit.sum()))]
    mc = _row_block(ei, mr, MICROKERNEL_MC[int(rng.choice(len(MICROKERNEL_MC), p=_MC_P))])
    kcs = [k for k in MICROKERNEL_KC if ek % k == 0] or [d for d in divisors(ek) if d <= MAX_INNERMOST][-1:]
    kc = kcs[int(rng.integers(len(kcs)))]
    return {"i": (mc // mr, 1, mr), "j": (nc // nr, 1, nr), "k": (kc,)}


def _row_block(ei: int, mr: int, target: int) -> int:
    """Rows per cache block of ``ei`` rows for a block of about ``target`` rows (0: all of
    them): the rows cut into ``ceil(ei / target)`` blocks as equal as whole ``mr``-row
    micro-kernels make them (1024 rows at 384: 342 + 342 + 340, the last micro-kernel partial,
    `tile_fits`), not full blocks and a remainder that leaves a thread idle (384 + 384 + 256)."""
    if target <= 0 or target >= ei:
        return -(-ei // mr) * mr  # all rows: as many micro-kernels as cover them
    blocks = -(-ei // max(target, mr))
    rows = -(-ei // blocks)
    return -(-rows // mr) * mr


def tile_fits(v: Any, levels: int, extent: int, max_inner: int) -> TypeGuard[tuple[int, ...]]:
    """``v`` is a valid tile knob of an axis of ``extent``: ``levels`` positive factors, the
    innermost at most ``max_inner``, the outer levels at most as many innermost tiles as
    cover the extent (the last one may be partial: 1024 rows in 171 tiles of 6)."""
    return (isinstance(v, tuple) and len(v) == levels and all(isinstance(x, int) and x > 0 for x in v)
            and v[-1] <= max_inner and math.prod(v[:-1]) <= -(-extent // v[-1]))
