"""Sketch rules of dense layers with fused epilogues (bias, activation, residual add).

A dense layer as PyTorch lays it out, ``Y[i, j] = sum_r X[i, r] * W[j, r]``, reads both of
its inputs contiguously along the reduction axis only: the output's innermost axis ``j``
(the one a vector runs over, so that the stores are contiguous) strides the weight by ``k``.
The plain multi-level tile then either gathers ``W`` (one lane per row) or stays scalar, and
the tuner found 20 GFLOP/s (a quarter of the FMA peak) on BERT's FFN. The "epilogue sketch"
of this module fixes both halves of such a layer at once:

* the weight is copied, tile by tile, into ``W.pack[r, j]`` (the output axis last: the
  panel packing of BLAS, expressed with `tuning.steps.LayoutCacheReadStep`): computed
  inside the consumer's outer tile loop, each panel is copied once, while it is hot, and
  the register tile then multiplies one broadcast ``X`` element by contiguous vectors of it;
* the elementwise chain after the reduction (bias add, activation, residual add: every
  non-output stage of it inlined into the last one by the sketch rules) is the tile's
  consumer, and the accumulator is computed at the consumer's inner tile loop: a buffer of
  register-tile size that the epilogue reads back before the one store of each output
  element -- the output is written once, and no full-size intermediate exists.

The register tile is drawn as for the convolution relayout (`space_rules.draw_register_tile`:
whole 8-lane vectors of ``j`` times a few rows, 8-12 accumulators), which is what a 128-row
GEMM needs: wide enough in ``j`` to amortise the broadcasts, few enough rows to stay in the
16 ymm registers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tecomp.ir.expr import Expr, Var
from tecomp.te.schedule import Stage
from tecomp.te.tensor import ComputeOp, IterVar

from .space_rules import Relayout, _extent, _scan, _vars_in, divisors, draw_register_tile
from .steps import LayoutCacheReadStep, Step

if TYPE_CHECKING:
    from .space import Sketch

# where the packed weight is copied: at leaf v - 1 of the consumer's loops (clamped to the
# loops outside the accumulator); the outermost leaf is the parallel loop of whole tiles, so
# 1 copies each panel once per tile -- the mode -- and deeper leaves copy smaller pieces
EPILOGUE_PACK_CHOICES = (1, 2, 3)
EPILOGUE_PACK_PRIOR = (0.6, 0.25, 0.15)
# the accumulator at the inner tile loop of the consumer (1: a register-tile buffer, which the
# epilogue reads back from registers or L1) rather than its outer one (0: a cache tile that
# the epilogue re-reads as a pass of its own)
EPILOGUE_AT_PRIOR = (0.2, 0.8)
# the packed weight is contiguous along the vector axis, so the tile is mostly vectorized
EPILOGUE_VEC_PRIOR = (0.1, 0.9)


# the packed panel of the weight (k x the columns of one parallel tile) is reread from L2 by
# every row block of the tile: it should fit there with room for the rows of X
PANEL_BYTES_MAX = 384 * 1024
MIN_PARALLEL_TILES = 2  # the outer parallel loop of whole tiles needs work for every core
# fresh draws of the inner reduction tile: mostly 1 (the whole reduction runs around the
# register tile, whose accumulators then never leave the registers), sometimes a short
# unrolled step
EPILOGUE_R1_CHOICES = (1, 1, 2, 4)
EPILOGUE_UNROLL_TILE_PRIOR = 0.8  # odds that a fresh register tile is unrolled


class _Builds(Protocol):
    """What `pack_weight` needs of `space._Builder` (no import cycle)."""

    def apply(self, step: Step) -> Any: ...

    def choice(self, key: str, options: Sequence[int], prior: Sequence[float] | None = None) -> int: ...


def fusible_consumer(st: Stage, live: Sequence[Stage], bodies: Mapping[Stage, list[Expr]]) -> str | None:
    """The single elementwise reader of ``st`` that reads it at its own axes, if any.

    ``bodies`` are the stages' bodies with the inlined stages substituted, so a chain of
    elementwise epilogues (bias add, then activation, then a residual add reading another
    input) whose inner links were inlined counts as one reader: the chain's last stage."""
    op = st.op
    assert isinstance(op, ComputeOp)
    readers = []
    for other in live:
        if other is st:
            continue
        loads = [ld for ld in _scan(bodies[other]).loads if ld.producer.op.name == op.name]
        if loads:
            readers.append((other, loads))
    if len(readers) != 1:
        return None
    reader, loads = readers[0]
    rop = reader.op
    assert isinstance(rop, ComputeOp)
    if rop.reduce_axis or len(rop.axis) != len(op.axis):
        return None
    if [_extent(a) for a in rop.axis] != [_extent(a) for a in op.axis]:
        return None
    for ld in loads:
        if len(ld.indices) != len(rop.axis) or not all(
                i is a.var for i, a in zip(ld.indices, rop.axis)):
            return None
    return rop.name


