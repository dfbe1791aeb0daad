"""Differential testing of GPU schedules: random compute DAGs under random legal cuda schedules.

The programs are those of ``test_differential.py`` (its generator, te declaration, numpy
reference, tolerances, inputs and comparison are reused), cut down to the one output a cuda
kernel has: the program's last stage and what it reads. Each example draws a random legal GPU
schedule of it, builds it for ``target="cuda"`` and checks that

* the emulated kernel (``f.emulate``, GPU semantics: blocks, lockstep threads, shared memory,
  barriers, bounds checks and the race detector) matches numpy within the CPU fuzzer's
  tolerances; a RaceError / BarrierDivergenceError / IndexError is a failure;
* a second emulation with another seed (other block and thread orders; shared and local memory
  poisoned with NaN) gives bit-identical outputs: a race-free kernel is order independent;
* the loop-nest interpreter on ``tc.lower`` of the default CPU schedule matches numpy too;
* for every fifth example, ptxas accepts the PTX for sm_80 (``f.resources`` is not None).

Legal GPU schedules (what tecomp supports): one root stage, the output; every other stage is
inlined or computed at a loop of a consumer. The root's outermost loops (after splits, fuses,
reorders) are bound to blockIdx.x/y/z, then threadIdx.x/y/z (constant extents, <= 1024 threads),
everything else is serial inside them; reduce axes are never bound to blockIdx. Stages attached
inside the thread loops are per-thread ("local", also ``cache_write(out, "local")`` and
``cache_read(X, "local", ...)``); stages attached at a blockIdx loop, or ``cache_read(A,
"shared", ...)`` stages attached there or at a serial loop inside the thread loops, are per
block ("shared") and loaded cooperatively: their axes fused/split with the inner loops bound to
every threadIdx tag of the block, at most the block's extent. Splits may leave tails; serial
loops of constant extent may be vectorized / unrolled; rfactor, storage_align and the
auto-unroll pragma are drawn too.

Cross-thread reductions (tecomp/lowering/cross_thread.py): a reduce axis, or split parts of it,
bound to 1-2 threadIdx tags (x, y, or both), the bound loop's extent being the block's extent
for that tag, and the reduction inside loops bound to every other tag of the block. Drawn for
a reduction at the root (XT_ROOT: the reduced tags take 2..128 threads, powers of two and not,
and the spatial axes the other tags; sometimes TVM's ``BF = s.rfactor(B, ki)`` with B's new
reduce axis bound and BF computed at it) and for a per-block ("shared") reduction stage
(XT_SHARED: the row softmax's max and sum, at a blockIdx loop or at a serial loop inside the
threads, reduced across 1-2 of the block's tags at their full extents, the spatial axes on the
others; sometimes rfactor onto the threads), half of them with the store predicate ``tag ==
0``. No vectorized loop encloses them. The kernel's text says which combination each took
(statistics "xthread-path-warp" / "-warps" / "-tree"); kernels with warp shuffles always go
through ptxas too.

``TECOMP_HYPOTHESIS_EXAMPLES``: as for the CPU fuzzer, but capped at 25 here (CI's budget).
``TECOMP_GPU_DIFF_EXAMPLES``: exact number of examples (long runs; overrides the cap).
``TECOMP_GPU_DIFF_SEED``: another hypothesis seed than CI's derandomized one.
``TECOMP_GPU_DIFF_LOG=path``: record failures as JSON lines and go on (long triage runs).
``TECOMP_GPU_DIFF_STATS=path``: one JSON line per example: the schedule's categories, times.
``TECOMP_GPU_DIFF_PROGRESS=path``: the replay blob of the example being run (one that hangs).
``TECOMP_GPU_DIFF_NO_SHRINK=1``: report the first failure as drawn (shrinking takes minutes).
``TECOMP_GPU_DIFF_STRICT=1``: the known tecomp bugs below fail the test instead of being skipped.
``TECOMP_GPU_DIFF_NARROW_SIBLINGS=0``: do not draw the narrower cooperative loads of bugs F and L.
``TECOMP_GPU_DIFF_LOCAL_XTHREAD=0``: do not draw the per-thread-group cross-thread reductions of
bug I (a local stage at an outer threadIdx loop of the root, reduced across the inner ones).
``TECOMP_GPU_DIFF_NO_FORK=1``: build in the test process only (each build is first tried in a
forked child, so that an LLVM abort is a reported failure instead of the end of the run).

Not drawn, because tecomp refuses them by design: a shared/local buffer whose size depends on
the symbolic dim (counted as "refused (not legal)"). Kernels the emulator would take more than
a couple of seconds on are skipped ("too slow to emulate"). Known tecomp bugs (KNOWN_BUGS,
tests/DIFFERENTIAL.md) make an example invalid and are counted as hypothesis events.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, assume, event, given, note, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Frozen, UnsatisfiedAssumption
from test_differential import (
    INTERP_BUDGET,
    Gen,
    Program,
    Sched,
    _compare,
    _inputs,
    _work,
    build_te,
    output_arrays,
    program_text,
    reference,
)

import tecomp as tc
from tecomp import te
from tecomp.arith.interval import const_bounds
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import LoweringError, ScheduleError, TecompError
from tecomp.ir.expr import IntImm
from tecomp.ir.functor import StmtVisitor
from tecomp.ir.stmt import thread_tag
from tecomp.runtime import interp
from tecomp.runtime.gpu_emulator import emulate
from tecomp.te.tensor import IterVarKind, PlaceholderOp

_N = os.environ.get("TECOMP_GPU_DIFF_EXAMPLES")
N_EXAMPLES = int(_N) if _N else min(int(os.environ.get("TECOMP_HYPOTHESIS_EXAMPLES", "50")), 25)
LOG_PATH = os.environ.get("TECOMP_GPU_DIFF_LOG")
STATS_PATH = os.environ.get("TECOMP_GPU_DIFF_STATS")
PROGRESS_PATH = os.environ.get("TECOMP_GPU_DIFF_PROGRESS")
SEED = os.environ.get("TECOMP_GPU_DIFF_SEED")
settings.register_profile(
    "differential_gpu", max_examples=N_EXAMPLES, deadline=None, derandomize=SEED is None,
    database=None, suppress_health_check=list(HealthCheck), print_blob=True,
    phases=[ph for ph in Phase if ph != Phase.shrink or not os.environ.get("TECOMP_GPU_DIFF_NO_SHRINK")],
)
PTXAS_EVERY = 5
HAVE_PTXAS = find_ptxas() is not None

BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
TAG_LIMIT = {"threadIdx.x": 1024, "threadIdx.y": 1024, "threadIdx.z": 64}
MAX_THREADS = 1024
MAX_BLOCKS = 400  # the emulator runs blocks one after another: keep launches small
# emulation cost, in units of about 50 us: statements executed (blocks x serial iterations, an
# upper bound from the loop ranges) x (1 + threads per block / 100); about two seconds at most
EMU_BUDGET = 40000
MAX_LOCAL = 512  # local memory per thread, in elements (every masked store copies it)
# refusals that are not findings: a per-block / per-thread buffer whose footprint depends on the
# symbolic size is not a legal GPU schedule (shared and local memory are sized at compile time)
NOT_LEGAL = [re.compile(r"has the non-constant shape")]
# a shared stage at a blockIdx loop whose cooperative loops bind fewer threads than the block
# has (a sibling of the root's threadIdx loop, not nested in it): bugs F and L in
# tests/DIFFERENTIAL.md, both fixed; drawn unless TECOMP_GPU_DIFF_NARROW_SIBLINGS=0 (then such
# stages use exactly the block's extents; nested ones always draw narrower ones)
NARROW_SIBLINGS = os.environ.get("TECOMP_GPU_DIFF_NARROW_SIBLINGS", "1") != "0"
# a reduction computed at an outer threadIdx loop of the root (local) and reduced across the
# threads of the inner ones (bug I in tests/DIFFERENTIAL.md, fixed); drawn unless
# TECOMP_GPU_DIFF_LOCAL_XTHREAD=0
LOCAL_XTHREAD = os.environ.get("TECOMP_GPU_DIFF_LOCAL_XTHREAD", "1") != "0"
# known tecomp bugs (tests/DIFFERENTIAL.md, "GPU schedules"): an example that hits one is
# discarded (hypothesis `assume`) and counted as an event, so the test stays green until they are
# fixed; TECOMP_GPU_DIFF_STRICT=1 makes them failures again (to check a fix)
KNOWN_BUGS: list[tuple[str, re.Pattern[str]]] = [] if os.environ.get("TECOMP_GPU_DIFF_STRICT") else [
    # (why, what the error says[, a category the example must have]); none open now
]

# cross-thread reductions (tecomp/lowering/cross_thread.py): thread counts for a reduced tag
# (powers of two reach the warp-shuffle paths, the others and y the shared-memory tree)
XT_COUNTS = {"threadIdx.x": [32, 64, 128, 16, 8, 32, 128, 12, 20, 48, 64, 4, 7],
             "threadIdx.y": [2, 4, 8, 16, 12, 20, 32, 3]}
XT_SECOND = [2, 3, 4, 8]  # the second reduced tag (x and y together: always the tree)
XT_ROOT = 0.6  # a reduction at the root: reduce across threads
XT_RFACTOR = 0.3  # ... by TVM's rfactor-onto-threads pattern
XT_SHARED = 0.6  # a per-block ("shared") reduction stage: reduce across the block's threads


def _single_output(p: Program) -> Program:
    """The program's last stage as the only output, with the stages and inputs it reads."""
    out = p.stages[-1]
    need, todo = {out.name}, [out.body, out.where]
    by_name = {sp.name: sp for sp in p.stages}

    def walk(node: Any) -> None:
        if isinstance(node, tuple):
            if node and node[0] == "load" and node[1] not in need:
                need.add(node[1])
                if node[1] in by_name:
                    todo.extend([by_name[node[1]].body, by_name[node[1]].where])
            for x in node:
                walk(x)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    while todo:
        walk(todo.pop())
    q = Program(p.n, [x for x in p.inputs if x[0] in need], [sp for sp in p.stages if sp.name in need],
                [out.name])
    dims = [d for _, ds, _ in p.inputs for d in ds] + [d for sp in p.stages for d in sp.dims + sp.rdims]
    q.n_val = next((d.val for d in dims if d.expr is p.n), 1)  # type: ignore[attr-defined]
    return q


