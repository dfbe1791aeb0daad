"""Tuned kernels with their constant weights packed once, outside the kernel.

A relayout candidate (`tuning.space_rules.relayout_rule`) copies a convolution's weight into
a packed layout (``kernel.pack``: output channels last) as a stage of the kernel, so the user
passes the plain OIHW array -- and pays the copy on every call (for ResNet-50's late 3x3
layers, 9.4 MB of weights, a large share of the kernel). `prepacked_best` takes that copy
out (`tecomp.te.layout.hoist_layout`): the kernel is passed the packed array, and the copy
becomes a pre-transform the user runs once per weight.

>>> pp = tuning.prepacked_best(task, "conv.jsonl")                        # doctest: +SKIP
>>> fpack = tc.build(*pp.pack); f = tc.build(*pp.kernel)                   # doctest: +SKIP
>>> wp = np.empty(pp.packs[0].shape, "float32")                            # doctest: +SKIP
>>> fpack(w, wp); f(x, wp, out)                                            # doctest: +SKIP
>>> pp.export_library("out/conv.so", name="conv")  # "conv" and "conv_pack_kernel"  # doctest: +SKIP

A plain task times each candidate with its copy inside: the record chosen is the fastest with
the copy, and the hoisted kernel is that kernel minus it. A prepack task
(``SearchTask(..., prepack=True)``) times the hoisted kernel itself; its `SearchTask.apply_best`
(the plain-argument kernel) packs once per call at root (`packed_once_steps`), since where its
steps put the copy was never timed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tecomp.te.layout import HoistedLayout, hoist_layout, pack_at_root, tile_block
from tecomp.te.schedule import Schedule
from tecomp.te.tensor import Tensor

from .steps import LayoutCacheReadStep, Step
from .task import SearchTask, TuningError

if TYPE_CHECKING:
    from tecomp.runtime.export import LibraryFiles
    from tecomp.runtime.module import Module


@dataclass(frozen=True)
class Prepacked:
    """A kernel whose layout copies of inputs were hoisted out (`prepack_schedule`).

    ``schedule``/``args``: the kernel, with each hoisted copy's packed placeholder in place of
    its plain input (beside it, if the kernel still reads the plain array elsewhere).
    ``packs``: the pre-transforms (`tecomp.te.layout.HoistedLayout`), none when the schedule
    copies no input into another layout -- then the kernel is the schedule as it was.
    """

    schedule: Schedule
    args: list[Tensor]
    packs: tuple[HoistedLayout, ...]

    @property
    def kernel(self) -> tuple[Schedule, list[Tensor]]:
        """``(schedule, args)`` of the kernel, for ``tc.build(*pp.kernel)``."""
        return self.schedule, self.args

    @property
    def pack(self) -> tuple[Schedule, list[Tensor]]:
        """``(schedule, args)`` of the only pre-transform (``[plain, packed]``)."""
        if len(self.packs) != 1:
            raise TuningError(f"this kernel has {len(self.packs)} pre-transforms, not one; "
                              "use .packs")
        return self.packs[0].schedule, self.packs[0].args

    def pack_name(self, name: str, h: HoistedLayout) -> str:
        """The function name of pre-transform ``h`` next to kernel ``name``:
        ``"<name>_pack_<input>"``, e.g. ``conv_pack_kernel``."""
        return f"{name}_{h.name}"

    def build(self, name: str = "main", target: str = "llvm") -> Module:
        """The kernel (``name``) and its pre-transforms (`pack_name`) in one module, as
        `export_library` writes them."""
        import tecomp as tc

        return tc.build(self.functions(name), target=target)

    def functions(self, name: str = "main") -> list[tuple[Schedule, list[Tensor], str]]:
        """``(schedule, args, function name)`` of the kernel (``name``) and each pre-transform
        (`pack_name`): what `build` builds, and what ``tecomp export`` adds to its library."""
        return [(self.schedule, self.args, name),
                *((h.schedule, list(h.args), self.pack_name(name, h)) for h in self.packs)]

    def provenance(self, name: str = "main") -> dict[str, dict[str, Any]]:
        """Per pre-transform of kernel ``name``: which kernel argument it makes, from which
        input, and that it runs once per weight (a manifest's ``kernel_provenance``)."""
        return {self.pack_name(name, h): {
            "pre_transform_of": name, "makes": h.packed.name, "from": h.source.name,
            "order": list(h.order),
            "note": f"run once per value of {h.source.name}; pass its output to {name} as "
                    f"{h.packed.name}"} for h in self.packs}

    def export_library(self, path: str | os.PathLike[str], name: str = "main", target: str = "llvm",
                       provenance: Mapping[str, Any] | None = None) -> LibraryFiles:
        """Build (`build`) and export the kernel and its pre-transforms as one library; the
        manifest says of each pre-transform which kernel argument it makes, from which input,
        and that it runs once per weight (``kernel_provenance``)."""
        return self.build(name, target).export_library(path, provenance=provenance,
                                                        kernel_provenance=self.provenance(name))


def prepack_schedule(sch: Schedule, args: Sequence[Tensor], stages: Sequence[str],
                     blocked: bool = True) -> Prepacked:
    """Hoist the layout copies named ``stages`` (e.g. ``["kernel.pack"]``) out of ``sch``
    (changed in place) and put each packed placeholder into ``args`` where its input was.

    ``blocked``: lay each packed array out in the tiles the kernel reads it by
    (`tecomp.te.layout.tile_block`: ``[CO/16, CI, KH, KW, 16]`` for a copy computed per tile
    of 16 output channels), as the in-kernel copy had each tile; a copy computed at root is
    not blocked. Without it the packed array is the plain permutation, where a tile's weights
    lie strided across all of it (slower: the kernel reads them from memory, not a stream).
    """
    out = list(args)
    packs = []
    for name in stages:
        h = hoist_layout(sch, name, tile_block(sch, name) if blocked else None)
        packs.append(h)
        k = next((k for k, a in enumerate(out) if a.op is h.source.op), None)
        still_read = any(t.op is h.source.op for st in sch.stages for t in st.op.input_tensors)
        if k is None:
            out.append(h.packed)
        elif still_read:
            out.insert(k + 1, h.packed)
        else:
            out[k] = h.packed
    return Prepacked(sch, out, tuple(packs))


def layout_copies(steps: Sequence[Step]) -> list[str]:
    """The stages that ``steps`` make as layout copies of an input (`LayoutCacheReadStep`)."""
    return [f"{s.stage}.{s.scope}" for s in steps if isinstance(s, LayoutCacheReadStep)]


def prepacked_steps(task: SearchTask, steps: Sequence[Step], blocked: bool = True) -> Prepacked:
    """The schedule of ``steps`` with its layout copies of inputs hoisted out
    (`prepack_schedule`)."""
    sch, args = task.apply_steps(steps)
    return prepack_schedule(sch, args, layout_copies(steps), blocked)


def packed_once_steps(task: SearchTask, steps: Sequence[Step]) -> tuple[Schedule, list[Tensor]]:
    """``(schedule, args)`` of ``steps`` on the task's own (plain) arguments, each layout copy
    of an input computed once per call at root in the blocked layout the tile loop reads
    (`tecomp.te.layout.pack_at_root`), not where the steps put it.

    What `SearchTask.apply_best` returns for a prepack task: that objective ranked the kernel
    with its weights packed outside, so where the steps compute the copy was never timed and
    can repeat it per tile (3-4x slower on a ResNet 3x3 layer); this costs one pass over the
    weight per call instead. Without layout copies it is the steps' schedule as it is.
    """
    sch, args = task.apply_steps(steps)
    for name in layout_copies(steps):
        pack_at_root(sch, name, tile_block(sch, name))
    return sch, args


def prepacked_best(task: SearchTask, log: str, blocked: bool = True) -> Prepacked:
    """The best record of ``task`` in ``log`` (as `SearchTask.apply_best`), its weight copies
    hoisted out: a kernel taking the packed weight, and the pre-transform that packs it.
    When the best schedule packs nothing, ``packs`` is empty and the kernel is that schedule.

    Raises `tuning.records.NoValidRecordError` when the log has no valid record of the task.
    """
    from .records import best_record

    return prepacked_steps(task, best_record(log, task).steps, blocked)


__all__ = ["Prepacked", "layout_copies", "packed_once_steps", "prepack_schedule", "prepacked_best",
           "prepacked_steps"]
