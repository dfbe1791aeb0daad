"""``tc.build``: schedule(s) -> lowered PrimFuncs -> one compiled module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import TecompError
from .ir.stmt import PrimFunc
from .te.schedule import Schedule


def _normalize(sch: Any, args: Any, name: str, debug: bool = False, target: Any = None) -> list[PrimFunc]:
    from .lowering import lower

    if isinstance(sch, PrimFunc):
        return [sch]
    if isinstance(sch, Schedule):
        if args is None:
            raise TecompError("build: pass the argument tensors, e.g. tc.build(s, [A, B, C])")
        return [lower(sch, args, name=name, debug=debug, target=target)]
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
            funcs.append(lower(s, a, name=n, debug=debug, target=target))
        names = [f.name for f in funcs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise TecompError(f"build: kernel names must be unique, repeated: {sorted(dup)}")
        return funcs
    raise TecompError(f"build: expected a te.Schedule or a list of (schedule, args, name), got {sch!r}")


def _check_name(name: str) -> None:
    if not name.isidentifier():
        raise TecompError(f"kernel name {name!r} must be a C identifier")


def build(
    sch: Any,
    args: Sequence[Any] | None = None,
    target: Any = "llvm",
    name: str = "main",
    debug: bool = False,
) -> Any:
    """Compile one schedule, or several ``(schedule, args, name)`` triples, into a Module.

    The result is callable (with one kernel) and indexable by kernel name. ``target`` is
    ``"llvm"`` for this CPU or ``"llvm -mcpu=... -mattr=..."``; ``debug=True`` bounds-checks
    every access and raises IndexError instead of touching memory out of bounds.
    """
    from .codegen.backend import backend_for
    from .codegen.target import Target

    tgt = Target.parse(target)
    funcs = _normalize(sch, args, name, debug, tgt)
    for f in funcs:
        _check_name(f.name)
    backend = backend_for(tgt)
    return backend.load(backend.codegen(funcs, tgt, debug=debug, name=funcs[0].name))
