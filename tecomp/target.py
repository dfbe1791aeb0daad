"""TVM's ``tvm.target`` spelling: ``tvm.target.Target("cuda")`` or
``Target(target="cuda", host="llvm")`` gives the `tecomp.codegen.target.Target` that
``tc.build(..., target=...)`` also accepts as a string."""

from __future__ import annotations

from typing import Any

from .codegen.target import Target as _Target
from .errors import TecompError


def Target(target: Any, host: Any = None) -> _Target:  # noqa: N802 (TVM's name)
    """The target ``target`` ("llvm ...", "cuda -arch=sm_80" or a Target). ``host`` is the
    machine that launches GPU kernels: it can only be this machine ("llvm")."""
    if host is not None:
        h = _Target.parse(host)
        if h.kind != "llvm" or not h.is_host:
            raise TecompError(f"target host {host!r}: kernels are launched from this process, so "
                              "the host is this machine's CPU ('llvm')")
    return _Target.parse(target)


__all__ = ["Target"]
