"""The search space: sketches derived from the compute DAG by rules, then random annotation.

A *sketch* fixes the structure of a schedule, one `StagePlan` per stage (Ansor's sketch rules,
CPU flavour):

* injective stages that are not outputs are inlined (padding, bias-add, casts), unless they
  hold an expensive op (exp, log...) and feed several consumers, which would recompute it;
* reductions with data reuse (some input is read independently of some spatial axis: matmul,
  conv) get multi-level tiling "SSRSRS" -- with the output tile in a cache_write stage when
  the reduction is an output, or with its elementwise consumer fused on top when it is not;
* a tiled output reduction whose innermost axis reads through a sliding window while another
  axis is read only by a weight (every convolution: `space_rules.relayout_rule`) also gets
  "relayout" sketches: the weight repacked output-channel-last, the accumulator permuted the
  same way and copied back, so the vector runs over output channels without gathers for any
  stride (with its padded input inlined, or computed as a stage of its own);
* a tiled reduction fused with its elementwise epilogue that reads a weight ``W[j, r]`` (a
  dense layer) also gets an "epilogue" sketch (`space_epilogue`): the weight packed panel by
  panel so the vector runs over ``j``, the epilogue applied to the register tile;
* reductions without reuse may be rfactored, so partial results can be vectorized;
* every other stage is "simple": a compute location, an outer parallel fuse, an inner
  vectorized split, an unroll pragma.

A *candidate* is a sketch plus the values of its knobs (tile sizes, parallel depth, vector
width, unroll budget, compute location). `SearchSpace.instantiate` turns one into steps by
applying them to a live schedule, so an impossible combination fails there, and knobs that a
candidate lacks (or holds invalid values for) are drawn from the given Generator -- which is
how sampling, mutation and crossover all reuse the same code.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tecomp.errors import TecompError
from tecomp.ir.dtype import bits, compute_dtype
from tecomp.ir.expr import Expr, Var
from tecomp.ir.stmt import ForKind
from tecomp.lowering.inline import effective_bodies
from tecomp.te.schedule import Stage
from tecomp.te.tensor import ComputeOp, IterVar, IterVarKind

from .space_epilogue import (
    EPILOGUE_AT_PRIOR,
    EPILOGUE_VEC_PRIOR,
    epilogue_sketches,
    epilogue_tile_prior,
    pack_weight,
    parallel_choices,
)
from .space_epilogue import fusible_consumer as _fusible_consumer
from .space_grouped import layout_tile
from .space_norm import build_row_sketch, is_row_sketch, row_sketches
from .space_rules import (
    EXPENSIVE_CALLS,
    MAX_INNERMOST,
    MICROKERNEL_KC,
    REGISTER_TILE_PRIOR,
    Relayout,
    _extent,
    _has_reuse,
    _packable,
    _scan,
    _vars_in,
    draw_cache_columns,
    draw_microkernel,
    draw_reduce_order,
    draw_register_tile,
    draw_small_gemm,
    factorizations,
    gemm_like,
    mutate_tile,
    relayout_rule,
    sample_tile,
    small_gemm,
    tile_fits,
)
from .space_rules import (
    readers as _readers,
)
from .steps import (
    AnnotationStep,
    CacheReadStep,
    CacheWriteStep,
    ComputeAtStep,
    ComputeInlineStep,
    FuseStep,
    LayoutCacheReadStep,
    LayoutCacheWriteStep,
    PragmaStep,
    ReorderStep,
    RfactorStep,
    SplitStep,
    State,
    Step,
    steps_key,
)
from .task import SearchTask

UNROLL_CHOICES = (0, 16, 64, 512)
VECTOR_CHOICES = (4, 8, 16, 32, 64)
RFACTOR_CHOICES = (4, 8, 16, 32, 64)
# where a packed input is copied: 0 = not packed, v > 0 = at leaf v - 1 of the loop nest that
# holds the tile (clamped to the loops outside the reduction); outer = bigger, rarer copies
PACK_CHOICES = (0, 1, 2, 3)
AT_ROOT_PRIOR = 0.3  # odds of a fresh sample computing a simple stage at root ...
AT_OUTER_PRIOR = 0.4  # ... or at the consumer's outermost loop (the rest: deeper loops)
NO_VECTOR_PRIOR = 0.1  # relative odds of an unvectorized simple stage (vector widths: 1.0 each)
# relative odds of a simple stage's vector (and an rfactor's factor) of one or two whole
# registers of the target, against 1.0 for the other widths: in a row-wise chain (softmax,
# layer norm) every stage and its rfactor partial must draw full registers at once, and
# uniform odds left a 32-trial budget with half-register vectors 9% slower (AVX-512 softmax)
REGISTER_VECTOR_PRIOR = 3.0
PACK_VECTOR = 16
MAX_EXPLICIT_UNROLL = 64  # copies of the loop body an explicitly unrolled tile may make
SPATIAL_LEVELS = 3  # inner tile levels of a spatial axis in SSRSRS (the outermost is implied)
REDUCE_LEVELS = 1
MAX_SKETCHES = 16


@dataclass(frozen=True)
class StagePlan:
    """The structural decision for one stage of the original DAG."""

    stage: str
    kind: str  # "inline" | "tile" | "rfactor" | "simple"
    cache_write: bool = False
    consumer: str | None = None  # "tile": the elementwise consumer fused on top
    pack: tuple[str, ...] = ()  # "tile": inputs that may be packed tile by tile (cache_read)
    # "tile": the weight repacked and the accumulator permuted so that the vector runs over
    # output channels (`space_rules.Relayout`); the stage is then tiled by `_tile_layout`
    relayout: Relayout | None = None


@dataclass(frozen=True)
class Sketch:
    plans: tuple[StagePlan, ...]
    # every producer that is neither inlined nor tiled is computed at the outermost loop of
    # its consumer (instead of a sampled location): a structural choice, because the chain
    # only pays off when every stage takes it at once (softmax: mx, e, sm inside out's rows)
    at_outer: bool = False

    def describe(self) -> str:
        parts = []
        for p in self.plans:
            if p.kind == "tile":
                how = "+cache" if p.cache_write else f"+fuse {p.consumer}" if p.consumer else ""
                if p.relayout is not None:
                    how += f"+layout {p.relayout.weight}"
                parts.append(f"{p.stage}:tile{how}")
            elif p.kind != "simple":
                parts.append(f"{p.stage}:{p.kind}")
        if self.at_outer:
            parts.append("producers at outer loops")
        return ", ".join(parts) or "simple"


@dataclass(frozen=True)
class Candidate:
    """A point of the space: sketch index, knob values, and the steps they produce."""

    sketch: int
    params: tuple[tuple[str, Any], ...]
    steps: tuple[Step, ...] = field(compare=False)
    key: str = field(compare=False, default="")

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


class _Mutate:
    """Marks a knob to be moved away from ``old`` (a different choice, or a tile factor moved
    between levels) the next time the candidate is instantiated."""

    def __init__(self, old: Any) -> None:
        self.old = old


def inline_injective(state: State, outputs: set[str]) -> list[str]:
    """Inline every injective stage of ``state`` that is not an output, unless it calls an
    expensive function (exp) and has several readers, which would recompute it; the names."""
    sch = state.sch
    inline: list[str] = []
    for st in sch.stages:
        op = st.op
        if not isinstance(op, ComputeOp) or op.reduce_axis or op.name in outputs:
            continue
        if _scan(op.body).calls & EXPENSIVE_CALLS and len(_readers(sch.stages, op.name)) > 1:
            continue
        inline.append(op.name)
    for name in inline:
        state.apply(ComputeInlineStep(name))
    return inline


def generate_sketches(task: SearchTask) -> list[Sketch]:
    """The sketches of ``task`` (at least one), most promising structure first."""
    state = State(task)
    sch = state.sch
    outputs = {op.name for op in task.outputs}
    inline = inline_injective(state, outputs)
    bodies = effective_bodies(sch)
    live = [st for st in sch.stages if isinstance(st.op, ComputeOp) and st.attach_type != "inline"]
    options: list[list[StagePlan]] = []
    for name in inline:
        options.append([StagePlan(name, "inline")])
    for st in live:
        op = st.op
        assert isinstance(op, ComputeOp)
        if not op.reduce_axis or op.num_outputs != 1:
            continue
        if _has_reuse(op, bodies[st]):
            opts = []
            fused = _fusible_consumer(st, live, bodies)
            pack = _packable(op)
            if fused is not None and op.name not in outputs:
                opts.append(StagePlan(op.name, "tile", consumer=fused, pack=pack))
            if op.name in outputs:
                opts.append(StagePlan(op.name, "tile", cache_write=True, pack=pack))
            opts.append(StagePlan(op.name, "tile", pack=pack))
            options.append(opts)
        elif _extent(op.reduce_axis[-1]) >= 8:
            options.append([StagePlan(op.name, "rfactor"), StagePlan(op.name, "simple")])
    tiled = {opts[0].stage for opts in options if opts[0].kind == "tile"}
    attachable = [st for st in live if st.op.name not in outputs and st.op.name not in tiled]
    sketches = [Sketch(tuple(combo), at_outer) for combo in itertools.product(*options)
                for at_outer in ((True, False) if attachable else (False,))]
    # + the dense layers' packed-weight epilogue sketches (`space_epilogue`)
    extra = (_relayout_sketches(sketches[0], live, outputs, inline)
             + epilogue_sketches(sketches[0], live)) if sketches else []
    return row_sketches(task, sketches[:MAX_SKETCHES - len(extra)] + extra)  # + space_norm's one-pass rows


def _relayout_sketches(base: Sketch, live: Sequence[Stage], outputs: set[str],
                       inline: Sequence[str]) -> list[Sketch]:
    """Variants of ``base`` in which a tiled output reduction takes its `Relayout` (the vector
    over output channels): one with its injective producers inlined as in ``base``, one with
    the producers it reads directly computed as stages of their own (a padded input: inlined,
    every load carries the padding test, whose selects cost the register tile its registers;
    computed, the loads are plain)."""
    out: list[Sketch] = []
    for st in live:
        op = st.op
        assert isinstance(op, ComputeOp)
        if op.name not in outputs or not any(p.stage == op.name and p.kind == "tile" for p in base.plans):
            continue
        rel = relayout_rule(op)
        if rel is None:
            continue
        plans = tuple(StagePlan(p.stage, "tile", relayout=rel) if p.stage == op.name else p
                      for p in base.plans)
        out.append(Sketch(plans, base.at_outer))
        direct = {t.op.name for t in op.input_tensors} & set(inline)
        if direct:
            out.append(Sketch(tuple(StagePlan(p.stage, "simple") if p.stage in direct else p
                                    for p in plans), base.at_outer))
    return out


# instantiation -------------------------------------------------------------------------------


SERIAL_FLOPS = 1 << 20  # below ~1 M multiply-adds a serial nest can beat waking the threads


def plain_parallel_choices(op: ComputeOp, s_tiles: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The ``par`` knob's options for a plain multi-level tile: how many leading loops (S0 of
    every axis, then S1) are fused into the parallel loop, among those whose fused loop has
    work for every core (`parallel_choices`); 0, a serial nest, only for a small operator.

    Offering every count let a fresh sample, or a mutation, be a serial kernel or a parallel
    loop of one iteration; on a loaded 2-core machine such a kernel measures close to a
    parallel one, and at a few dozen trials the search kept one (BERT's attention-times-values
    batch matmul ran serial, at 0.65x PyTorch)."""
    extents = [_extent(a) for a in op.axis]
    opts = parallel_choices(extents, s_tiles)
    work = math.prod(extents) * math.prod(_extent(r) for r in op.reduce_axis)
    return (0, *opts) if work < SERIAL_FLOPS else opts