class GSched(Sched):
    """Applies random legal GPU primitives to ``s`` and logs them as text; ``cats`` collects
    the categories of the schedule (for the statistics of long runs)."""

    def __init__(self, g: Gen, p: Program, T: dict[str, te.Tensor]) -> None:
        super().__init__(g, p, T)
        self.cats: set[str] = set()
        self.scope: dict[Any, str] = {}  # stage -> explicit scope ("shared" / "local")
        self.placed: dict[Any, str] = {}  # attached stage -> "local" / "shared" (what it became)
        self.block: dict[str, int] = {}  # threadIdx tag -> extent of the root's block
        self.bound: dict[Any, set] = {}  # stage -> its thread-bound leaves
        self.taxis: dict[tuple, Any] = {}  # (stage, tag) -> the thread axis bound (store predicates)
        self.xtags: dict[Any, list[str]] = {}  # cross-thread reduction stage -> the tags it reduces
        self.xroot = False  # the root reduces across threads
        self.rf_threads: tuple | None = None  # TVM's rfactor onto threads at the root: (BF, tag, count)
        self.prefer: dict[Any, tuple] = {}  # stage -> (consumer, leaf) to attach it at, mostly

    def bind(self, X: Any, iv: Any, tag: str) -> None:
        t = te.thread_axis(tag)
        X.bind(iv, t)
        self.bound.setdefault(X, set()).add(iv)
        self.taxis[(X, tag)] = t
        self.log.append(f"s[{X.name}].bind({iv.name}, te.thread_axis({tag!r}))")

    def split(self, X: Any, iv: Any, by: str, v: int) -> tuple[Any, Any]:
        o, i = X.split(iv, **{by: v})
        e = self.ext.get(iv)
        q = -(-e // v) if e else None
        self.ext[o], self.ext[i] = (v, q) if by == "nparts" else (q, v)
        if e is None or e % v:
            self.cats.add("tail")
        self.log.append(f"s[{X.name}].split({iv.name}, {by}={v})")
        return o, i

    def run(self) -> Any:
        g, s = self.g, self.s
        root = next(X for X in self.computes() if X.is_output)
        # cache stages: shared copies of inputs, local copies of anything read, a local accumulator
        for X in [X for X in s.stages if isinstance(X.op, PlaceholderOp) and self.readers(X)]:
            if g.chance(0.35):
                rs = self.readers(X)
                chosen = [r for r in rs if g.chance(0.6)] or rs[:1]
                t = s.cache_read(X.op.output(0), "shared", [r.op for r in chosen])
                self.scope[s[t]] = "shared"
                self.log.append(f"cache_read({X.name}, 'shared', {[r.name for r in chosen]})")
                self.cats.add("cache_read-shared")
        if g.chance(0.15):
            X = g.pick([X for X in s.stages if self.readers(X) and X not in self.scope])
            rs = self.readers(X)
            chosen = [r for r in rs if g.chance(0.6)] or rs[:1]
            t = s.cache_read(X.op.output(0), "local", [r.op for r in chosen])
            self.scope[s[t]] = "local"
            self.log.append(f"cache_read({X.name}, 'local', {[r.name for r in chosen]})")
            self.cats.add("cache_read-local")
        # the root reduces across threads (decided here: a local accumulator would take the
        # reduction off the root)
        self.xroot = bool(root.op.reduce_axis) and g.chance(XT_ROOT)
        if not self.xroot and g.chance(0.25):
            self.scope[s[s.cache_write(root.op.output(0), "local")]] = "local"
            self.log.append(f"cache_write({root.name}, 'local')")
            self.cats.add("cache_write-local")
        reds = [X for X in self.computes() if X.op.reduce_axis]
        if self.xroot and g.chance(XT_RFACTOR):
            self.rfactor_onto_threads(root)
        elif reds and g.chance(0.2):
            self.rfactor(g.pick(reds))
            self.cats.add("rfactor")
        for X in self.computes():
            if (X is not root and X not in self.scope and not X.op.reduce_axis and g.chance(0.4)):
                X.compute_inline()
                self.log.append(f"s[{X.name}].compute_inline()")
        self.root_loops(root)
        for X in reversed(self.computes()):
            if X is not root and X.attach_type != "inline":
                self.attach(X, root)
        # no vectorized loop may enclose a cross-thread reduction (all the root's loops but its
        # serial reduce loops do)
        self.annotate(root, serial=self.serial_leaves(root), vector=root not in self.xtags)
        if any(X.op.reduce_axis for X in self.computes() if X.attach_type != "inline"):
            self.cats.add("reduction")
        if self.p.n is not None:
            self.cats.add("symbolic-n")
        return s

    # the root: blockIdx loops, threadIdx loops, serial loops ----------------------------------
    def root_loops(self, X: Any) -> None:
        g = self.g
        for iv in X.leaf_iter_vars:
            e = iv.dom.extent if iv.dom is not None else None
            self.ext[iv] = e.value if isinstance(e, IntImm) else None
        sp = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.DATA_PAR]
        rd = [iv for iv in X.leaf_iter_vars if iv.kind != IterVarKind.DATA_PAR]
        if len(sp) > 1:
            sp = list(g.draw(st.permutations(sp)))
            X.reorder(*sp, *rd)
            self.log.append(f"s[{X.name}].reorder({', '.join(iv.name for iv in sp + rd)})")
            if g.chance(0.3):  # fuse a run of adjacent spatial axes
                a = g.draw(st.integers(0, len(sp) - 2))
                b = g.draw(st.integers(a + 1, len(sp) - 1))
                f = X.fuse(*sp[a:b + 1])
                es = [self.ext[iv] for iv in sp[a:b + 1]]
                self.ext[f] = math.prod(es) if all(es) else None  # type: ignore[arg-type]
                self.log.append(f"s[{X.name}].fuse({', '.join(iv.name for iv in sp[a:b + 1])})")
                sp[a:b + 1] = [f]
        blocks: list = []  # (leaf, tag)
        threads: list = []
        serial: list = []
        xr: list = []  # (reduce leaf, tag): a cross-thread reduction
        if self.xroot:
            xr, rd = self.reduce_threads(X, rd)
        nthreads, nblocks = math.prod(self.ext[iv] for iv, _ in xr), 1  # type: ignore[misc]
        free = [t for t in THREAD_TAGS if t not in {t for _, t in xr}]  # the spatial axes' tags
        # x reduced by 2-16 threads: often as many spatial threads as make whole warps (the
        # warp-shuffle path needs them)
        want = (32 // nthreads * g.pick([1, 2]) if len(xr) == 1 and xr[0][1] == "threadIdx.x"
                and nthreads < 32 and 32 % nthreads == 0 and g.chance(0.85) else None)
        for k, iv in enumerate(sp):
            ttag = free[len(threads)] if len(threads) < len(free) else None
            room = min(MAX_THREADS // nthreads, TAG_LIMIT[ttag]) if ttag else 0
            f = 0  # how much of this axis the threads take: a constant factor (tails allowed)
            if want is not None and room >= want:
                f, want = -want, None  # exactly this many (negative: no whole-axis / nparts variant)
                if g.chance(0.3):
                    iv, inner = self.split(X, iv, "factor", g.pick([2, 3, 4]))
                    serial.append(inner)
            elif room >= 1 and ((k == len(sp) - 1 and not threads and not xr) or g.chance(0.7)):
                if g.chance(0.3):  # a serial inner piece below the threads (vectorize, unroll)
                    iv, inner = self.split(X, iv, "factor", g.pick([2, 3, 4]))
                    serial.append(inner)
                e = self.ext[iv]
                big = min(room, 64 if e is None else e + 3)
                if e is not None and e <= room and g.chance(0.3):
                    f = e  # the whole axis
                elif g.chance(0.5):
                    f = max(1, min(g.pick([1, 2, 3, 4, 5, 7, 8, 16, 32, 64, 128, 256]), big))
                else:
                    f = g.draw(st.integers(1, big))
            e = self.ext[iv]
            if f < 0:
                o_iv, t_iv = self.split(X, iv, "factor", -f)
            elif f and e is not None and f >= e and g.chance(0.6):
                t_iv, o_iv = iv, None  # the whole axis is the threads
            elif f and e is not None and g.chance(0.2):
                o_iv, t_iv = self.split(X, iv, "nparts", -(-e // f))  # inner extent <= f
            elif f:
                o_iv, t_iv = self.split(X, iv, "factor", f)
            else:
                t_iv, o_iv = None, iv
            if t_iv is not None:
                threads.append((t_iv, ttag))
                nthreads *= self.ext[t_iv]  # type: ignore[operator]
            if o_iv is not None:
                eo = self.ext[o_iv] or 20
                if len(blocks) < 3 and nblocks * eo <= MAX_BLOCKS and g.chance(0.85):
                    blocks.append((o_iv, BLOCK_TAGS[len(blocks)]))
                    nblocks *= eo
                else:
                    serial.append(o_iv)
        assert threads or xr  # the last spatial axis always gives some
        # reduce axes: sometimes split (attach points for shared tiles, like k.outer of a GEMM)
        for r in rd:
            if g.chance(0.4):
                by, v = ("nparts" if g.chance(0.3) else "factor"), g.draw(st.integers(1, 8))
                self.ext.setdefault(r, None)
                serial.extend(self.split(X, r, by, v))
            else:
                serial.append(r)
        serial = [iv for iv in X.leaf_iter_vars if iv in serial]  # the split order
        if len(serial) > 1 and g.chance(0.5):
            serial = list(g.draw(st.permutations(serial)))
        blocks = list(g.draw(st.permutations(blocks))) if len(blocks) > 1 else blocks
        threads += xr
        threads = list(g.draw(st.permutations(threads))) if len(threads) > 1 else threads
        order = [b[0] for b in blocks] + [t[0] for t in threads] + serial
        X.reorder(*order)
        self.log.append(f"s[{X.name}].reorder({', '.join(iv.name for iv in order)})")
        for iv, tag in blocks + threads:
            self.bind(X, iv, tag)
        self.block = {tag: self.ext[iv] for iv, tag in threads}  # type: ignore[misc]
        self.nblock = len(blocks)
        if xr:
            self.cross_thread(X, [t for _, t in xr], "xthread-root")
            if self.rf_threads is not None:  # BF at the thread-bound reduce loop (TVM's tutorial)
                self.prefer[self.rf_threads[0]] = (X, xr[0][0])
        if len(threads) > 1:
            self.cats.add("2d-threads")
        if any(tag.endswith(".z") for _, tag in blocks + threads):
            self.cats.add("z-tags")
        if not blocks:
            self.cats.add("one-block")

    def serial_leaves(self, X: Any) -> list:
        return [iv for iv in X.leaf_iter_vars if iv not in self.bound.get(X, set())]

    # cross-thread reductions ----------------------------------------------------------------
    def rfactor_onto_threads(self, X: Any) -> None:
        """TVM's pattern: split the reduction, ``BF = s.rfactor(X, part)`` with ``part`` of the
        thread count's extent; X then reduces BF over that axis, which root_loops binds."""
        g = self.g
        for iv in X.leaf_iter_vars:
            e = iv.dom.extent if iv.dom is not None else None
            self.ext[iv] = e.value if isinstance(e, IntImm) else None
        rd = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]
        r = self.fuse_reduce(X, rd) if len(rd) > 1 and g.chance(0.5) else g.pick(rd)
        tag = "threadIdx.x" if g.chance(0.8) else "threadIdx.y"
        T = g.pick(XT_COUNTS[tag])
        o, i = self.split(X, r, *(("factor", T) if g.chance(0.7) else ("nparts", T)))
        part = i if self.ext[i] == T else o
        if self.ext[r] is None or self.ext[r] % T:
            self.cats.add("xthread-tail")
        fa = g.draw(st.integers(0, len(X.op.axis)))
        BF = self.s[self.s.rfactor(X.op.output(0), part, fa)]
        self.log.append(f"{BF.name} = s.rfactor({X.name}, {part.name}, factor_axis={fa})")
        self.rf_threads = (BF, tag, T)
        self.cats.add("xthread-rfactor")

    def fuse_reduce(self, X: Any, rd: list) -> Any:
        es = [self.ext.get(iv) for iv in rd]
        r = X.fuse(*rd)
        self.ext[r] = math.prod(es) if all(es) else None  # type: ignore[arg-type]
        self.log.append(f"s[{X.name}].fuse({', '.join(iv.name for iv in rd)})")
        return r

    def thread_split(self, X: Any, rd: list, plan: list[tuple[str, int]]) -> tuple[list, list]:
        """Bind parts of one of the reduce leaves ``rd`` to the tags of ``plan`` (tag, thread
        count): [(leaf, tag)], and the reduce leaves left serial."""
        g = self.g
        if len(rd) > 1 and g.chance(0.3):
            rd = [self.fuse_reduce(X, rd)]
        r = g.pick(rd)
        rest = [iv for iv in rd if iv is not r]
        out: list = []
        for j, (tag, T) in enumerate(plan):
            e = self.ext.get(r)
            if e == T and j == len(plan) - 1:  # the whole axis
                out.append((r, tag))
                return out, rest
            if e is None or e % T:
                self.cats.add("xthread-tail")
            if g.chance(0.7):
                r, i = self.split(X, r, "factor", T)
                out.append((i, tag))
            else:
                o, r = self.split(X, r, "nparts", T)
                out.append((o, tag))
        return out, rest + [r]

    def reduce_threads(self, X: Any, rd: list) -> tuple[list, list]:
        """The root's reduction across threads: 1-2 tags (x, y, x and y), their counts."""
        g = self.g
        if self.rf_threads is not None:  # the rfactored root reduces over one axis of the count
            _, tag, T = self.rf_threads
            assert len(rd) == 1 and self.ext[rd[0]] == T
            return [(rd[0], tag)], []
        tags = g.pick([["threadIdx.x"]] * 4 + [["threadIdx.y"], ["threadIdx.x", "threadIdx.y"]])
        plan = [(tags[0], g.pick(XT_COUNTS[tags[0]]))] + [(t, g.pick(XT_SECOND)) for t in tags[1:]]
        e = self.ext.get(rd[0]) if len(rd) == 1 else None
        if len(tags) == 1 and e is not None and 1 < e <= 128 and g.chance(0.2):
            plan = [(tags[0], e)]  # the whole reduce axis on the threads
        return self.thread_split(X, rd, plan)

    def cross_thread(self, X: Any, tags: list[str], cat: str) -> None:
        """Record X's cross-thread reduction over ``tags``; sometimes a store predicate (the
        first thread of each group stores, as TVM's tutorial writes it)."""
        g = self.g
        self.xtags[X] = tags
        self.cats |= {"xthread", cat}
        if len(tags) > 1:
            self.cats.add("xthread-2tags")
        if any(t != "threadIdx.x" for t in tags):
            self.cats.add("xthread-not-x")
        if any(self.block[t] & (self.block[t] - 1) for t in tags):
            self.cats.add("xthread-not-pow2")
        if g.chance(0.5):
            conds = [self.taxis[(X, t)].var.equal(0) for t in tags]
            X.set_store_predicate(conds[0] if len(conds) == 1 else te.all(*conds))
            self.log.append(f"s[{X.name}].set_store_predicate({' & '.join(f'{t}.var.equal(0)' for t in tags)})")
            self.cats.add("xthread-predicate")

    def shared_threads(self, X: Any, nested: bool) -> bool:
        """A per-block reduction stage reduced by the block's threads (the row softmax's max and
        sum): 1-2 of the block's tags (extent > 1) at their full extents take parts of the
        reduction (or TVM's rfactor onto them), the spatial axes are fused and split over the
        others. False where the block has one thread."""
        g = self.g
        big = [t for t in THREAD_TAGS if self.block.get(t, 1) > 1]
        if not big:
            return False
        if len(big) > 1 and g.chance(0.3):
            rtags = sorted(g.draw(st.permutations(big))[:2], key=THREAD_TAGS.index)
        else:
            rtags = [g.pick(big)]
        for iv in X.leaf_iter_vars:
            e = iv.dom.extent if iv.dom is not None else None
            self.ext[iv] = e.value if isinstance(e, IntImm) and iv.kind == IterVarKind.REDUCE else None
        rd = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]
        if len(rtags) == 1 and g.chance(0.25):  # rfactor onto the threads, BF per thread
            T = self.block[rtags[0]]
            r = self.fuse_reduce(X, rd) if len(rd) > 1 and g.chance(0.5) else g.pick(rd)
            if self.ext[r] is None or self.ext[r] % T:
                self.cats.add("xthread-tail")
            o, i = self.split(X, r, *(("factor", T) if g.chance(0.7) else ("nparts", T)))
            part = i if self.ext[i] == T else o
            fa = g.draw(st.integers(0, len(X.op.axis)))
            BF = self.s[self.s.rfactor(X.op.output(0), part, fa)]
            self.log.append(f"{BF.name} = s.rfactor({X.name}, {part.name}, factor_axis={fa})")
            self.cats.add("xthread-rfactor")
            (r,) = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]
            xr, rest = [(r, rtags[0])], []
        else:
            BF = None
            xr, rest = self.thread_split(X, rd, [(t, self.block[t]) for t in rtags])
        sp = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.DATA_PAR]
        other = [t for t in THREAD_TAGS if t in self.block and t not in rtags]
        if other:
            f = X.fuse(*sp) if len(sp) > 1 else sp[0]
            if len(sp) > 1:
                self.log.append(f"s[{X.name}].fuse({', '.join(iv.name for iv in sp)})")
            self.ext[f] = None
            for t in other:
                f, i = self.split(X, f, "factor", self.block[t])
                self.bind(X, i, t)
        for iv, t in xr:
            self.bind(X, iv, t)
        if BF is not None:
            BF.compute_at(X, xr[0][0])
            self.placed[BF] = "local"
            self.log.append(f"s[{BF.name}].compute_at(s[{X.name}], {xr[0][0].name})  # local")
            self.loops(BF, attached=True)
            self.annotate(BF, serial=BF.leaf_iter_vars)
        elif rest and len(rest) > 1 and g.chance(0.3):
            perm = list(g.draw(st.permutations(rest)))
            X.reorder(*perm)
            self.log.append(f"s[{X.name}].reorder({', '.join(iv.name for iv in perm)})")
        self.cross_thread(X, rtags, "xthread-shared-in-threads" if nested else "xthread-shared")
        return True

    # attached stages ------------------------------------------------------------------------
    def anchor(self, E: Any, C: Any) -> Any:
        """The leaf of ``C`` under which stage ``E`` is computed (``E`` is C or attached inside)."""
        while E is not None and E.attach_stage is not C:
            E = E.attach_stage
        return None if E is None else E.attach_ivar

    def first_serial_reduce(self, C: Any) -> int:
        """Where the first serial reduce leaf of cross-thread reduction ``C`` is (its serial
        reduce loops run innermost: a stage computed at a later loop is refused), else a
        position past the end."""
        leaves = C.leaf_iter_vars
        if C not in self.xtags:
            return len(leaves)
        return next((k for k, iv in enumerate(leaves) if iv.kind == IterVarKind.REDUCE
                     and iv not in self.bound.get(C, set())), len(leaves))

    def in_thread(self, C: Any, k: int, root: Any) -> bool:
        """Is leaf ``k`` of ``C`` inside (or itself) a threadIdx loop?"""
        if C is not root and self.placed.get(C) == "local":
            return True
        leaves = C.leaf_iter_vars
        first = next((j for j, iv in enumerate(leaves) if iv in self.bound.get(C, set())
                      and str(C.iter_var_attrs[iv].bind_thread.thread_tag).startswith("threadIdx")), None)
        return first is not None and k >= first

    def attach(self, X: Any, root: Any) -> None:
        g = self.g
        rs = self.eff_readers(X)
        opts: list = []  # (C, k, kind): kind "local" | "shared"
        for C in [root] + [D for D in self.placed if D is not X]:
            if not self.s._reads(C, X):
                continue
            lim = len(C.leaf_iter_vars) - 1
            for E in rs:
                if E is C:
                    continue
                a = self.anchor(E, C)
                if a is None:
                    lim = -1
                    break
                lim = min(lim, C.leaf_iter_vars.index(a))
            for k in range(lim + 1):
                iv = C.leaf_iter_vars[k]
                if k > self.first_serial_reduce(C) and (iv.kind != IterVarKind.REDUCE
                                                        or iv in self.bound.get(C, set())):
                    continue  # a cross-thread reduction moves its serial reduce loops innermost
                inside = self.in_thread(C, k, root)
                bound = C.leaf_iter_vars[k] in self.bound.get(C, set())
                want = self.scope.get(X)
                if inside and want != "shared":
                    opts.append((C, k, "local"))
                if C is root and want != "local" and (not inside or (not bound and want == "shared")):
                    opts.append((C, k, "shared"))  # a blockIdx loop, or a serial loop in the threads
        if not opts:
            assert not X.op.reduce_axis, f"no legal place for {X.name}"
            X.compute_inline()
            self.log.append(f"s[{X.name}].compute_inline()  # nowhere else to go")
            return
        # the usual places: a tile per block at the innermost blockIdx loop, a per-thread value
        # at the innermost threadIdx loop; else anywhere legal
        nb, nt = self.nblock, self.nblock + len(self.block)
        usual = [o for o in opts if o[0] is root and (o[1], o[2]) in ((nb - 1, "shared"), (nt - 1, "local"))]
        tiles = [o for o in opts if o[2] == "shared" and self.in_thread(o[0], o[1], root)]
        pref = self.prefer.get(X)
        pref = pref and (pref[0], pref[0].leaf_iter_vars.index(pref[1]), "local")
        if pref in opts and g.chance(0.7):
            C, k, kind = pref
        elif tiles and X in self.scope and g.chance(0.5):
            C, k, kind = g.pick(tiles)  # a GEMM's tiles: at a serial (reduce) loop inside the threads
        else:
            C, k, kind = g.pick(usual) if usual and g.chance(0.5) else g.pick(opts)
        if (kind == "local" and X not in self.scope and C is root and C.leaf_iter_vars[k] not in self.bound[root]
                and g.chance(0.2)):
            kind = "shared"  # a compute stage as a shared tile at a serial loop inside the threads
            X.set_scope("shared")
            self.log.append(f"s[{X.name}].set_scope('shared')")
        leaf = C.leaf_iter_vars[k]
        X.compute_at(C, leaf)
        self.placed[X] = kind
        self.log.append(f"s[{X.name}].compute_at(s[{C.name}], {leaf.name})  # {kind}")
        self.cats.add(f"{kind}-stage")
        if kind == "local" and C is root and k < nt - 1:
            self.cats.add("local-at-outer-thread-loop")
        if X.op.reduce_axis:
            self.cats.add(f"{kind}-reduction")
        if kind == "shared":
            nested = self.in_thread(C, k, root)
            self.cats.add("shared-in-threads" if nested else "shared-at-block")
            if not (X.op.reduce_axis and g.chance(XT_SHARED) and self.shared_threads(X, nested)):
                self.cooperative(X, narrow=nested or NARROW_SIBLINGS)
        elif not (LOCAL_XTHREAD and C is root and X.op.reduce_axis and g.chance(XT_SHARED)
                  and self.local_threads(X, k, root)):
            self.loops(X, attached=True)
            self.annotate(X, serial=X.leaf_iter_vars)

    def local_threads(self, X: Any, k: int, root: Any) -> bool:
        """A reduction computed at a thread loop of the root (per thread group, local) reduced
        across the threads of the root's thread loops inside that loop (all of them: a spatial
        one would give each thread another element). False where there are none."""
        rtags = [str(root.iter_var_attrs[iv].bind_thread.thread_tag) for iv in root.leaf_iter_vars[k + 1:]
                 if iv in self.bound[root]]
        rtags = [t for t in THREAD_TAGS if t in rtags and self.block[t] > 1]
        if not rtags:
            return False
        for iv in X.leaf_iter_vars:
            e = iv.dom.extent if iv.dom is not None else None
            self.ext[iv] = e.value if isinstance(e, IntImm) and iv.kind == IterVarKind.REDUCE else None
        rd = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]
        xr, _ = self.thread_split(X, rd, [(t, self.block[t]) for t in rtags])
        for iv, t in xr:
            self.bind(X, iv, t)
        self.xtags[X] = rtags
        self.cats |= {"xthread", "xthread-local"}
        return True

    def cooperative(self, X: Any, narrow: bool) -> None:
        """Bind a shared stage's spatial loops to every threadIdx tag of the block (``narrow``:
        sometimes to fewer threads than the block has)."""
        g = self.g
        sp = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.DATA_PAR]
        rd = [iv for iv in X.leaf_iter_vars if iv.kind != IterVarKind.DATA_PAR]
        for iv in sp:
            self.ext[iv] = None  # the footprint: bound inference decides
        tags = [t for t in THREAD_TAGS if t in self.block]
        lim = {t: self.block[t] if not narrow or g.chance(0.7) else g.draw(st.integers(1, self.block[t]))
               for t in tags}
        if any(lim[t] < self.block[t] for t in tags):
            self.cats.add("narrow-coop")  # bugs F, K and L lived here
        if len(sp) >= len(tags) and len(tags) > 1 and g.chance(0.4):
            # one axis per tag, the last axis on threadIdx.x (the GEMM's tile loads)
            outers, inners = [], []
            for t, iv in zip(tags, reversed(sp)):
                o, i = self.split(X, iv, "factor", lim[t])
                outers.append(o)
                inners.append((i, t))
            rest = sp[:len(sp) - len(tags)]
            order = rest + outers[::-1] + [i for i, _ in inners[::-1]] + rd
            X.reorder(*order)
            self.log.append(f"s[{X.name}].reorder({', '.join(iv.name for iv in order)})")
            for i, t in inners:
                self.bind(X, i, t)
            self.cats.add("shared-per-axis")
            return
        f = X.fuse(*sp) if len(sp) > 1 else sp[0]
        if len(sp) > 1:
            self.log.append(f"s[{X.name}].fuse({', '.join(iv.name for iv in sp)})")
        self.ext[f] = None
        vec = None
        if g.chance(0.2):
            f, vec = self.split(X, f, "factor", g.pick([2, 4]))
        rest = f
        for t in tags:
            rest, i = self.split(X, rest, "factor", lim[t])
            self.bind(X, i, t)
        if vec is not None:
            X.vectorize(vec)
            self.log.append(f"s[{X.name}].vectorize({vec.name})")
            self.cats.add("vectorize")
        if X in self.scope and all(isinstance(a.dom.extent, IntImm) for a in X.op.axis) and g.chance(0.3):
            a, fa = g.pick(list(X.op.axis)), g.pick([2, 4, 8, 16])
            o = g.draw(st.integers(0, fa - 1))
            X.storage_align(a, fa, o)
            self.log.append(f"s[{X.name}].storage_align({a.name}, {fa}, {o})")
            self.cats.add("storage_align")

    def annotate(self, X: Any, serial: list | None = None, vector: bool = True) -> None:  # type: ignore[override]
        """Vectorize / unroll / pragma on serial loops (no parallel on a GPU)."""
        g, log = self.g, self.log
        leaves = X.leaf_iter_vars
        serial = serial if serial is not None else leaves
        taken = set()
        vec = [iv for iv in serial if iv.kind == IterVarKind.DATA_PAR and self.ext.get(iv)]
        if vec and vector and g.chance(0.4):
            iv = vec[-1] if g.chance(0.7) else g.pick(vec)
            X.vectorize(iv)
            taken.add(iv)
            log.append(f"s[{X.name}].vectorize({iv.name})")
            self.cats.add("vectorize")
        free = [iv for k, iv in enumerate(leaves) if iv in serial and iv not in taken and self.ext.get(iv)
                and math.prod(self.ext.get(x) or 99 for x in leaves[k:]) <= 64]
        if free and g.chance(0.3):
            iv = g.pick(free)
            X.unroll(iv)
            log.append(f"s[{X.name}].unroll({iv.name})")
            self.cats.add("unroll")
        if g.chance(0.1):
            iv, v = g.pick(leaves), g.pick([0, 4, 16, 64])
            X.pragma(iv, "auto_unroll_max_step", v)
            log.append(f"s[{X.name}].pragma({iv.name}, 'auto_unroll_max_step', {v})")


