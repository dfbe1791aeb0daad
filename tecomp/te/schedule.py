"""Schedules: how each stage of a compute DAG is turned into loops.

A `Schedule` holds one `Stage` per operation. Primitives edit a stage's iteration-variable
relations (split/fuse), the order of its leaf loops, per-loop annotations, and where the stage
is computed (root, inline, or inside a loop of a consumer). Nothing here touches the user's
operations: transformations that change a body (cache_read/cache_write/rfactor) give the stage a
new operation and keep the original as ``origin_op``, so several schedules can be made from one
declaration (the tuner does this thousands of times).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ScheduleError
from ..ir import dtype as dt
from ..ir.expr import Expr, ProducerLoad, Reduce, Var, const, to_expr
from ..ir.functor import ExprMutator
from ..ir.stmt import ForKind
from .tensor import (
    AxisVar,
    ComputeOp,
    IterVar,
    IterVarKind,
    Operation,
    Range,
    Tensor,
)


@dataclass(eq=False)
class SplitRel:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: Expr | None
    nparts: Expr | None


@dataclass(eq=False)
class FuseRel:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass(eq=False)
class SingletonRel:
    """``fuse()`` of no axes: a new outermost loop of extent 1 (TVM's Singleton relation), so
    that generic code can bind/parallelise/compute_at "the fused axis" of any stage."""

    iv: IterVar


@dataclass(eq=False)
class IterAttr:
    """Per-loop annotations."""

    kind: ForKind | None = None
    pragmas: list[tuple[str, Any]] = field(default_factory=list)
    prefetch: list[tuple[Tensor, Expr]] = field(default_factory=list)
    tensor_intrin: Any = None
    bind_thread: IterVar | None = None


class Stage:
    """One operation's loop nest under construction (``s[C]``)."""

    def __init__(self, op: Operation, schedule: Schedule) -> None:
        self.op = op
        self.origin_op = op
        self.schedule = schedule
        self.relations: list[SplitRel | FuseRel | SingletonRel] = []
        self.iter_var_attrs: dict[IterVar, IterAttr] = {}
        self.attach_type = "root"  # root | inline | scope
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.double_buffer_ = False
        self.store_predicate: Expr | None = None
        self.storage_align_: dict[int, tuple[int, int]] = {}
        self.is_output = False
        self._reset_axes()

    def _reset_axes(self) -> None:
        op = self.op
        if isinstance(op, ComputeOp):
            self.all_iter_vars: list[IterVar] = list(op.axis) + list(op.reduce_axis)
        else:
            self.all_iter_vars = []
        self.leaf_iter_vars: list[IterVar] = list(self.all_iter_vars)
        self.relations = []
        self.iter_var_attrs = {}

    @property
    def name(self) -> str:
        return self.op.name

    def __repr__(self) -> str:
        return f"Stage({self.name}, {self.attach_type})"

    # helpers --------------------------------------------------------------------------------
    def _err(self, msg: str) -> ScheduleError:
        return ScheduleError(f"stage {self.name}: {msg}")

    def _leaf_index(self, iv: Any, what: str) -> int:
        if not isinstance(iv, IterVar):
            raise self._err(f"{what}: expected an IterVar of this stage, got {iv!r}")
        for k, x in enumerate(self.leaf_iter_vars):
            if x is iv:
                return k
        if any(x is iv for x in self.all_iter_vars):
            raise self._err(
                f"{what}: axis '{iv.name}' has already been split or fused; use the axes that "
                "replaced it"
            )
        raise self._err(f"{what}: axis '{iv.name}' does not belong to this stage")

    def _new_iv(self, name: str, kind: str) -> IterVar:
        iv = IterVar(None, AxisVar(name, "int32"), kind)
        self.all_iter_vars.append(iv)
        return iv

    def _attr(self, iv: IterVar) -> IterAttr:
        a = self.iter_var_attrs.get(iv)
        if a is None:
            a = self.iter_var_attrs[iv] = IterAttr()
        return a

    def _require_compute(self, what: str) -> ComputeOp:
        if not isinstance(self.op, ComputeOp):
            raise self._err(f"{what} needs a compute stage, {self.name} is a placeholder")
        return self.op

    # loop structure -------------------------------------------------------------------------
    def split(self, parent: IterVar, factor: Any = None, nparts: Any = None) -> tuple[IterVar, IterVar]:
        """Split ``parent`` into (outer, inner) by ``factor`` (inner extent) or ``nparts``.

        Extents that do not divide are handled exactly: the tail iterations are guarded.
        """
        self._require_compute("split")
        k = self._leaf_index(parent, "split")
        if (factor is None) == (nparts is None):
            raise self._err(f"split of '{parent.name}': give exactly one of factor= or nparts=")
        from numbers import Integral

        from ..ir import dtype as dt
        from ..ir.expr import IntImm

        raw = factor if factor is not None else nparts
        val = to_expr(raw) if isinstance(raw, (Integral, Expr)) else None
        if val is None or not dt.is_int(val.dtype) or dt.lanes(val.dtype) != 1:
            raise self._err(f"split of '{parent.name}': factor/nparts must be an integer, got {raw!r}")
        if isinstance(val, IntImm) and val.value <= 0:
            raise self._err(f"split of '{parent.name}': factor/nparts must be positive, got {val.value}")
        outer = self._new_iv(parent.name + ".outer", parent.kind)
        inner = self._new_iv(parent.name + ".inner", parent.kind)
        rel = SplitRel(parent, outer, inner, val if factor is not None else None,
                       val if nparts is not None else None)
        self.relations.append(rel)
        self.leaf_iter_vars[k:k + 1] = [outer, inner]
        return outer, inner

    def tile(self, x: IterVar, y: IterVar, x_factor: Any, y_factor: Any) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Split ``x`` and ``y`` and order the loops (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes: IterVar) -> IterVar:
        """Fuse consecutive leaf axes (outermost first) into one loop.

        With no axes (TVM's special case) a new outermost loop of extent 1 named
        ``singleton`` is returned: it iterates once, and can be bound, parallelised or used as
        a compute_at target like any other leaf. As in TVM, a spatial and a reduction axis
        may be fused: the fused loop is a reduction loop (it carries the reduction, so it
        cannot be vectorized, parallelised or bound), and the reduction's init loops over it
        too, so every output point it covers is initialised before any is updated.
        """
        self._require_compute("fuse")
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        if not axes:
            one = self._new_iv("singleton", IterVarKind.DATA_PAR)
            self.relations.append(SingletonRel(one))
            self.leaf_iter_vars.insert(0, one)
            return one
        idx = [self._leaf_index(a, "fuse") for a in axes]
        for a, b in zip(idx, idx[1:]):
            if b != a + 1:
                raise self._err(
                    "fuse: axes must be adjacent leaf loops in order, got "
                    + ", ".join(x.name for x in axes)
                )
        cur = axes[0]
        for nxt in axes[1:]:
            # TVM's Stage::fuse: the fused kind is the larger one (data-parallel < reduce)
            kind = IterVarKind.REDUCE if IterVarKind.REDUCE in (cur.kind, nxt.kind) else cur.kind
            fused = self._new_iv(f"{cur.name}.{nxt.name}.fused", kind)
            self.relations.append(FuseRel(cur, nxt, fused))
            pos = self._leaf_index(cur, "fuse")
            self.leaf_iter_vars[pos:pos + 2] = [fused]
            cur = fused
        return cur

    def _root_kinds(self, iv: IterVar) -> frozenset[str]:
        """The kinds of the root axes ``iv`` iterates, through the split and fuse relations
        (empty for fuse()'s singleton)."""
        kinds: dict[IterVar, frozenset[str]] = {}

        def of(x: IterVar) -> frozenset[str]:
            return kinds.get(x, frozenset({x.kind}))

        for rel in self.relations:
            if isinstance(rel, SplitRel):
                kinds[rel.outer] = kinds[rel.inner] = of(rel.parent)
            elif isinstance(rel, FuseRel):
                kinds[rel.fused] = of(rel.outer) | of(rel.inner)
            else:
                kinds[rel.iv] = frozenset()
        return of(iv)

    def reduce_only(self, iv: IterVar) -> bool:
        """Whether ``iv`` iterates reduction axes only; a reduction's init loops over every
        other leaf (a spatial one, or one fusing spatial and reduction axes)."""
        return iv.kind == IterVarKind.REDUCE and IterVarKind.DATA_PAR not in self._root_kinds(iv)

    def fuses_spatial_and_reduce(self, iv: IterVar) -> bool:
        """Whether ``iv`` came from fusing a spatial with a reduction axis (or splitting such)."""
        kinds = self._root_kinds(iv)
        return IterVarKind.DATA_PAR in kinds and IterVarKind.REDUCE in kinds

    def reorder(self, *axes: IterVar) -> None:
        """Put ``axes`` in this order, in the positions they occupy among the leaves.

        As in TVM, a subset may be given: the listed axes are permuted among their own slots
        and every other leaf keeps its position (``reorder(d, a)`` of ``a, b, c, d`` gives
        ``d, b, c, a``).
        """
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        idx = [self._leaf_index(a, "reorder") for a in axes]
        if len(set(idx)) != len(idx):
            twice = next(a for k, a in enumerate(axes) if idx.index(idx[k]) != k)
            raise self._err(f"reorder: an axis is listed twice ('{twice.name}')")
        for pos, a in zip(sorted(idx), axes):
            self.leaf_iter_vars[pos] = a

    # annotations ----------------------------------------------------------------------------
    def _annotate(self, iv: IterVar, kind: ForKind, what: str) -> None:
        self._leaf_index(iv, what)
        if iv.kind == IterVarKind.REDUCE and kind in (ForKind.VECTORIZED, ForKind.PARALLEL):
            raise self._err(f"cannot {what} reduction axis '{iv.name}' (it carries a dependence)")
        self._attr(iv).kind = kind

    def vectorize(self, iv: IterVar) -> None:
        """Compute the loop with SIMD vectors (extent must be a constant)."""
        self._annotate(iv, ForKind.VECTORIZED, "vectorize")

    def unroll(self, iv: IterVar) -> None:
        self._annotate(iv, ForKind.UNROLLED, "unroll")

    def parallel(self, iv: IterVar) -> None:
        """Run the iterations of this loop on all cores."""
        self._annotate(iv, ForKind.PARALLEL, "parallel")

    def pragma(self, iv: IterVar, key: str, value: Any = True) -> None:
        """Attach a pragma, e.g. ``("auto_unroll_max_step", 16)`` or ``"unroll_explicit"``."""
        self._leaf_index(iv, "pragma")
        known = {"auto_unroll_max_step", "unroll_explicit", "parallel_launch_point",
                 "parallel_barrier_when_finish", "parallel_stride_pattern", "debug_skip_region"}
        if key not in known:
            raise self._err(f"pragma: unknown pragma '{key}' on axis '{iv.name}'")
        self._attr(iv).pragmas.append((key, value))

    def prefetch(self, tensor: Tensor, iv: IterVar, offset: Any) -> None:
        """Prefetch the part of ``tensor`` read ``offset`` iterations of ``iv`` ahead."""
        self._leaf_index(iv, "prefetch")
        if not isinstance(tensor, Tensor):
            raise self._err(f"prefetch: expected a Tensor, got {tensor!r}")
        self._attr(iv).prefetch.append((tensor, to_expr(offset)))

    def bind(self, iv: IterVar, thread: IterVar) -> None:
        """Bind a loop to a GPU thread index (CPU builds reject bound loops)."""
        self._leaf_index(iv, "bind")
        if not isinstance(thread, IterVar) or thread.kind != IterVarKind.THREAD:
            raise self._err(f"bind: expected te.thread_axis(...), got {thread!r}")
        if self.fuses_spatial_and_reduce(iv):
            # each output point would be reduced by several threads or blocks at once
            raise self._err(f"bind: axis '{iv.name}' fuses spatial and reduction axes, so it "
                            "carries the reduction; bind a purely spatial axis (fuse the "
                            "spatial axes alone), or rfactor the reduction first")
        self._attr(iv).bind_thread = thread

    def tensorize(self, iv: IterVar, intrin: Any) -> None:
        """Replace the loop nest rooted at ``iv`` by ``intrin`` (see te.decl_tensor_intrin)."""
        self._leaf_index(iv, "tensorize")
        self._attr(iv).tensor_intrin = intrin

    def set_store_predicate(self, predicate: Any) -> None:
        """Store the stage's results only where ``predicate`` holds (TVM's store predicate),
        e.g. ``tx.var.equal(0)`` so that one thread of a cross-thread reduction writes."""
        e = to_expr(predicate)
        if not dt.is_bool(e.dtype) and not dt.is_int(e.dtype):
            raise self._err(f"set_store_predicate: expected a boolean condition, got {e} ({e.dtype})")
        self.store_predicate = e

    def double_buffer(self) -> None:
        self.double_buffer_ = True

    def pipeline(self, depth: int = 2) -> None:
        """Load this shared stage with asynchronous copies (``cp.async``, sm_80+) into a ring of
        ``depth`` (2-4) tiles: the loads of the next ``depth - 1`` tiles of the loop it is
        computed at are in flight while the threads compute on the current one
        (passes/inject_software_pipeline.py, TVM's InjectSoftwarePipeline + cp.async)."""
        if isinstance(depth, bool) or not isinstance(depth, int) or not 2 <= depth <= 4:
            raise self._err(f"pipeline: depth must be an int in [2, 4], got {depth!r}")
        # set here, not in __init__: read with getattr(stage, "pipeline_depth_", 0)
        self.pipeline_depth_ = depth

    def set_scope(self, scope: str) -> None:
        self.scope = scope

    def storage_align(self, iv: IterVar, factor: int, offset: int) -> None:
        """Pad the stride of the dimension of ``iv`` to ``k * factor + offset`` elements."""
        op = self._require_compute("storage_align")
        for k, a in enumerate(op.axis):
            if a is iv:
                if factor <= 0:
                    raise self._err(f"storage_align: factor must be positive on '{iv.name}'")
                self.storage_align_[k] = (int(factor), int(offset))
                return
        raise self._err(f"storage_align: '{getattr(iv, 'name', iv)}' is not a root axis of this stage")

    # placement ------------------------------------------------------------------------------
    def compute_at(self, parent: Stage, iv: IterVar) -> None:
        """Compute this stage inside loop ``iv`` of ``parent`` (a consumer of this stage)."""
        self._require_compute("compute_at")
        if not isinstance(parent, Stage):
            raise self._err(f"compute_at: expected a Stage (s[T]), got {parent!r}")
        if parent is self:
            raise self._err("compute_at: a stage cannot be computed at itself")
        parent._leaf_index(iv, f"compute_at of {self.name}")
        if not self.schedule._reads(parent, self):
            raise self._err(
                f"compute_at: stage {parent.name} does not consume {self.name}; compute_at "
                f"must target a consumer (axis '{iv.name}')"
            )
        if parent.attach_type == "inline":
            raise self._err(f"compute_at: {parent.name} is inlined and has no loops")
        p: Stage | None = parent
        while p is not None:
            if p is self:
                raise self._err(f"compute_at: {parent.name} is already computed inside {self.name}")
            p = p.attach_stage
        self.attach_type = "scope"
        self.attach_stage = parent
        self.attach_ivar = iv

    def compute_inline(self) -> None:
        """Substitute this stage's body into its consumers (no buffer, no loops)."""
        op = self._require_compute("compute_inline")
        if op.reduce_axis:
            raise self._err("compute_inline: cannot inline a reduction")
        if self.is_output:
            raise self._err("compute_inline: cannot inline an output of the schedule")
        for st in self.schedule.stages:
            if st.attach_stage is self:
                raise self._err(f"compute_inline: stage {st.name} is computed at {self.name}")
        self.attach_type = "inline"
        self.attach_stage = None
        self.attach_ivar = None

    def compute_root(self) -> None:
        self.attach_type = "root"
        self.attach_stage = None
        self.attach_ivar = None


class _ReplaceLoads(ExprMutator):
    """Loads of the (op, output) keys of ``vmap`` read its tensor instead, their indices in
    the order ``perm`` (index k of the new load is index ``perm[k]`` of the old: a copy
    that stores its dimensions permuted); ``var_map``/``iv_map`` rename variables and
    reduction axes."""

    def __init__(self, vmap: dict[tuple[int, int], Tensor], var_map: dict[Var, Expr] | None = None,
                 iv_map: dict[IterVar, IterVar] | None = None, perm: Sequence[int] | None = None) -> None:
        self.vmap = vmap
        self.var_map = var_map or {}
        self.iv_map = iv_map or {}
        self.perm = perm

    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        return self.var_map.get(e, e)

    def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        t = self.vmap.get((id(e.producer.op), e.producer.value_index))
        if t is None and all(x is y for x, y in zip(idx, e.indices)):
            return e
        if t is not None and self.perm is not None:
            idx = tuple(idx[d] for d in self.perm)
        return ProducerLoad(t if t is not None else e.producer, idx)

    def visit_Reduce(self, e: Reduce) -> Expr:
        src = tuple(self.visit(s) for s in e.source)
        cond = self.visit(e.condition)
        init = tuple(self.visit(s) for s in e.init)
        axis = tuple(self.iv_map.get(a, a) for a in e.axis)
        return Reduce(e.combiner, src, axis, cond, e.value_index, init)


class Schedule:
    """The schedule of a compute DAG (``te.create_schedule``); index with a tensor or op."""

    def __init__(self, outputs: list[Operation]) -> None:
        self.outputs = outputs
        self.stages: list[Stage] = []
        self._by_op: dict[Operation, Stage] = {}
        order: list[Operation] = []
        seen: set[Operation] = set()

        def visit(op: Operation) -> None:
            if op in seen:
                return
            seen.add(op)
            for t in op.input_tensors:
                visit(t.op)
            order.append(op)

        for op in outputs:
            visit(op)
        for op in order:
            st = Stage(op, self)
            st.is_output = op in outputs
            self.stages.append(st)
            self._by_op[op] = st

    def __getitem__(self, key: Tensor | Operation) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        st = self._by_op.get(op)
        if st is None:
            name = getattr(op, "name", repr(op))
            raise ScheduleError(f"{name} is not part of this schedule")
        return st

    def stage_of(self, t: Tensor) -> Stage:
        return self[t]

    def _reads(self, consumer: Stage, producer: Stage) -> bool:
        """Does ``consumer`` depend on ``producer`` (directly or through other stages)?

        Transitive consumers are legal attach points (softmax computes ``max`` inside the
        loop of ``out``, which reads it through ``exp``); lowering later checks that every
        direct reader really sits inside the chosen loop.
        """
        todo = [consumer]
        seen: set[Stage] = set()
        while todo:
            st = todo.pop()
            if st in seen:
                continue
            seen.add(st)
            for t in st.op.input_tensors:
                src = self._by_op.get(t.op)
                if src is producer:
                    return True
                if src is not None:
                    todo.append(src)
        return False

    def _insert_stage(self, st: Stage, before: Stage) -> None:
        self.stages.insert(self.stages.index(before), st)
        self._by_op[st.op] = st

    def _readers(self, t: Tensor) -> list[Stage]:
        out = []
        for st in self.stages:
            if any(x.op is t.op and x.value_index == t.value_index for x in st.op.input_tensors):
                out.append(st)
        return out

    # body-changing primitives ---------------------------------------------------------------
    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Operation]) -> Tensor:
        """Copy ``tensor`` into a new stage that ``readers`` read instead (e.g. packing)."""
        return self._cache_read(tensor, scope, readers, None, "cache_read")

    def _cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Operation],
                    perm: Sequence[int] | None, what: str) -> Tensor:
        """`cache_read`, with the copy's dimension k the tensor's dimension ``perm[k]`` when
        ``perm`` is given (`tecomp.te.layout.cache_read_layout`; checked there)."""
        src = self[tensor]
        cur = src.op.output(tensor.value_index) if src.op is not tensor.op else tensor
        dims = list(perm) if perm is not None else list(range(len(cur.shape)))
        axis = [IterVar(Range(const(0, cur.shape[d].dtype), cur.shape[d]), AxisVar(f"ax{k}", "int32"),
                        IterVarKind.DATA_PAR) for k, d in enumerate(dims)]
        idx: list[Expr] = [const(0)] * len(dims)
        for k, d in enumerate(dims):
            idx[d] = axis[k].var
        cache_op = ComputeOp(f"{cur.op.name}.{scope}", axis, [cur[tuple(idx)]])
        cache_t = cache_op.output(0)
        reader_stages = [self[r] for r in readers]
        if not reader_stages:
            raise ScheduleError(f"{what} of {tensor.name}: give at least one reader")
        # Readers load the tensor through whichever op of ``src`` they were declared with (an
        # earlier cache_read/cache_write/rfactor may have replaced src.op since).
        src_ops = [o for o, s2 in self._by_op.items() if s2 is src]
        for rs in reader_stages:
            if not any(self._by_op.get(x.op) is src and x.value_index == cur.value_index
                       for x in rs.op.input_tensors):
                raise ScheduleError(f"{what}: stage {rs.name} does not read {tensor.name}")
        first = min(reader_stages, key=self.stages.index)
        st = Stage(cache_op, self)
        st.scope = scope
        self._insert_stage(st, first)
        for rs in reader_stages:
            op = rs.op
            assert isinstance(op, ComputeOp)
            m = _ReplaceLoads({(id(o), cur.value_index): cache_t for o in src_ops}, perm=perm)
            new_op = ComputeOp(op.name, op.axis, [m.visit(b) for b in op.body], op.tag, op.attrs)
            new_op.reduce_axis = op.reduce_axis
            self._replace_op(rs, new_op, keep_axes=True)
        return cache_t

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute ``tensor`` into a new stage; the original stage becomes a copy out of it."""
        return self._cache_write(tensor, scope, None, "cache_write")

    def _cache_write(self, tensor: Tensor, scope: str, perm: Sequence[int] | None, what: str) -> Tensor:
        """`cache_write`, with the cache's axis k the stage's axis ``perm[k]`` when ``perm`` is
        given (`tecomp.te.layout.cache_write_layout`; checked there)."""
        st = self[tensor]
        op = st.op
        if not isinstance(op, ComputeOp):
            raise ScheduleError(f"{what}: {tensor.name} is a placeholder")
        if op.num_outputs != 1:
            raise ScheduleError(f"{what}: {op.name} has several outputs (unsupported)")
        if st.relations or any(a.kind for a in st.iter_var_attrs.values()):
            raise ScheduleError(f"{what} on stage {op.name} must come before other primitives")
        dims = list(perm) if perm is not None else list(range(len(op.axis)))
        # As in TVM (CacheWriteWithReLayout): the cache stage gets fresh spatial axes but keeps
        # the declared reduce axes, and the stage of ``tensor`` keeps its declared spatial axes
        # in its new (copy) operation, so ``s[C].split(C.op.axis[0])`` and
        # ``s[CC].split(k)`` with the user's own IterVars work after cache_write. The old
        # operation leaves the schedule, so no IterVar ends up in two stages.
        var_map: dict[Var, Expr] = {}
        axis = []
        for a in (op.axis[d] for d in dims):
            na = IterVar(a.dom, AxisVar(a.var.name + ".c", a.var.dtype), a.kind)
            axis.append(na)
            var_map[a.var] = na.var
        m = _ReplaceLoads({}, var_map)
        cache_op = ComputeOp(f"{op.name}.{scope}", axis, [m.visit(b) for b in op.body])
        cache_t = cache_op.output(0)
        copy_op = ComputeOp(op.name, list(op.axis), [cache_t[tuple(op.axis[d].var for d in dims)]],
                            op.tag, op.attrs)
        cst = Stage(cache_op, self)
        cst.scope = scope
        self._insert_stage(cst, st)
        self._replace_op(st, copy_op, keep_axes=False)
        return cache_t

    def rfactor(self, tensor: Tensor, axis: IterVar, factor_axis: int = 0) -> Tensor | list[Tensor]:
        """Turn reduction leaf ``axis`` into a spatial axis of a new partial-sum stage.

        The original stage then reduces the partial results over that axis. Used to parallelise
        or vectorise reductions with little spatial parallelism. A reduction of several values
        (``T0, T1 = te.compute(..., argmax((idx, val), axis=k))``) returns one partial tensor
        per value, as TVM does.
        """
        from .rfactor import rfactor as _rfactor

        st = self[tensor]
        mixed = [iv.name for iv in st.leaf_iter_vars if st.fuses_spatial_and_reduce(iv)]
        if mixed:
            raise st._err(f"rfactor: axis '{mixed[0]}' fuses spatial and reduction axes; "
                          "rfactor needs the reduction axes apart (rfactor before fusing)")
        return _rfactor(self, tensor, axis, factor_axis)

    def _replace_op(self, st: Stage, new_op: ComputeOp, keep_axes: bool) -> None:
        old = st.op
        self._by_op[new_op] = st
        st.op = new_op
        if not keep_axes:
            st._reset_axes()
        if old is not st.origin_op:
            self._repoint_readers(st, old, new_op)

    def _repoint_readers(self, st: Stage, old: Operation, new_op: ComputeOp) -> None:
        """Make the stages that read ``old`` (an op of ``st`` that replaced its declared one)
        read ``new_op`` instead (TVM's ReplaceDataFlow).

        Declared readers load a stage through its ``origin_op``, which lowering resolves to the
        stage; but a reader made by the schedule (``cache_read``'s copy) loads the op the
        stage had then, and once a later primitive (rfactor, cache_write, another cache_read)
        replaces that op, nothing would tie the copy to the stage any more.
        """
        vmap = {(id(old), k): new_op.output(k) for k in range(new_op.num_outputs)}
        for rs in list(self.stages):
            op = rs.op
            if rs is st or not isinstance(op, ComputeOp):
                continue
            if not any(t.op is old for t in op.input_tensors):
                continue
            m = _ReplaceLoads(vmap)
            rewired = ComputeOp(op.name, op.axis, [m.visit(b) for b in op.body], op.tag, op.attrs)
            rewired.reduce_axis = op.reduce_axis
            self._replace_op(rs, rewired, keep_axes=True)


def create_schedule(ops: Operation | Tensor | Sequence[Operation | Tensor]) -> Schedule:
    """A default schedule (every stage at root, loops in declaration order) for ``ops``."""
    items: Sequence[Operation | Tensor] = ops if isinstance(ops, (list, tuple)) else [ops]  # type: ignore[list-item]
    out: list[Operation] = []
    for o in items:
        op = o.op if isinstance(o, Tensor) else o
        if not isinstance(op, Operation):  # compute, placeholder, extern (extern.py), scan
            raise ScheduleError(f"create_schedule: expected an operation or tensor, got {o!r}")
        out.append(op)
    return Schedule(out)