def packed_weight_rule(op: ComputeOp) -> Relayout | None:
    """The weight packing of a dense-like reduction, if it applies: the innermost spatial axis
    ``j`` is read by exactly one input (the weight), once, as a bare index that is not that
    input's last one, while the last index is reduction-only (``W[j, r]``: contiguous along
    ``r``, strided along ``j``). The weight is then copied with that dimension last; the
    accumulator keeps the user's layout (``out_order`` is the identity). Convolutions, whose
    innermost axis slides a window over the data (`space_rules.relayout_rule`), and GEMMs
    that already read ``B[r, j]`` do not qualify."""
    spatial = [a.var for a in op.axis]
    if len(spatial) < 2 or not op.reduce_axis or op.num_outputs != 1:
        return None
    reduce = {r.var for r in op.reduce_axis}
    last = spatial[-1]
    loads = _scan(op.body).loads
    users = [ld for ld in loads if any(last in _vars_in(i) for i in ld.indices)]
    names = {ld.producer.op.name for ld in users}
    if len(names) != 1 or op.name in names:
        return None
    positions: set[int] = set()
    for ld in users:
        pos = [k for k, i in enumerate(ld.indices) if last in _vars_in(i)]
        tail: set[Var] = _vars_in(ld.indices[-1])
        if (len(pos) != 1 or ld.indices[pos[0]] is not last or pos[0] == len(ld.indices) - 1
                or not tail or not tail <= reduce):
            return None
        positions.update(pos)
    if len(positions) != 1:
        return None
    p = positions.pop()
    ndim = len(users[0].indices)
    return Relayout(weight=names.pop(), weight_order=tuple(k for k in range(ndim) if k != p) + (p,),
                    out_order=tuple(range(len(spatial))))


def epilogue_sketches(base: Sketch, live: Sequence[Stage]) -> list[Sketch]:
    """Variants of ``base`` in which each tiled reduction fused with its elementwise consumer
    (the epilogue) and reading a weight ``W[j, r]`` (`packed_weight_rule`) packs that weight:
    the plan keeps its consumer and gains the `Relayout` (weight order only)."""
    ops = {st.op.name: st.op for st in live}
    plans = []
    changed = False
    for p in base.plans:
        op = ops.get(p.stage)
        if (p.kind == "tile" and p.consumer is not None and p.relayout is None
                and isinstance(op, ComputeOp)):
            rel = packed_weight_rule(op)
            if rel is not None:
                # the weight is packed by the layout copy: plain panel packing of it is moot
                p = dataclasses.replace(p, relayout=rel, pack=tuple(t for t in p.pack if t != rel.weight))
                changed = True
        plans.append(p)
    return [dataclasses.replace(base, plans=tuple(plans))] if changed else []