# the test --------------------------------------------------------------------------------------

# builds run in a fork first: an LLVM abort (bug D) would end the whole test run
FORK_BUILD = not os.environ.get("TECOMP_GPU_DIFF_NO_FORK")


def _build_dies(s: Any, args: list) -> str | None:
    """Does ``tc.build`` kill the process (LLVM assertions and fatal errors abort)? Tried in a
    fork first, so that the run goes on; returns the end of what the child wrote to stderr."""
    if not hasattr(os, "fork"):
        return None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        import faulthandler

        faulthandler.disable()
        os.close(r)
        os.dup2(w, 2)
        try:
            tc.build(s, args, target="cuda")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        err = fh.read()
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status):
        return None
    return f"signal {os.WTERMSIG(status)}: " + err.decode(errors="replace").strip()[-400:]


class _Steps(StmtVisitor):
    """Statements the emulator executes per launch (threads are numpy lanes, so a threadIdx
    loop costs nothing; blocks and serial loops multiply): an upper bound from the loop ranges."""

    def __init__(self, dims: dict) -> None:
        self.ranges: dict = {}
        self.dims = dims
        self.mult, self.steps, self.local = 1, 0, 0

    def visit_For(self, s: Any) -> None:
        hi = const_bounds(s.extent, self.ranges, var_bounds=self.dims)[1]
        hi = max(1, 64 if hi is None else hi)
        tag = thread_tag(s)
        self.ranges[s.var] = (s.min, s.extent)
        old = self.mult
        if tag is None or tag.startswith("blockIdx"):
            self.mult *= hi
        self.visit_stmt(s.body)
        self.mult = old

    def visit_BufferStore(self, s: Any) -> None:
        self.steps += self.mult

    def visit_Evaluate(self, s: Any) -> None:
        self.steps += self.mult

    def visit_Allocate(self, s: Any) -> None:
        if s.buffer.scope == "local":
            self.local += math.prod(int(d.value) if isinstance(d, IntImm) else 1 for d in s.buffer.shape)
        super().visit_Allocate(s)


