"""loop_partition on GPU kernels: register tiles keep constant-trip loops, and a cut loop keeps
one allocation of each shared buffer (before/after pairs on hand-built kernels; the full
effect, registers and shared bytes by ptxas, is checked in tests/runtime/test_gpu_operators.py).
"""

from __future__ import annotations

from tecomp.codegen.target import Target
from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, IfThenElse, PrimFunc, StmtVisitor, Var, const
from tecomp.ir.expr import Expr
from tecomp.ir.stmt import Allocate, Stmt, barrier, seq
from tecomp.passes.loop_partition import loop_partition


class _Collect(StmtVisitor):
    def __init__(self) -> None:
        self.fors: list[For] = []
        self.allocs: list[Allocate] = []
        self.ifs: list[IfThenElse] = []

    def visit_For(self, s: For) -> None:
        self.fors.append(s)
        super().visit_For(s)

    def visit_Allocate(self, s: Allocate) -> None:
        self.allocs.append(s)
        super().visit_Allocate(s)

    def visit_IfThenElse(self, s: IfThenElse) -> None:
        self.ifs.append(s)
        super().visit_IfThenElse(s)


def collect(s: Stmt) -> _Collect:
    c = _Collect()
    c.visit_stmt(s)
    return c


def bind(v: Var, tag: str, extent: int, body: Stmt) -> For:
    return For(v, const(0), const(extent), ForKind.THREAD_BINDING, body, (("thread_tag", tag),))


def serial(v: Var, extent: int, body: Stmt) -> For:
    return For(v, const(0), const(extent), ForKind.SERIAL, body)


def func(body: Stmt, params: list[Buffer], gpu: bool, launch: dict[str, int]) -> PrimFunc:
    f = PrimFunc("k", params, body)
    if gpu:
        f.attrs["target"] = Target.parse("cuda -arch=sm_80")
        f.attrs["launch"] = {k: const(v) for k, v in launch.items()}
    return f


def register_tile(gpu: bool) -> PrimFunc:
    """Each of 8 threads accumulates a 4-element tile ``acc`` (local) of rows ``ty*4 + i`` of a
    30-row output, so the last thread's tile is ragged: ``if ty*4 + i < 30`` guards each row."""
    out = Buffer("out", (const(30),), "float32")
    acc = Buffer("acc", (const(4),), "float32", scope="local")
    ty, i = Var("ty"), Var("i")
    row = ty * 4 + i
    init = serial(i, 4, IfThenElse(row < 30, BufferStore(acc, const(1.0, "float32"), (i,))))
    i2 = Var("i")
    row2 = ty * 4 + i2
    store = serial(i2, 4, IfThenElse(row2 < 30, BufferStore(out, BufferLoad(acc, (i2,)), (row2,))))
    body = bind(ty, "threadIdx.x", 8, Allocate(acc, seq(init, store)))
    return func(body, [out], gpu, {"threadIdx.x": 8})


def test_register_tile_loops_keep_their_constant_trip_count_on_gpu() -> None:
    after = loop_partition(register_tile(gpu=True))
    loops = collect(after.body).fors[1:]  # under the thread loop
    assert [str(x.extent) for x in loops] == ["4", "4"]  # not cut at ty-dependent points
    assert len(collect(after.body).ifs) == 2  # the guards stay, as predicates per element


def test_register_tile_loops_are_cut_on_the_cpu_as_before() -> None:
    after = loop_partition(register_tile(gpu=False))
    assert len(collect(after.body).fors) > 2


def test_thread_dependent_cut_of_a_loop_not_indexing_a_local_buffer_is_still_made() -> None:
    # the guard depends on ty, the loop reads a local scalar (not indexed by the loop var) and
    # writes global memory: per-thread work that the partition may cut as before
    out = Buffer("out", (const(30),), "float32")
    acc = Buffer("acc", (const(1),), "float32", scope="local")
    ty, i = Var("ty"), Var("i")
    row = ty * 4 + i
    loop = serial(i, 4, IfThenElse(row < 30, BufferStore(out, BufferLoad(acc, (const(0),)), (row,))))
    body = bind(ty, "threadIdx.x", 8, Allocate(acc, loop))
    after = loop_partition(func(body, [out], True, {"threadIdx.x": 8}))
    assert len([x for x in collect(after.body).fors if x.var.name == "i"]) > 1


def k_tiled_sum(k_total: int) -> PrimFunc:
    """out[tx] = sum over k of A[k, tx], the k loop in tiles of 8 staged in a shared buffer
    allocated inside the tile loop (as lowering places an attached shared stage), a ragged last
    tile when ``k_total`` is not a multiple of 8."""
    A = Buffer("A", (const(k_total), const(32)), "float32")
    out = Buffer("out", (const(32),), "float32")
    sh = Buffer("sh", (const(8), const(32)), "float32", scope="shared")
    ko, ki, tx, tx2 = Var("ko"), Var("ki"), Var("tx"), Var("tx2")
    k: Expr = ko * 8 + ki
    fill = serial(ki, 8, bind(tx2, "threadIdx.x", 32, IfThenElse(
        k < k_total, BufferStore(sh, BufferLoad(A, (k, tx2)), (ki, tx2)))))
    acc = bind(tx, "threadIdx.x", 32, serial(ki, 8, IfThenElse(
        k < k_total, BufferStore(out, BufferLoad(out, (tx,)) + BufferLoad(sh, (ki, tx)), (tx,)))))
    body = serial(ko, (k_total + 7) // 8, Allocate(sh, seq(fill, barrier(), acc, barrier())))
    return func(body, [A, out], True, {"threadIdx.x": 32})


def test_a_cut_loop_keeps_one_allocation_of_its_shared_buffer() -> None:
    before = k_tiled_sum(36)  # 4 full tiles and one of 4 rows
    after = loop_partition(before)
    kos = [x for x in collect(after.body).fors if x.var.name == "ko"]
    assert len(kos) == 2  # the steady tiles without the guard, and the tail
    (alloc,) = collect(after.body).allocs
    assert alloc.buffer is before.body.body.buffer  # type: ignore[attr-defined]
    assert alloc is after.body or isinstance(after.body, Allocate)  # around both pieces
    assert all(x in collect(alloc.body).fors for x in kos)


def test_an_uncut_loop_keeps_its_allocation_in_place() -> None:
    before = k_tiled_sum(32)  # no tail: the guard is proven and dropped, nothing is copied
    after = loop_partition(before)
    (ko,) = [x for x in collect(after.body).fors if x.var.name == "ko"]
    assert isinstance(ko.body, Allocate)
