"""``tc.build``: schedule(s) -> lowered PrimFuncs -> one compiled module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import TecompError
from .ir.stmt import PrimFunc
from .te.schedule import Schedule


def _normalize(sch: Any, args: Any, name: str, debug: bool = False, target: Any = None,
               binds: Any = None) -> list[PrimFunc]:
    from .lowering import lower

    if isinstance(sch, PrimFunc):
        return [sch]
    if isinstance(sch, Schedule):
        if args is None:
            raise TecompError("build: pass the argument tensors, e.g. tc.build(s, [A, B, C])")
        return [lower(sch, args, name=name, debug=debug, target=target, binds=binds)]
    if isinstance(sch, (list, tuple)):
        funcs: list[PrimFunc] = []
        for k, item in enumerate(sch):
            if isinstance(item, PrimFunc):
                funcs.append(item)
                continue
            if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], Schedule)):
                raise TecompError(
                    f"build: item {k} must be a (schedule, args, name) triple, got {item!r}"
                )
            s, a, n = item
            funcs.append(lower(s, a, name=n, debug=debug, target=target, binds=binds))
        names = [f.name for f in funcs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise TecompError(f"build: kernel names must be unique, repeated: {sorted(dup)}")
        return funcs
    raise TecompError(f"build: expected a te.Schedule or a list of (schedule, args, name), got {sch!r}")


def simple_pipeline(func: PrimFunc) -> PrimFunc:
    """The pass pipeline of ``tc.lower(..., simple_mode=True)``: everything but loop
    partitioning.

    This is what ``simple_mode`` means in TVM 0.19 (``CreatePassList(disable_loop_partition=
    simple_mode)``): the result is still the whole function (header included, and it can
    still be built), but each loop nest appears once, its non-divisible tails guarded by
    ``if`` conditions instead of being peeled into copies of the nest. That compact form is
    what TVM users print when reading a schedule. (TVM before 0.7 returned just the body
    statement; a PrimFunc is kept here so the result stays usable by ``tc.build``.)
    """
    from .passes.pipeline import GPU_PIPELINE, PIPELINE, run_pipeline

    target = func.attrs.get("target")
    gpu = func.attrs.get("kernels") is not None or (target is not None and target.is_gpu)
    passes = [(n, p) for n, p in (GPU_PIPELINE if gpu else PIPELINE) if n != "loop_partition"]
    return run_pipeline(func, passes)


def _check_name(name: str) -> None:
    if not name.isidentifier():
        raise TecompError(f"kernel name {name!r} must be a C identifier")


def build(
    sch: Any,
    args: Sequence[Any] | None = None,
    target: Any = "llvm",
    name: str = "main",
    debug: bool = False,
    binds: Any = None,
) -> Any:
    """Compile one schedule, or several ``(schedule, args, name)`` triples, into a Module.

    The result is callable (with one kernel) and indexable by kernel name. ``target`` is
    ``"llvm"`` for this CPU or ``"llvm -mcpu=... -mattr=..."``; ``debug=True`` bounds-checks
    every access and raises IndexError instead of touching memory out of bounds.
    A ``te.var`` in ``args`` is a scalar parameter (``f(a, 2.5, b)``); ``binds`` maps
    argument tensors to ``tc.tir.decl_buffer`` buffers (TVM's ``binds``).
    """
    from .codegen.backend import backend_for
    from .codegen.target import Target

    tgt = Target.parse(target)
    funcs = _normalize(sch, args, name, debug, tgt, binds)
    for f in funcs:
        _check_name(f.name)
    backend = backend_for(tgt)
    return backend.load(backend.codegen(funcs, tgt, debug=debug, name=funcs[0].name))