def _emu_cost(f: Any, p: Program) -> tuple[int, int]:
    """(about 50 us units of emulation time, local memory elements per thread)."""
    func = f.entry_func.func
    dims = {v: (p.n_val, p.n_val) for v in func.dim_vars} if p.n is not None else {}  # type: ignore[attr-defined]
    v = _Steps(dims)
    v.visit_stmt(func.body)
    threads = math.prod(int(x.value) for k, x in f.entry_func.launch.items() if k.startswith("threadIdx"))
    return int(v.steps * (1 + threads / 100)), v.local



def _blob(data: Any) -> str:
    """The example's draws, for ``@reproduce_failure(hypothesis.__version__, blob)``."""
    try:
        from hypothesis.core import encode_failure

        return encode_failure(data.conjecture_data.choices).decode()
    except Exception:  # pragma: no cover - hypothesis internals moved
        return ""


_count = [0]


def _emulated(f: Any, p: Program, arrays: dict, ref: dict, **kw: Any) -> dict[str, np.ndarray]:
    outs = output_arrays(p, ref)
    args = [arrays[n] for n, _, _ in p.inputs] + list(outs.values())
    if kw:
        emulate(f.entry_func.func, *args, **kw)
    else:
        f.emulate(*args, seed=3)
    return outs


def _xpaths(tir: str) -> set[str]:
    """How the kernel's cross-thread reductions combine (cross_thread.py): "warp" (shuffles
    only), "warps" (shuffles, then the warps' partials in shared memory), "tree" (shared
    memory), one per reduction stage."""
    warps = set(re.findall(r"\b(\w+?)_red_warps\d", tir))
    tree = set(re.findall(r"\b(\w+?)_red_buf\d", tir))
    shfl = set(re.findall(r"shfl_xor_sync\([^,]*, (\w+?)_red_local", tir))
    return {p for p, names in (("warp", shfl - warps), ("warps", warps), ("tree", tree)) if names}


