"""thread_sync: barriers where threads exchange data through shared memory, and nowhere a barrier
could not be reached by every thread."""

from __future__ import annotations

import pytest

from tecomp.errors import LoweringError
from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, IfThenElse, PrimFunc, Var, const
from tecomp.ir.stmt import Allocate, barrier, seq
from tecomp.passes.thread_sync import thread_sync

TX = (("thread_tag", "threadIdx.x"),)


def _kernel(body, launch: int = 64) -> PrimFunc:  # noqa: ANN001
    out = Buffer("out", (const(64),), "float32")
    f = PrimFunc("k", [out], body)
    f.attrs["launch"] = {"threadIdx.x": const(launch)}
    return f


def _text(f: PrimFunc) -> list[str]:
    return [ln.strip() for ln in str(f).splitlines()[1:]]


def test_read_after_write_gets_one_barrier_and_a_loop_gets_one_at_its_end() -> None:
    out = Buffer("out", (const(64),), "float32")
    sh = Buffer("sh", (const(64),), "float32", scope="shared")
    tx, k = Var("tx"), Var("k")
    body = seq(BufferStore(sh, BufferLoad(out, (tx,)), (tx,)),
               BufferStore(out, BufferLoad(sh, ((tx + 1) % 64,)), (tx,)))
    loop = For(k, const(0), const(4), ForKind.SERIAL, body)
    f = _kernel(For(tx, const(0), const(64), ForKind.THREAD_BINDING, Allocate(sh, loop), TX))
    f.params[0] = out
    got = _text(thread_sync(f))
    assert got == [
        "thread_binding tx in range(64) thread_tag=threadIdx.x:",
        "allocate sh: float32[64] (shared)",
        "for k in range(4):",
        "sh[tx] = out[tx]",
        "syncthreads()",                       # the read of sh by other threads
        "out[tx] = sh[(tx + 1) % 64]",
        "syncthreads()",                       # before the next iteration overwrites sh
    ]


def test_no_shared_memory_means_no_change() -> None:
    out = Buffer("out", (const(64),), "float32")
    tx = Var("tx")
    f = _kernel(For(tx, const(0), const(64), ForKind.THREAD_BINDING,
                    BufferStore(out, BufferLoad(out, (tx,)) * 2.0, (tx,)), TX))
    f.params[0] = out
    assert thread_sync(f) is f


def test_existing_barrier_is_reused() -> None:
    out = Buffer("out", (const(64),), "float32")
    sh = Buffer("sh", (const(64),), "float32", scope="shared")
    tx = Var("tx")
    body = seq(BufferStore(sh, const(1.0, "float32"), (tx,)), barrier(),
               BufferStore(out, BufferLoad(sh, (63 - tx,)), (tx,)))
    f = _kernel(For(tx, const(0), const(64), ForKind.THREAD_BINDING, Allocate(sh, body), TX))
    f.params[0] = out
    assert thread_sync(f) is f


@pytest.mark.parametrize("where", ["condition", "narrow thread loop"])
def test_a_barrier_that_not_every_thread_reaches_is_refused(where: str) -> None:
    out = Buffer("out", (const(64),), "float32")
    sh = Buffer("sh", (const(64),), "float32", scope="shared")
    tx = Var("tx")
    body = seq(BufferStore(sh, const(1.0, "float32"), (tx,)),
               BufferStore(out, BufferLoad(sh, (63 - tx,)), (tx,)))
    if where == "condition":
        inner = For(tx, const(0), const(64), ForKind.THREAD_BINDING, IfThenElse(tx < 32, body), TX)
        launch = 64
    else:
        inner = For(tx, const(0), const(32), ForKind.THREAD_BINDING, body, TX)
        launch = 64
    f = _kernel(Allocate(sh, inner), launch)
    f.params[0] = out
    with pytest.raises(LoweringError, match="shared buffer sh where not every thread of the block arrives"):
        thread_sync(f)