def epilogue_tile_prior(key: str, axes: Sequence[IterVar], reduce: Sequence[IterVar],
                        rng: np.random.Generator) -> dict[str, Any]:
    """The knobs of a fresh epilogue candidate drawn together, BLAS-like: a register tile of
    whole vectors of the innermost axis ``j`` times a few rows (`draw_register_tile`, 8-12
    accumulators mostly), every row of the tile in it (the packed panel serves them all, so
    each weight element is packed once), a panel of ``j`` per parallel tile that fits
    `PANEL_BYTES_MAX` with at least `MIN_PARALLEL_TILES` tiles, the outer loops of every axis
    fused into the parallel loop, the weight packed there, and the accumulator at the inner
    tile loop (a register-tile buffer, read back by the epilogue). Empty when no register
    tile fits (the knobs are then drawn one by one, as for any tile)."""
    if len(axes) < 2:
        return {}
    ej, ei = _extent(axes[-1]), _extent(axes[-2])
    reg = draw_register_tile(ej, ei, None, rng)
    if reg is None:
        return {}
    fv, xv, _ = reg
    k = int(np.prod([_extent(r) for r in reduce]))
    panels = [d for d in divisors(ej // fv)
              if ej // (fv * d) >= MIN_PARALLEL_TILES and 4 * k * fv * d <= PANEL_BYTES_MAX] or [1]
    # wider panels are likelier: each one rereads all of X's rows from L2
    w = np.asarray(panels, dtype=float)
    d = panels[int(rng.choice(len(panels), p=w / w.sum()))]
    last = len(axes) - 1
    # (S1, S2, S3) per axis: leading batch axes stay whole in the parallel loop
    out: dict[str, Any] = {f"{key}/S{a}": (1, 1, 1) for a in range(last - 1)}
    out[f"{key}/S{last - 1}"] = (ei // xv, 1, xv)
    out[f"{key}/S{last}"] = (d, 1, fv)
    for a, r in enumerate(reduce):
        r1 = int(EPILOGUE_R1_CHOICES[int(rng.integers(len(EPILOGUE_R1_CHOICES)))])
        out[f"{key}/R{a}"] = (r1 if a == len(reduce) - 1 and _extent(r) % r1 == 0 else 1,)
    out[f"{key}/par"] = len(axes)
    out[f"{key}/at"] = 1
    out[f"{key}/vec"] = 1
    # the register tile unrolled (rows and reduction step; the vector loop stays a vector)
    out[f"{key}/unroll_tile"] = int(rng.random() < EPILOGUE_UNROLL_TILE_PRIOR)
    return out


def parallel_choices(extents: Sequence[int], tiles: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The ``par`` knob's options for an epilogue tile (how many of the consumer's leading
    loops, S0 of every axis then S1 of every axis, are fused into the parallel loop): those
    whose fused loop has at least `MIN_PARALLEL_TILES` iterations. A mutation that leaves
    one point in the outer loops otherwise yields a serial kernel, which a loaded machine
    measures as fast as a parallel one and the search then keeps."""
    loops = [-(-e // math.prod(f)) for e, f in zip(extents, tiles)] + [f[0] for f in tiles]
    opts = tuple(p for p in range(1, 2 * len(tiles) + 1) if math.prod(loops[:p]) >= MIN_PARALLEL_TILES)
    return opts or tuple(range(1, 2 * len(tiles) + 1))


def pack_weight(b: _Builds, compute: str, stage: str, rel: Relayout) -> list[tuple[str, int]]:
    """Copy the weight of an epilogue plan into ``"<weight>.pack"`` (read by ``compute``), and
    the (pack stage, placement knob) pair that `space._Builder._place_packs` places once the
    consumer's tile loops exist."""
    b.apply(LayoutCacheReadStep(rel.weight, "pack", (compute,), rel.weight_order))
    v = b.choice(f"{stage}/pack_{rel.weight}", EPILOGUE_PACK_CHOICES, EPILOGUE_PACK_PRIOR)
    return [(f"{rel.weight}.pack", v)]


__all__ = ["EPILOGUE_AT_PRIOR", "EPILOGUE_UNROLL_TILE_PRIOR", "EPILOGUE_VEC_PRIOR", "epilogue_sketches",
           "epilogue_tile_prior", "fusible_consumer", "pack_weight", "packed_weight_rule", "parallel_choices"]