def check_example(data: Any) -> None:
    g = Gen(data.draw)
    p = _single_output(g.run())
    text = program_text(p)
    note(text)
    arg_dims = [d for _, ds, _ in p.inputs for d in ds] + p.stages[-1].dims
    assume(p.n is None or any(d.expr is p.n for d in arg_dims))  # else no argument binds n
    T = build_te(p)
    sch = GSched(g, p, T)
    arrays = _inputs(p, data.draw(st.integers(0, 2**32 - 1)))
    ref = reference(p, arrays)
    args = [T[n] for n, _, _ in p.inputs] + [T[n] for n in p.outputs]
    _count[0] += 1
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    done = "invalid"
    try:
        s = sch.run()
        if PROGRESS_PATH is not None:  # the example now running, to replay one that hangs or aborts
            with open(PROGRESS_PATH, "w") as fh:
                fh.write(_blob(data))
        try:
            died = _build_dies(s, args) if FORK_BUILD else None
            if died is not None:
                raise AssertionError(f"tc.build killed the process ({died})")
            f = tc.build(s, args, target="cuda")
        except (ScheduleError, LoweringError) as e:
            if any(r.search(str(e)) for r in NOT_LEGAL):
                event("refused (not legal): " + next(r.pattern for r in NOT_LEGAL if r.search(str(e))))
                done = "refused (not legal)"
                assume(False)
            raise
        timing["build"] = time.perf_counter() - t0
        if sch.xtags:
            sch.cats |= {f"xthread-path-{p}" for p in _xpaths(str(f.entry_func.func))}
        # ptxas on every fifth example, and on every warp-shuffle kernel (shfl.sync)
        if HAVE_PTXAS and (_count[0] % PTXAS_EVERY == 1 or sch.cats & {"xthread-path-warp", "xthread-path-warps"}):
            sch.cats.add("ptxas")
            assert f.resources is not None, f.entry_func.resources_why
        timing["cost"], local = _emu_cost(f, p)
        if timing["cost"] > EMU_BUDGET or local > MAX_LOCAL:
            event("too slow to emulate")  # a legal schedule, but seconds to minutes of emulation
            done = "too slow to emulate"
            assume(False)
        got = _emulated(f, p, arrays, ref)
        timing["emulate"] = time.perf_counter() - t0 - timing["build"]
        _compare("emulated", p, got, ref)
        again = _emulated(f, p, arrays, ref, seed=11, poison=True)
        for name in p.outputs:
            if not np.array_equal(got[name], again[name], equal_nan=True):
                bad = np.argwhere(got[name] != again[name])[0]
                raise AssertionError(f"emulated with seed 3 and seed 11 (poisoned) differ: {name} at "
                                     f"{tuple(bad)}: {got[name][tuple(bad)]!r} vs {again[name][tuple(bad)]!r}")
        if _work(p) <= INTERP_BUDGET:
            func = tc.lower(te.create_schedule(T[p.outputs[0]].op), args)
            outs = output_arrays(p, ref)
            try:
                interp.run(func, *[arrays[n] for n, _, _ in p.inputs], *outs.values(),
                           max_steps=8 * INTERP_BUDGET, poison=True)
            except TecompError as e:
                if "max_steps" not in str(e):
                    raise
            else:
                _compare("interpreter", p, outs, ref)
        for c in sorted(sch.cats):
            event(c)
        done = "ok"
    except Exception as e:
        if isinstance(e, (UnsatisfiedAssumption, Frozen)):
            raise
        known = next((why for why, r, *need in KNOWN_BUGS if r.search(f"{type(e).__name__}: {e}")
                      and set(need) <= sch.cats), None)
        if known is not None:
            event("known bug: " + known)
            done = "known bug: " + known
            assume(False)
        if LOG_PATH is None:
            raise
        entry = {"error": f"{type(e).__name__}: {e}", "program": text, "schedule": sch.log, "blob": _blob(data)}
        with open(LOG_PATH, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
        done = "failed"
    finally:
        note("\n".join(sch.log))
        if STATS_PATH is not None:  # also the invalid examples (with what they drew)
            with open(STATS_PATH, "a") as fh:
                fh.write(json.dumps({"result": done, "cats": sorted(sch.cats),
                                     "seconds": time.perf_counter() - t0, **timing}) + "\n")


@settings(settings.get_profile("differential_gpu"))
@seed(int(SEED or 0))
@given(data=st.data())
def test_differential_gpu(data: Any) -> None:
    check_example(data)
