"""cache_read / cache_write with a permuted layout: the copy stores its dimensions in another order.

``cache_read_layout(s, W, "pack", [C], (1, 2, 3, 0))`` makes ``W.pack[ci, kh, kw, co] =
W[co, ci, kh, kw]`` and has ``C`` read ``W.pack`` with its indices permuted the same way, so a
loop over ``co`` walks the copy contiguously (a vector load instead of a gather).
``cache_write_layout(s, C, "local", (0, 2, 3, 1))`` computes ``C`` into ``C.local[n, h, w, c]``
(its axes in that order) and turns ``C`` into the copy ``C[n, c, h, w] = C.local[n, h, w, c]``:
the accumulator of a tile is then contiguous along ``c``. These are the layout rewrites of a
blocked convolution (the vector over output channels) expressed as schedule primitives, so the
user's arrays keep their layout and the transform is a stage of the kernel.

``hoist_layout(s, W_pack)`` takes such a copy of a constant input out of the kernel: the copy
stage becomes an input placeholder (the kernel is passed the packed array), and the copy itself
is returned as a separate pre-transform to build and run once (see `HoistedLayout`);
``pack_at_root(s, W_pack)`` keeps it in the kernel but makes it one pass, at root, in the same
blocked layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ScheduleError
from ..ir.expr import Expr, IntImm, ProducerLoad, Reduce, Var, const
from ..ir.functor import ExprMutator
from .intrin import floordiv, floormod
from .tensor import ComputeOp, Operation, PlaceholderOp, Tensor, compute, placeholder

if TYPE_CHECKING:
    from .schedule import Schedule, Stage


def _check_order(order: Sequence[int], ndim: int, what: str) -> tuple[int, ...]:
    out = tuple(int(k) for k in order)
    if sorted(out) != list(range(ndim)):
        raise ScheduleError(f"{what}: order {tuple(order)} is not a permutation of the "
                            f"{ndim} dimensions")
    return out


def cache_read_layout(sch: Schedule, tensor: Tensor, scope: str,
                      readers: Sequence[Tensor | Operation], order: Sequence[int]) -> Tensor:
    """Copy ``tensor`` into a new stage ``"<name>.<scope>"`` whose dimension ``k`` is the
    tensor's dimension ``order[k]``; ``readers`` read the copy (indices permuted alike)."""
    perm = _check_order(order, len(tensor.shape), f"cache_read_layout of {tensor.name}")
    return sch._cache_read(tensor, scope, readers, perm, "cache_read_layout")


def cache_write_layout(sch: Schedule, tensor: Tensor, scope: str, order: Sequence[int]) -> Tensor:
    """Compute ``tensor`` into a new stage ``"<name>.<scope>"`` whose axis ``k`` is the
    tensor's axis ``order[k]``; ``tensor``'s stage becomes a copy out of it."""
    op = sch[tensor].op
    perm = _check_order(order, len(getattr(op, "axis", tensor.shape)), f"cache_write_layout of {op.name}")
    return sch._cache_write(tensor, scope, perm, "cache_write_layout")


# hoisting a layout copy out of the kernel --------------------------------------------------