class _Builder:
    """Applies a sketch to a fresh State, reading knob values from ``params`` (or drawing them)."""

    def __init__(self, task: SearchTask, sketch: Sketch, params: Mapping[str, Any],
                 rng: np.random.Generator | None) -> None:
        self.state = State(task)
        self.sketch = sketch
        self.params = params
        self.rng = rng
        self.used: dict[str, Any] = {}
        self.outputs = {op.name for op in task.outputs}
        self.packs: dict[str, list[tuple[str, int]]] = {}  # tiled stage -> (pack stage, knob)
        # at-outer sketches: per stage, the axis vars that the outermost loop pins to one point
        self.fixed: dict[str, set[Var]] = {}
        self._bodies: dict[Stage, list[Expr]] | None = None  # see _pinned_axes

    #: `REGISTER_VECTOR_PRIOR` where widths of whole registers are what the target runs best
    register_vector_prior = REGISTER_VECTOR_PRIOR

    def _vector_prior(self, op: ComputeOp, options: Sequence[int]) -> list[float]:
        """Fresh-sample odds of each vector width in ``options`` for ``op``'s element type:
        one or two of the target's registers `register_vector_prior`, scalar
        `NO_VECTOR_PRIOR` (when vectors are offered), any other width 1.0."""
        width = bits(compute_dtype(op.output(0).dtype))
        lanes = max(1, _vector_bits(self.state.task.target) // width)
        return [NO_VECTOR_PRIOR if v == 1 and len(options) > 1
                else self.register_vector_prior if v in (lanes, 2 * lanes) else 1.0 for v in options]

    def _draw(self, key: str) -> np.random.Generator:
        if self.rng is None:
            raise TecompError(f"knob {key} has no valid value and no Generator was given")
        return self.rng

    def choice(self, key: str, options: Sequence[int], prior: Sequence[float] | None = None) -> int:
        """The knob's value from ``params``; else a draw (from ``prior`` when given: the odds
        of each option for a fresh sample; a mutation moves to any other option uniformly)."""
        v = self.params.get(key)
        if isinstance(v, _Mutate):
            others = [o for o in options if o != v.old] or list(options)
            v = others[int(self._draw(key).integers(len(others)))]
        elif v not in options:
            rng = self._draw(key)
            if prior is not None and len(prior) == len(options):
                p = np.asarray(prior, dtype=float)
                v = options[int(rng.choice(len(options), p=p / p.sum()))]
            else:
                v = options[int(rng.integers(len(options)))]
        self.used[key] = v
        return int(v)  # type: ignore[arg-type]

    def tile(self, key: str, extent: int, levels: int, max_inner: int = MAX_INNERMOST,
             vector: bool = False, keep_inner: int = 0) -> tuple[int, ...]:
        """The tile knob ``key``: its given value when valid (`tile_fits`), a mutation of it,
        or a fresh draw with the innermost factor at most ``max_inner``. ``keep_inner``: a
        larger innermost factor that given values and mutations may keep (a prior's GEMM k
        block, which uniform draws would not offer)."""
        v = self.params.get(key)
        keep = max(max_inner, keep_inner)
        if isinstance(v, _Mutate):
            v = mutate_tile(tuple(v.old), extent, self._draw(key), keep)
        elif not tile_fits(v, levels, extent, keep):
            v = sample_tile(extent, levels, self._draw(key), max_inner, vector)
        self.used[key] = v
        return v

    def apply(self, step: Step) -> Any:
        return self.state.apply(step)

    # the whole sketch ------------------------------------------------------------------------
    def build(self) -> None:
        if is_row_sketch(self.sketch):
            return build_row_sketch(self, self.sketch.plans)
        st = self.state
        tile_compute: dict[str, StagePlan] = {}
        tile_consumer: dict[str, tuple[str, StagePlan]] = {}
        tile_layout: dict[str, tuple[str, StagePlan]] = {}
        for p in self.sketch.plans:
            if p.kind == "inline":
                self.apply(ComputeInlineStep(p.stage))
        for p in self.sketch.plans:
            if p.kind == "rfactor":
                self._rfactor(p.stage)
            elif p.kind == "tile":
                compute = p.stage
                if p.relayout is not None and p.consumer is not None:  # `space_epilogue`
                    self.packs[compute] = pack_weight(self, compute, p.stage, p.relayout)
                    tile_consumer[p.consumer] = (compute, p)
                    continue
                if p.relayout is not None:
                    rel = p.relayout
                    compute = f"{p.stage}.local"
                    self.apply(LayoutCacheWriteStep(p.stage, "local", rel.out_order))
                    self.apply(LayoutCacheReadStep(rel.weight, "pack", (compute,), rel.weight_order))
                    tile_layout[p.stage] = (compute, p)
                    continue
                if p.cache_write:
                    self._gemm_prior(p, cached=True)  # before the pack knobs are drawn
                    self.apply(CacheWriteStep(p.stage, "local"))
                    compute = f"{p.stage}.local"
                    tile_consumer[p.stage] = (compute, p)
                elif p.consumer is not None:
                    tile_consumer[p.consumer] = (compute, p)
                else:
                    self._gemm_prior(p, cached=False)  # before the pack knobs are drawn
                tile_compute[compute] = p
                self._cache_packs(compute, p)
        done: set[str] = {name for packs in self.packs.values() for name, _ in packs}
        for stage in reversed(list(st.sch.stages)):
            name = stage.op.name
            if not isinstance(stage.op, ComputeOp) or stage.attach_type == "inline" or name in done:
                continue
            if name in tile_layout:
                compute, plan = tile_layout[name]
                self._tile_layout(compute, name, plan)
                done.add(compute)
            elif name in tile_consumer:
                compute, plan = tile_consumer[name]
                self._tile_with_consumer(compute, name, plan)
                done.add(compute)
            elif name in tile_compute:
                self._tile_plain(name, tile_compute[name])
            else:
                self._simple(name)
            done.add(name)

    def _gemm_prior(self, plan: StagePlan, cached: bool) -> None:
        """A fresh candidate of a GEMM-like output reduction (`space_rules.gemm_like`) mostly
        (`space_rules.MICROKERNEL_PRIOR`) draws its knobs together, in the cached sketch
        (``cached``: accumulators in a local copy) as BLIS lays a GEMM out
        (`space_rules.draw_microkernel`): a register tile sized to the target's vector
        registers (6 x 16 floats on AVX2, 6 x 64 on AVX-512: uniform tile draws mostly spill
        or leave FMA ports idle), k blocks around it, the accumulator at the inner tile loop,
        vectorized, the outer loops fused in parallel and B packed per cache block. A GEMM too
        small for cache blocks (`space_rules.small_gemm`: attention's per-head matmuls), in
        either sketch, draws the register tile alone (`space_rules.draw_small_gemm`): k around
        it, the accumulators at the tile (cached) or the tile unrolled (plain), every outer loop
        parallel, nothing packed. All are ordinary knobs: given or mutated values stay, and
        records replay them."""
        if self.rng is None or plan.relayout is not None or plan.consumer is not None:
            return
        op = self.state.stage(plan.stage).op
        assert isinstance(op, ComputeOp)
        key, n = plan.stage, len(op.axis)
        if n < 2 or not gemm_like(op):
            return
        ki, kj, kr = f"{key}/S{n - 2}", f"{key}/S{n - 1}", f"{key}/R{len(op.reduce_axis) - 1}"
        if any(k in self.params for k in (ki, kj, kr)):
            return
        ei, ej, ek = _extent(op.axis[-2]), _extent(op.axis[-1]), _extent(op.reduce_axis[-1])
        small = small_gemm(ei, ej, ek)
        if not (small or cached):
            return
        vbits = _vector_bits(self.state.task.target)
        tiles = draw_small_gemm(ei, ej, ek, vbits, self.rng) if small else draw_microkernel(ei, ej, ek, vbits, self.rng)
        if tiles is None:
            return
        drawn: dict[str, Any] = {ki: tiles["i"], kj: tiles["j"], kr: tiles["k"], f"{key}/vec": 1,
                                 f"{key}/at" if cached else f"{key}/unroll_tile": 1,
                                 f"{key}/par": n, f"{key}/unroll": 0 if small else 16}
        # the other reductions (none in a GEMM) run whole outside the k block
        drawn.update({f"{key}/R{d}": (1,) for d in range(len(op.reduce_axis) - 1)})
        drawn.update({f"{key}/S{d}": (1, 1, 1) for d in range(n - 2)})  # batch axes: one matrix per tile
        drawn.update({f"{key}/pack_{t}": 0 if small else 1 for t in plan.pack})
        self.params = {**drawn, **self.params}

    def _cache_packs(self, compute: str, plan: StagePlan) -> None:
        """cache_read the packable inputs the knobs ask for (placed by `_place_packs` once
        the tile's loops exist)."""
        packs: list[tuple[str, int]] = []
        for t in plan.pack:
            name = f"{t}.global"
            if self.state.has_stage(name):  # packed for another stage already
                continue
            v = self.choice(f"{plan.stage}/pack_{t}", PACK_CHOICES)
            if v:
                self.apply(CacheReadStep(t, "global", (compute,)))
                packs.append((name, v))
        self.packs[compute] = packs

    def _place_packs(self, compute: str, target: str, limit: int) -> None:
        """Compute the packs of ``compute`` at a loop of ``target`` up to leaf ``limit``, with
        their rows copied by vectors."""
        for name, v in self.packs.get(compute, []):
            self.apply(ComputeAtStep(name, target, min(v - 1, limit)))
            leaves = self.state.leaves(name)
            _, inner = self.apply(SplitStep(name, len(leaves) - 1, (PACK_VECTOR,)))
            self.apply(AnnotationStep(name, self.state.index(name, inner), "vectorize"))

    def _rfactor(self, name: str) -> None:
        stage = self.state.stage(name)
        op = stage.op
        assert isinstance(op, ComputeOp)
        r = op.reduce_axis[-1]
        ext = _extent(r)
        fopts = [c for c in RFACTOR_CHOICES if c <= ext] or [ext]
        f = self.choice(f"{name}/rf", fopts, self._vector_prior(op, fopts))
        pos = self.state.index(name, r)
        self.apply(SplitStep(name, pos, (f,)))
        self.apply(RfactorStep(name, pos + 1, len(op.axis)))

    def _spatial_tiles(self, key: str, axes: Sequence[IterVar]) -> list[tuple[int, ...]]:
        last = len(axes) - 1  # the axis whose innermost tile may be vectorized
        return [self.tile(f"{key}/S{d}", _extent(a), SPATIAL_LEVELS, vector=d == last)
                for d, a in enumerate(axes)]

    def _reduce_tiles(self, key: str, axes: Sequence[IterVar], keep_inner: int = 0) -> list[tuple[int, ...]]:
        return [self.tile(f"{key}/R{d}", _extent(a), REDUCE_LEVELS, keep_inner=keep_inner)
                for d, a in enumerate(axes)]

    def _split_all(self, name: str, axes: Sequence[IterVar], factors: Sequence[tuple[int, ...]]) -> list[list[IterVar]]:
        parts = []
        for a, f in zip(axes, factors):
            parts.append(self.apply(SplitStep(name, self.state.index(name, a), f)))
        return parts

    def _reorder(self, name: str, order: Sequence[IterVar]) -> None:
        pos = [self.state.index(name, iv) for iv in order]
        if pos != list(range(len(pos))):
            self.apply(ReorderStep(name, tuple(pos)))

    def _parallel(self, name: str, count: int) -> None:
        if count <= 0:
            return
        if count > 1:
            self.apply(FuseStep(name, tuple(range(count))))
        self.apply(AnnotationStep(name, 0, "parallel"))

    def _unroll(self, name: str, key: str) -> None:
        u = self.choice(f"{key}/unroll", UNROLL_CHOICES)
        if u:
            self.apply(PragmaStep(name, 0, "auto_unroll_max_step", u))

    def _unroll_tile(self, name: str, key: str, loops: Sequence[tuple[IterVar, int]]) -> None:
        """Explicitly unroll the innermost tile (R1 and S3 loops, the vector loop excepted):
        the register tile of a GEMM micro-kernel. Offered only for small tiles, as unrolled
        bodies cost compile time."""
        if not loops or math.prod(e for _, e in loops) > MAX_EXPLICIT_UNROLL:
            self.choice(f"{key}/unroll_tile", (0,))
            return
        if self.choice(f"{key}/unroll_tile", (0, 1)):
            for iv, ext in loops:
                if ext > 1:
                    self.apply(AnnotationStep(name, self.state.index(name, iv), "unroll"))

    def _tile_plain(self, name: str, plan: StagePlan) -> None:
        op = self.state.stage(name).op
        assert isinstance(op, ComputeOp)
        key = plan.stage
        s_tiles = self._spatial_tiles(key, op.axis)
        r_tiles = self._reduce_tiles(key, op.reduce_axis)
        sp = self._split_all(name, op.axis, s_tiles)
        rp = self._split_all(name, op.reduce_axis, r_tiles)
        order = ([p[0] for p in sp] + [p[1] for p in sp] + [p[0] for p in rp] + [p[2] for p in sp]
                 + [p[1] for p in rp] + [p[3] for p in sp])
        self._reorder(name, order)
        vec = self.choice(f"{key}/vec", (0, 1))
        if vec:
            self.apply(AnnotationStep(name, self.state.index(name, sp[-1][3]), "vectorize"))
        inner = [(p[1], f[0]) for p, f in zip(rp, r_tiles)] + [(p[3], f[2]) for p, f in zip(sp, s_tiles)]
        self._unroll_tile(name, key, inner[:-1] if vec else inner)
        # fuse before the pragma goes on leaf 0: a fused loop does not keep its parts' pragmas
        par = self.choice(f"{key}/par", plain_parallel_choices(op, s_tiles))
        self._parallel(name, par)
        self._place_packs(name, name, 2 * len(sp) - max(par - 1, 0) - 1)
        self._unroll(name, key)

    def _tile_with_consumer(self, compute: str, consumer: str, plan: StagePlan) -> None:
        key = plan.stage
        cop = self.state.stage(compute).op
        yop = self.state.stage(consumer).op
        assert isinstance(cop, ComputeOp) and isinstance(yop, ComputeOp)
        n = len(yop.axis)
        epi = plan.relayout is not None  # packed weight: register-tile priors (`space_epilogue`)
        if epi and self.rng is not None and f"{key}/S0" not in self.params:
            self.params = {**epilogue_tile_prior(key, cop.axis, cop.reduce_axis, self.rng), **self.params}
        s_tiles = self._spatial_tiles(key, cop.axis)
        # a GEMM's k block (`draw_microkernel`) may be long: its loop runs around the
        # micro-kernel, not unrolled. Asked of the task's own op (the stage's origin, which
        # `_gemm_prior` asked too: cached), not of this build's accumulator copy
        origin = self.state.stage(key).origin_op
        long_k = not epi and isinstance(origin, ComputeOp) and gemm_like(origin)
        r_tiles = self._reduce_tiles(key, cop.reduce_axis, MICROKERNEL_KC[-1] if long_k else 0)
        # consumer: S0 S1 | tile, the tile covering the two inner spatial levels
        yp = self._split_all(consumer, yop.axis, [(f[0], f[1] * f[2]) for f in s_tiles])
        self._reorder(consumer, [p[0] for p in yp] + [p[1] for p in yp] + [p[2] for p in yp])
        # every core gets a tile (a parallel loop of one iteration was a serial kernel)
        par = self.choice(f"{key}/par", parallel_choices([_extent(a) for a in cop.axis], s_tiles))
        at = self.choice(f"{key}/at", (0, 1), EPILOGUE_AT_PRIOR if epi else None)
        vec = self.choice(f"{key}/vec", (0, 1), EPILOGUE_VEC_PRIOR if epi else None)
        attach = yp[n - 1][at]
        if vec:
            self.apply(AnnotationStep(consumer, self.state.index(consumer, yp[-1][2]), "vectorize"))
        attach_pos = self.state.index(consumer, attach)
        self._parallel(consumer, par)
        attach_pos = max(0, attach_pos - max(par - 1, 0))
        self.apply(ComputeAtStep(compute, consumer, attach_pos))
        self._place_packs(compute, consumer, attach_pos)
        # compute stage: R0 S2 R1 S3 inside the attach loop
        sp = self._split_all(compute, cop.axis, [(f[2],) for f in s_tiles])
        rp = self._split_all(compute, cop.reduce_axis, r_tiles)
        order = [p[0] for p in rp] + [p[0] for p in sp] + [p[1] for p in rp] + [p[1] for p in sp]
        self._reorder(compute, order)
        if vec:
            self.apply(AnnotationStep(compute, self.state.index(compute, sp[-1][1]), "vectorize"))
        inner = [(p[1], f[0]) for p, f in zip(rp, r_tiles)] + [(p[1], f[2]) for p, f in zip(sp, s_tiles)]
        self._unroll_tile(compute, key, inner[:-1] if vec else inner)
        self._unroll(compute, key)

    def _tile_layout(self, compute: str, consumer: str, plan: StagePlan) -> None:
        """A `Relayout` reduction: ``compute`` (the accumulator, output channels innermost) is
        tiled SSRSRS inside the tiles of ``consumer`` (the copy back to the user's layout),
        with the output-channel tile vectorized: each FMA multiplies one broadcast input
        element by a contiguous vector of the repacked weight."""
        assert plan.relayout is not None
        order = plan.relayout.out_order
        key = plan.stage
        cop = self.state.stage(compute).op
        yop = self.state.stage(consumer).op
        assert isinstance(cop, ComputeOp) and isinstance(yop, ComputeOp)
        n = len(yop.axis)
        # the register tile is (pixels of the other axes) x (output-channel vectors): a few
        # vectors wide, a few pixels deep, or the accumulators spill; a grouped convolution's
        # vector is one group of channels (`space_grouped`)
        last = len(cop.axis) - 1
        self._register_tile(key, cop.axis, cop.reduce_axis, plan.relayout.group)
        s_tiles = [layout_tile(self, f"{key}/S{d}", _extent(a), SPATIAL_LEVELS, d == last, plan.relayout)
                   for d, a in enumerate(cop.axis)]
        r_tiles = self._reduce_tiles(key, cop.reduce_axis)
        # consumer axis d is accumulator axis order.index(d): S0 S1 | tile, in the consumer's
        # order, so its innermost loop (contiguous stores to the user's array) may be vectorized
        ct = [s_tiles[order.index(d)] for d in range(n)]
        yp = self._split_all(consumer, yop.axis, [(f[0], f[1] * f[2]) for f in ct])
        self._reorder(consumer, [p[0] for p in yp] + [p[1] for p in yp] + [p[2] for p in yp])
        par = self.choice(f"{key}/par", parallel_choices([_extent(a) for a in yop.axis], ct))
        at = self.choice(f"{key}/at", (0, 1))
        if self.choice(f"{key}/vec_copy", (0, 1)):
            self.apply(AnnotationStep(consumer, self.state.index(consumer, yp[-1][2]), "vectorize"))
        attach_pos = self.state.index(consumer, yp[n - 1][at])
        self._parallel(consumer, par)
        attach_pos = max(0, attach_pos - max(par - 1, 0))
        self.apply(ComputeAtStep(compute, consumer, attach_pos))
        # accumulator: R0 S2 R1 S3 inside the attach loop, the output-channel S3 vectorized
        sp = self._split_all(compute, cop.axis, [(f[2],) for f in s_tiles])
        rp = self._split_all(compute, cop.reduce_axis, r_tiles)
        self._reorder(compute, [p[0] for p in rp] + [p[0] for p in sp] + [p[1] for p in rp]
                      + [p[1] for p in sp])
        self.apply(AnnotationStep(compute, self.state.index(compute, sp[-1][1]), "vectorize"))
        inner = [(p[1], f[0]) for p, f in zip(rp, r_tiles)] + [(p[1], f[2]) for p, f in zip(sp, s_tiles)]
        self._unroll_tile(compute, key, inner[:-1])
        self._unroll(compute, key)

    def _register_tile(self, key: str, axes: Sequence[IterVar], reduce: Sequence[IterVar], group: int | None) -> None:
        """A fresh relayout candidate mostly draws its tiles together (`REGISTER_TILE_PRIOR`):
        innermost, a register tile of whole channel vectors x columns x rows, 8-12
        accumulators as the mode (`space_rules.draw_register_tile`); around it, a cache tile
        of more columns, whose accumulators stay in L1 while each weight vector serves all
        of them (the other middle levels 1: an unrolled loop keeps its whole accumulator set
        in registers, and spills); and the reduction order (`space_rules.draw_reduce_order`).
        All are tile knobs: given or mutated values stay, and records replay them."""
        last = len(axes) - 1
        kf, kx = f"{key}/S{last}", f"{key}/S{last - 1}"
        if last < 1 or self.rng is None or kf in self.params or kx in self.params:
            return
        if self.rng.random() >= REGISTER_TILE_PRIOR:
            return
        ey = _extent(axes[last - 2]) if last >= 2 else None
        ef, ex = _extent(axes[last]), _extent(axes[last - 1])
        reg = draw_register_tile(ef, ex, ey, self.rng, group)
        if reg is None:
            return
        fv, xv, yv = reg
        # (inner, middle, extent) per axis; the batch axes keep one point
        fresh = {kf: (fv, 1, ef), kx: (xv, draw_cache_columns(ex // xv, xv, self.rng), ex)}
        for d, a in enumerate(axes[:-2]):
            if f"{key}/S{d}" not in self.params:
                fresh[f"{key}/S{d}"] = (yv if d == last - 2 else 1, 1, _extent(a))
        drawn: dict[str, Any] = {k: (*sample_tile(ext // (mid * inner), 1, self.rng), mid, inner)
                                 for k, (inner, mid, ext) in fresh.items()}
        order = draw_reduce_order([_extent(r) for r in reduce], self.rng)
        if order is not None:
            drawn.update({f"{key}/R{d}": t for d, t in enumerate(order) if f"{key}/R{d}" not in self.params})
        self.params = {**self.params, **drawn}

    def _simple(self, name: str) -> None:
        stage = self.state.stage(name)
        op = stage.op
        assert isinstance(op, ComputeOp)
        is_out = stage.is_output or name in self.outputs
        attached = False
        if not is_out:
            opts = _attach_options(self.state, name)
            # Fresh samples favour the outermost loop of the consumer: it keeps the producer's
            # data hot without recomputing it (inner loops often repeat the work), which is
            # what row-wise chains (softmax, layernorm) need from every stage at once.
            prior = [AT_ROOT_PRIOR, AT_OUTER_PRIOR] + [(1 - AT_ROOT_PRIOR - AT_OUTER_PRIOR) / max(len(opts) - 1, 1)] * (
                len(opts) - 1)
            if self.sketch.at_outer and opts:
                at = self.choice(f"{name}/at", (1,))
            else:
                at = self.choice(f"{name}/at", tuple(range(len(opts) + 1)), prior)
            if at:
                tgt, pos = opts[at - 1]
                self.apply(ComputeAtStep(name, tgt, pos))
                attached = True
                if self.sketch.at_outer:
                    self.fixed[name] = self._pinned_axes(name, tgt)
        spatial = list(op.axis)
        lead = len(spatial)
        if spatial:
            ext = _extent(spatial[-1])
            vopts = [1] + [v for v in VECTOR_CHOICES if v < ext] + ([ext] if ext <= MAX_INNERMOST else [])
            if spatial[-1].var in self.fixed.get(name, ()):
                # one point per row: vector lanes would all but one be masked off
                vopts = [1]
            vopts = list(dict.fromkeys(vopts))
            # scalar loops are rarely best when vectors fit: give them a small share
            vf = self.choice(f"{name}/vec", tuple(vopts), self._vector_prior(op, vopts))
            if vf > 1:
                pos = self.state.index(name, spatial[-1])
                outer, inner = self.apply(SplitStep(name, pos, (vf,)))
                if op.reduce_axis:
                    self._reorder(name, spatial[:-1] + [outer] + list(op.reduce_axis) + [inner])
                self.apply(AnnotationStep(name, self.state.index(name, inner), "vectorize"))
        if not attached and spatial:
            pars = tuple(range(0, lead + 1))
            if self.sketch.at_outer and lead >= 2:
                # producers sit in the outermost loop: fusing the innermost axis into it would
                # make them recompute a whole row per chunk of it
                pars = tuple(range(1, lead))
            par = self.choice(f"{name}/par", pars)
            self._parallel(name, par)
            # the fused outer loop covers the leading axes (only the last one was split)
            self.fixed[name] = {a.var for a in spatial[:par]} if self.sketch.at_outer else set()
        if op.reduce_axis:
            self._unroll(name, name)


    def _pinned_axes(self, name: str, target: str) -> set[Var]:
        """Axes of ``name`` (computed at ``target``'s outermost loop) whose region there is a
        single point: every reader indexes that dimension only with its own pinned axes."""
        sch = self.state.sch
        op = self.state.stage(name).op
        assert isinstance(op, ComputeOp)
        pinned = {a.var for a in op.axis}
        if self._bodies is None:
            # once per candidate: by the time stages are placed, every inline, rfactor and
            # cache_read is done, and compute_at does not change what a stage reads
            self._bodies = effective_bodies(sch)
        for st, body in self._bodies.items():
            if st.attach_type == "inline" or st.op.name == name:
                continue
            loads = [ld for ld in _scan(body).loads if ld.producer.op.name == name]
            if not loads:
                continue
            fixed = self.fixed.get(st.op.name)
            if fixed is None:  # a reader outside the chain: assume nothing
                return set()
            for ld in loads:
                for a, idx in zip(op.axis, ld.indices):
                    if not _vars_in(idx) <= fixed:
                        pinned.discard(a.var)
        return pinned


@functools.lru_cache(maxsize=64)
def _vector_bits(target: str) -> int:
    """`Target.vector_bits` of a task's target string: asked per stage of every sampled
    candidate, where parsing the string each time cost 16-35 us."""
    from tecomp.codegen.target import Target

    return Target.parse(target).vector_bits


def _attach_options(state: State, name: str) -> list[tuple[str, int]]:
    """Loops where ``name`` may be computed: loops of the one root-level stage that holds all
    of its readers, outside where any reader is computed, not inside a vectorized loop."""
    sch = state.sch
    readers: list[Stage] = []
    todo = [name]
    while todo:
        cur = todo.pop()
        for r in _readers(sch.stages, cur):
            if r.attach_type == "inline":
                todo.append(r.op.name)
            elif r not in readers:
                readers.append(r)
    target: Stage | None = None
    limit = -1
    for r in readers:
        if r.attach_type == "scope":
            assert r.attach_stage is not None
            t, lim = r.attach_stage, r.attach_stage.leaf_iter_vars.index(r.attach_ivar)  # type: ignore[arg-type]
        else:
            t = r
            leaves = r.leaf_iter_vars
            lim = next((k for k, iv in enumerate(leaves) if iv.kind == IterVarKind.REDUCE), len(leaves)) - 1
        if target is None:
            target, limit = t, lim
        elif t is target:
            limit = min(limit, lim)
        else:
            return []
    if target is None:
        return []
    out = []
    for k in range(limit + 1):
        iv = target.leaf_iter_vars[k]
        a = target.iter_var_attrs.get(iv)
        if a is not None and a.kind == ForKind.VECTORIZED:
            break
        out.append((target.op.name, k))
    return out


class SearchSpace:
    """Sketches of a task and the ways to draw, mutate and cross candidates from them.

    This class is the CPU space and the base of the others: a space for another target kind
    overrides `make_sketches` (its sketch rules) and `builder` (how a sketch and knob values
    become steps), registers itself with `register_space`, and inherits sampling, mutation
    and crossover, which only deal in knob values. `space_for` picks the class by the task's
    target kind.
    """

    #: the target kind (``Target.kind``) this space is for
    kind = "llvm"

    def __init__(self, task: SearchTask) -> None:
        self.task = task
        self.sketches: Sequence[Sketch] = self.make_sketches(task)

    def make_sketches(self, task: SearchTask) -> Sequence[Sketch]:
        return generate_sketches(task)

    def builder(self, sketch: Sketch, params: Mapping[str, Any],
                rng: np.random.Generator | None) -> _Builder:
        return _Builder(self.task, sketch, params, rng)

    def instantiate(self, sketch: int, params: Mapping[str, Any],
                    rng: np.random.Generator | None = None) -> Candidate | None:
        """The candidate for these knob values (missing/invalid ones drawn from ``rng``), or
        None when the schedule primitives reject the combination."""
        b = self.builder(self.sketches[sketch], params, rng)
        try:
            b.build()
        except TecompError:
            return None
        steps = tuple(b.state.steps)
        return Candidate(sketch, tuple(sorted(b.used.items())), steps, steps_key(steps))

    def sample(self, rng: np.random.Generator) -> Candidate | None:
        return self.instantiate(int(rng.integers(len(self.sketches))), {}, rng)

    def mutate(self, cand: Candidate, rng: np.random.Generator, knob: str | None = None) -> Candidate | None:
        """Change one knob: move a tile factor between levels, or pick another choice.
        ``knob``: that knob (None when it is not one of the candidate's or cannot move)."""
        if not cand.params:
            return self.sample(rng) if knob is None else None
        keys = [k for k, _ in cand.params]
        if knob is not None:
            if knob not in keys:
                return None
            keys = [knob]
        new: Candidate | None = None
        # a knob with one legal value (a choice of one, a tile of a prime extent) cannot move:
        # try other knobs rather than hand back the parent (a wasted measurement)
        for _ in range(min(8, max(2 * len(keys), 4))):
            params = cand.param_dict
            key = keys[int(rng.integers(len(keys)))]
            params[key] = _Mutate(params[key])
            new = self.instantiate(cand.sketch, params, rng)
            if new is None or new.params != cand.params:
                return new
        return new if knob is None else None

    def crossover(self, a: Candidate, b: Candidate, rng: np.random.Generator) -> Candidate | None:
        """Per stage, take all knobs from one parent (only between candidates of one sketch)."""
        if a.sketch != b.sketch:
            return self.mutate(a, rng)
        pa, pb = dict(a.params), dict(b.params)
        stages = sorted({k.split("/")[0] for k in (*pa, *pb)})
        pick = {s: bool(rng.integers(2)) for s in stages}
        params = {k: v for k, v in pa.items() if pick[k.split("/")[0]]}
        params.update({k: v for k, v in pb.items() if not pick[k.split("/")[0]]})
        return self.instantiate(a.sketch, params, rng)


# target kind -> space class; kinds whose module is imported on first use (not at import of
# this module: those modules build on this one)
_SPACES: dict[str, type[SearchSpace]] = {"llvm": SearchSpace}
_SPACE_MODULES = {"cuda": "tuning.gpu_space"}


def register_space(cls: type[SearchSpace]) -> type[SearchSpace]:
    """Class decorator: ``cls`` is the search space of tasks whose target kind is ``cls.kind``."""
    _SPACES[cls.kind] = cls
    return cls


def space_for(task: SearchTask) -> SearchSpace:
    """The search space of ``task``, by the kind of its target."""
    from tecomp.codegen.target import Target

    kind = Target.parse(task.target).kind
    if kind not in _SPACES and kind in _SPACE_MODULES:
        import importlib

        importlib.import_module(_SPACE_MODULES[kind])
    cls = _SPACES.get(kind)
    if cls is None:
        from .task import TuningError

        raise TuningError(f"no search space for target kind {kind!r} (task {task.name}); "
                          f"known: {sorted(set(_SPACES) | set(_SPACE_MODULES))}")
    return cls(task)


__all__ = ["Candidate", "SearchSpace", "Sketch", "StagePlan", "factorizations",
           "generate_sketches", "mutate_tile", "register_space", "sample_tile", "space_for"]