@dataclass(frozen=True)
class HoistedLayout:
    """A layout copy taken out of a kernel by `hoist_layout`.

    ``packed`` is the kernel's new input: ``source`` with dimension k its dimension
    ``order[k]`` and, where ``block[k]`` is not None, that dimension split in blocks of
    ``block[k]`` whose index comes first (a blocked layout: ``[CO/16, CI, KH, KW, 16]`` for
    order (1, 2, 3, 0) and block (None, None, None, 16)).
    ``schedule`` and ``args`` (``[source, packed copy]``) are the pre-transform that makes
    that array from the plain one, for ``tc.build``: run it once per weight, then pass its
    output to the kernel on every call.
    """

    packed: Tensor
    source: Tensor
    order: tuple[int, ...]
    block: tuple[int | None, ...]
    schedule: Schedule
    args: list[Tensor]

    @property
    def name(self) -> str:
        """The pre-transform's default function name, ``"pack_<source>"``."""
        return f"pack_{self.source.name}"

    @property
    def shape(self) -> tuple[int, ...]:
        """The packed array's shape, to allocate it (``np.empty(h.shape, "float32")``)."""
        return tuple(_const_shape(self.packed, f"the packed {self.source.name}"))

    def numpy(self, plain: Any) -> Any:
        """The packed array of the numpy array ``plain`` (the pre-transform without a build:
        a reference, or for arrays the user lays out elsewhere)."""
        import numpy as np

        p = np.transpose(plain, self.order)
        blocks = [p.shape[k] if b is None else b for k, b in enumerate(self.block)]
        split = [x for e, b in zip(p.shape, blocks) for x in (e // b, b)]
        n = len(blocks)
        blocked = [k for k in range(n) if self.block[k] is not None]
        axes = [2 * k for k in blocked] + [2 * k + 1 for k in range(n)]
        axes += [2 * k for k in range(n) if k not in blocked]  # outer extent 1: dropped below
        out = np.transpose(p.reshape(split), axes)
        return np.ascontiguousarray(out.reshape(out.shape[:len(out.shape) - (n - len(blocked))]))


def _copy_order(st: Stage) -> tuple[Tensor, tuple[int, ...]]:
    """``(source placeholder, order)`` when stage ``st`` is a plain permuted copy
    ``st[i_0, ..., i_n] = P[...]`` of an input placeholder ``P`` (every index a distinct axis
    of the copy, so dimension k of the copy is ``P``'s dimension ``order[k]``); otherwise a
    ScheduleError naming the stage and what it is instead."""
    op = st.op
    what = f"hoist_layout: stage {st.name}"
    if not isinstance(op, ComputeOp):
        raise ScheduleError(f"{what} is a {type(op).__name__}, not a copy of an input")
    if op.num_outputs != 1 or op.reduce_axis:
        raise ScheduleError(f"{what} is not a plain copy (it reduces or has several outputs)")
    body = op.body[0]
    if not isinstance(body, ProducerLoad):
        raise ScheduleError(f"{what} is not a plain permuted copy of an input: its body is "
                            f"{body}, not a load")
    src = body.producer
    if not isinstance(src.op, PlaceholderOp):
        raise ScheduleError(f"{what} copies {src.op.name}, which is computed, not an input "
                            "placeholder: only copies of inputs can be done once, outside")
    axes = [a.var for a in op.axis]
    where: list[int] = []
    for idx in body.indices:
        k = next((k for k, v in enumerate(axes) if isinstance(idx, Var) and idx is v), None)
        if k is None:
            raise ScheduleError(f"{what} is not a plain permuted copy of {src.name}: it reads "
                                f"{src.name} at {', '.join(map(str, body.indices))}")
        where.append(k)
    if sorted(where) != list(range(len(axes))):
        raise ScheduleError(f"{what} is not a plain permuted copy of {src.name}: it reads "
                            f"{src.name} at {', '.join(map(str, body.indices))}")
    order = [0] * len(where)
    for d, k in enumerate(where):  # source index d is copy axis k: copy dim k = source dim d
        order[k] = d
    return src, tuple(order)


def _const_shape(t: Tensor, what: str) -> list[int]:
    out = []
    for d in t.shape:
        if not isinstance(d, IntImm):
            raise ScheduleError(f"{what}: {t.name} has the symbolic dimension {d}; blocking needs "
                                "constant shapes")
        out.append(d.value)
    return out


def _check_block(block: Sequence[int | None] | None, copy: Tensor,
                 what: str) -> tuple[int | None, ...]:
    """``block`` with None for each dimension it leaves whole (its entry None or the extent);
    every other entry must divide its dimension."""
    ndim = len(copy.shape)
    if block is None:
        return (None,) * ndim
    if len(block) != ndim:
        raise ScheduleError(f"{what}: block {tuple(block)} has {len(block)} entries for a copy of "
                            f"{ndim} dimensions")
    shape = _const_shape(copy, what)
    out: list[int | None] = []
    for k, (b, e) in enumerate(zip(block, shape)):
        if b is not None and (int(b) < 1 or e % int(b)):
            raise ScheduleError(f"{what}: block {tuple(block)} does not divide the copy's shape "
                                f"{tuple(shape)} (dimension {k})")
        out.append(None if b is None or int(b) == e else int(b))
    return tuple(out)


def tile_block(sch: Schedule, packed: Tensor | Operation | str) -> tuple[int | None, ...]:
    """The region of the copy ``packed`` that one iteration of the loop it is computed at
    writes (its whole shape when it is computed at root), per dimension; where a
    dimension's region does not divide it evenly, None (the whole dimension). As the ``block`` of
    `hoist_layout` it lays the packed array out the way the kernel's tile reads it: each
    tile's weights contiguous, as the in-kernel copy (a small local buffer) had them."""
    from ..lowering.schedule_ops import Lowering

    st = _stage_named(sch, packed)
    shape = _const_shape(st.op.output(0), f"tile_block of {st.name}")
    # a lowering of the schedule as it is, to read the copy's realized region; every
    # placeholder and output is an argument so that no check refuses it
    args = [s2.op.output(k) for s2 in sch.stages for k in range(s2.op.num_outputs)
            if isinstance(s2.op, PlaceholderOp) or s2.is_output]
    bounds = Lowering(sch, args, "tile_block").bounds.get(st)
    if bounds is None:  # inlined or not lowered as a stage: nothing to block
        return (None,) * len(shape)
    out: list[int | None] = []
    for e, ext in zip(shape, bounds.buf_ext):
        b = ext.value if isinstance(ext, IntImm) else e
        out.append(b if 0 < b < e and e % b == 0 else None)
    return tuple(out)


class _BlockLoads(ExprMutator):
    """Loads of the ops in ``ops`` read ``to`` instead, index k split as ``(i // b, i % b)``
    where ``block[k]`` is not None (the quotients first, as the blocked layout has them);
    variables and reduction axes stay."""

    def __init__(self, ops: list[Operation], to: Tensor, block: tuple[int | None, ...]) -> None:
        self.ops = ops
        self.to = to
        self.block = block

    def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        if not any(e.producer.op is o for o in self.ops):
            return ProducerLoad(e.producer, idx) if any(a is not b for a, b in zip(idx, e.indices)) else e
        outer = [floordiv(i, b) for i, b in zip(idx, self.block) if b is not None]
        inner = [i if b is None else floormod(i, b) for i, b in zip(idx, self.block)]
        return ProducerLoad(self.to, tuple(outer + inner))

    def visit_Reduce(self, e: Reduce) -> Expr:
        return Reduce(e.combiner, tuple(self.visit(x) for x in e.source), e.axis,
                      self.visit(e.condition), e.value_index, tuple(self.visit(x) for x in e.init))


def _pack_compute(src: Tensor, order: tuple[int, ...], block: tuple[int | None, ...],
                  name: str) -> Tensor:
    """``src`` permuted by ``order`` and blocked by ``block``, as a compute tensor."""
    perm_shape = [src.shape[d] for d in order]
    n = len(order)
    blocked = [k for k in range(n) if block[k] is not None]
    inner_ext: list[Expr] = [perm_shape[k] if b is None else const(b) for k, b in enumerate(block)]
    shape = [floordiv(perm_shape[k], block[k]) for k in blocked] + inner_ext  # type: ignore[arg-type]

    def body(*ax: Any) -> Any:
        outer, inner = ax[:len(blocked)], ax[len(blocked):]
        copy_idx = list(inner)
        for j, k in enumerate(blocked):
            copy_idx[k] = outer[j] * block[k] + inner[k]
        idx: list[Any] = [None] * n
        for k, d in enumerate(order):
            idx[d] = copy_idx[k]
        return src[tuple(idx)]

    return compute(tuple(shape), body, name=name)


def _schedule_pack(st: Stage, order: tuple[int, ...], block: tuple[int | None, ...]) -> None:
    """Schedule the copy ``st`` (made by `_pack_compute`) like the relayout's repack
    (benchmarks/conv_layouts.py): when the copy's innermost dimension is strided in the
    source, it walks blocks of 8 along it with the other dimensions inside, so the 8 source
    rows read stay in cache and each store is one vector. On one core: it runs once per
    weight (or once per call), and a parallel copy this short mostly measures thread wake-up."""
    n = len(order)
    nblocked = sum(b is not None for b in block)
    axes = list(st.op.axis)  # type: ignore[attr-defined]
    last = st.op.output(0).shape[-1]
    if len(axes) >= 2 and order[-1] != n - 1 and not (isinstance(last, IntImm) and last.value < 8):
        lo, li = st.split(axes[-1], factor=8)
        # the 8 rows outermost (right inside the block index when blocked), each then read
        # along all of its row: with another dimension outside them (as before), a 1x1
        # weight's pack read one float of each of 512 rows per step -- 9.7 ms for 4 MB where
        # this takes 1.3 ms
        head = nblocked
        st.reorder(*axes[:head], lo, *axes[head:-1], li)
        st.vectorize(li)


def _pack_schedule(src: Tensor, order: tuple[int, ...], block: tuple[int | None, ...],
                   name: str) -> tuple[Schedule, list[Tensor]]:
    """The pre-transform: ``src`` permuted by ``order`` (and blocked by ``block``) as a
    kernel of its own (`_schedule_pack`)."""
    from .schedule import create_schedule

    out = _pack_compute(src, order, block, name)
    s = create_schedule(out.op)
    _schedule_pack(s[out], order, block)
    return s, [src, out]


def _swap_copy(sch: Schedule, packed: Tensor | Operation | str, block: Sequence[int | None] | None,
               what: str, to: Any) -> tuple[Stage, Tensor, tuple[int, ...], tuple[int | None, ...]]:
    """Replace the layout copy ``packed`` of ``sch`` by the tensor ``to(src, order, block,
    name)`` makes (a placeholder or a root copy): its readers load that tensor, its blocks
    split as `_BlockLoads` does. Returns ``(new stage, source, order, block)``; everything is
    checked before ``sch`` changes, so an error leaves it as it was."""
    st = _stage_named(sch, packed)
    if st.is_output:
        raise ScheduleError(f"{what}: stage {st.name} is an output of the schedule")
    src, order = _copy_order(st)
    attached = [o.name for o in sch.stages if o.attach_stage is st]
    if attached:
        raise ScheduleError(f"{what}: stages {attached} are computed at {st.name}")
    blk = _check_block(block, st.op.output(0), f"{what} of {st.name}")
    # every op the stage had (cache_read made one; later primitives may have replaced it):
    # readers may load any of them
    ops = [o for o, s2 in sch._by_op.items() if s2 is st]
    name = st.name.replace(".", "_")
    if any(s2.op.name == name for s2 in sch.stages if s2 is not st):
        raise ScheduleError(f"{what}: the schedule already has a stage named {name}")
    readers = [rs for rs in sch.stages
               if rs is not st and any(any(t.op is o for o in ops) for t in rs.op.input_tensors)]
    for rs in readers:
        if not isinstance(rs.op, ComputeOp):
            raise ScheduleError(f"{what}: {st.name} is read by {rs.name}, a "
                                f"{type(rs.op).__name__} (only compute stages can read the packed input)")
    new = to(src, order, blk, name)
    m = _BlockLoads(ops, new, blk)
    for rs in readers:
        rop = rs.op
        assert isinstance(rop, ComputeOp)
        new_op = ComputeOp(rop.name, rop.axis, [m.visit(b) for b in rop.body], rop.tag, rop.attrs)
        new_op.reduce_axis = rop.reduce_axis
        sch._replace_op(rs, new_op, keep_axes=True)
        for attr in rs.iter_var_attrs.values():  # a prefetch of the copy prefetches the new tensor
            attr.prefetch = [(new if any(t.op is o for o in ops) else t, off) for t, off in attr.prefetch]
    from .schedule import Stage

    new_st = Stage(new.op, sch)
    sch.stages[sch.stages.index(st)] = new_st
    for o in ops:
        del sch._by_op[o]
    sch._by_op[new.op] = new_st
    return new_st, src, order, blk


def hoist_layout(sch: Schedule, packed: Tensor | Operation | str,
                 block: Sequence[int | None] | None = None) -> HoistedLayout:
    """Take the layout copy ``packed`` of an input out of the kernel of ``sch``.

    ``packed`` (the tensor `cache_read_layout` or ``cache_read`` returned, its operation, or
    its stage's name such as ``"kernel.pack"``) must be a plain permuted copy of an input
    placeholder. Its stage becomes a new input placeholder of the same name (dots written
    ``_``: ``kernel_pack``) that its readers load instead, so the kernel no longer touches
    the plain array: build it with ``HoistedLayout.packed`` in place of (or, if the plain
    array is still read elsewhere, beside) the source in the arguments. ``sch`` is changed in
    place, like the other schedule primitives; the returned `HoistedLayout` holds the
    pre-transform. Constant weights are the use: packing them once, outside the timed
    kernel, instead of on every call.

    ``block`` (one entry per dimension of the copy: None, or a size dividing it) lays the
    packed array out in blocks: a dimension with a size less than its extent is split, its
    block index an outer dimension. `tile_block` gives the block of the tile the kernel reads
    at a time (a copy computed inside a tile loop): without it, a tile's weights lie strided
    across the whole packed array, where the in-kernel copy had them contiguous.

    >>> WP = cache_read_layout(s, W, "pack", [C], (1, 2, 3, 0))     # doctest: +SKIP
    >>> h = hoist_layout(s, WP)                                     # doctest: +SKIP
    >>> pack = tc.build(h.schedule, h.args); f = tc.build(s, [X, h.packed, C])  # doctest: +SKIP
    >>> pack(w, wp); f(x, wp, c)                                    # doctest: +SKIP
    """
    made: list[tuple[Schedule, list[Tensor]]] = []

    def to_placeholder(src: Tensor, order: tuple[int, ...], blk: tuple[int | None, ...],
                       name: str) -> Tensor:
        made.append(_pack_schedule(src, order, blk, name))
        return placeholder(tuple(made[0][1][1].shape), src.dtype, name=name)

    new_st, src, order, blk = _swap_copy(sch, packed, block, "hoist_layout", to_placeholder)
    pack_s, pack_args = made[0]
    return HoistedLayout(new_st.op.output(0), src, order, blk, pack_s, pack_args)


def pack_at_root(sch: Schedule, packed: Tensor | Operation | str,
                 block: Sequence[int | None] | None = None) -> Tensor:
    """Compute the layout copy ``packed`` of an input once per call, at root, laid out in
    ``block`` (as `hoist_layout` lays out its pre-transform's output), instead of where it was.

    The kernel still takes the plain array, and copies all of it into the blocked layout
    before anything else. A schedule tuned with its copy hoisted out (a prepack task) places
    the copy where it was never paid for -- often inside a loop that repeats it: this puts the
    copy where it costs one pass over the input, and keeps the layout the kernel was tuned to
    read (`tile_block`). ``sch`` is changed in place; returns the new copy tensor (named like
    `hoist_layout`'s placeholder: ``kernel_pack``).
    """
    def to_root(src: Tensor, order: tuple[int, ...], blk: tuple[int | None, ...], name: str) -> Tensor:
        return _pack_compute(src, order, blk, name)

    new_st, _, order, blk = _swap_copy(sch, packed, block, "pack_at_root", to_root)
    _schedule_pack(new_st, order, blk)
    return new_st.op.output(0)


def _stage_named(sch: Schedule, key: Tensor | Operation | str) -> Stage:
    if isinstance(key, str):
        for st in sch.stages:
            if st.op.name == key:
                return st
        raise ScheduleError(f"hoist_layout: the schedule has no stage named {key!r}; stages: "
                            + ", ".join(st.op.name for st in sch.stages))
    return sch[key]


__all__ = ["HoistedLayout", "cache_read_layout", "cache_write_layout", "hoist_layout", "tile_block"]
