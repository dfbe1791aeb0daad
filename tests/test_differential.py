"""Differential testing: random compute DAGs under random legal schedules.

Every example is one random program (1-4 stages over 1-3-D float32/int32 tensors) declared with
te, a random legal schedule of it, and three executions that must agree:

* the compiled module (``tc.build``; sometimes a bounds-checked ``debug=True`` build),
* the loop-nest interpreter on ``tc.lower(s, args)`` (allocations poisoned with NaN),
* numpy evaluating the same random program directly (float64 / int64).

Float tolerances are derived per stage from a static bound on the rounding error of the program
(magnitudes and error bounds propagated through every op); programs whose float values are
provably exact (inputs are multiples of 1/4, bounded growth) must match bit for bit, which is
what makes float->int casts of them safe to test. Ints are always compared exactly.

``TECOMP_HYPOTHESIS_EXAMPLES``: number of examples (default 50; derandomized: CI is reproducible).
``TECOMP_DIFF_LOG=path``: record failures as JSON lines and go on (long triage runs).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from hypothesis import HealthCheck, assume, given, note, seed, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.ir.expr import IntImm, Reduce
from tecomp.runtime import interp
from tecomp.te.tensor import ComputeOp, IterVarKind

N_EXAMPLES = int(os.environ.get("TECOMP_HYPOTHESIS_EXAMPLES", "50"))
LOG_PATH = os.environ.get("TECOMP_DIFF_LOG")
SEED = os.environ.get("TECOMP_DIFF_SEED")  # explore other examples than CI's fixed ones
settings.register_profile(
    "differential", max_examples=N_EXAMPLES, deadline=None, derandomize=SEED is None,
    database=None, suppress_health_check=list(HealthCheck), print_blob=True,
)

EPS = 2.0 ** -23  # one float32 ulp at 1.0
FLOAT_MAX_MAG = 2.0 ** 20  # keep float magnitudes (and hence absolute errors) modest
INT_MAX_MAG = 2.0 ** 30  # int32 never overflows
GRID_BUDGET = 1200  # output points x reduction points per stage
INTERP_BUDGET = 6000  # estimated scalar iterations above which the interpreter is skipped
EXTENTS = [1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 16, 17, 19, 20]
# storage dtypes of some inputs, cast on load to the dtype the program computes in
NARROW = {"uint8": "int32", "int16": "int32", "float16": "float32", "bfloat16": "float32"}
# unit roundoff of a 16-bit float store (round to nearest even): 2**-11 / 2**-8 relative
HALF_U = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


@dataclass(frozen=True)
class Dim:
    """A tensor extent: ``expr`` (an int or the symbolic ``n``) and its value in this example."""

    expr: Any
    val: int

    def __str__(self) -> str:
        return str(self.val) if isinstance(self.expr, int) else "n"


class Info(NamedTuple):
    """Static facts about a value: dtype, |value| bound, granularity 2**-g (None: inexact), error."""

    dtype: str
    M: float
    g: int | None  # values are multiples of 2**-g
    E: float  # bound on |float32 result - exact result|


def _fin(dtype: str, M: float, g: int | None, E: float, rounds: bool = True) -> Info:
    if dtype == "int32":
        return Info(dtype, M, 0, 0.0)
    if g is not None and M * 2.0 ** g < 2.0 ** 23:
        return Info(dtype, M, g, 0.0)  # every op of it is exact in float32
    return Info(dtype, M, None, E + (EPS * M if rounds else 0.0))


def _gmax(*gs: int | None) -> int | None:
    return None if any(g is None for g in gs) else max(gs)  # type: ignore[type-var]


# Three backends evaluate the same program trees: numpy (the reference), te (the declaration)
# and text (for failure reports). Index arithmetic uses Python operators, which numpy arrays,
# te expressions, ints and `Src` all understand; the rest goes through the backend's table.
class Src(str):
    """Source text whose operators build source text."""

    __hash__ = str.__hash__

    def _op(sym: str, swap: bool = False) -> Any:  # type: ignore[misc]
        return lambda a, b: Src(f"({b} {sym} {a})" if swap else f"({a} {sym} {b})")

    __add__, __radd__, __mul__ = _op("+"), _op("+", True), _op("*")
    __floordiv__, __mod__, __truediv__ = _op("//"), _op("%"), _op("/")
    __lt__, __ge__, __eq__ = _op("<"), _op(">="), _op("==")  # type: ignore[assignment]


def _np_load(env: dict, name: str, idx: list, guard: Any, pad: Any) -> Any:
    src = env["tensors"][name]
    if guard is None:
        for i, n in zip(idx, src.shape):
            assert np.all((np.asarray(i) >= 0) & (np.asarray(i) < n)), "generator bug: OOB"
        return src[tuple(idx)]
    safe = tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, src.shape))
    return np.where(guard, src[safe], pad)


def _te_load(env: dict, name: str, idx: list, guard: Any, pad: Any) -> Any:
    ld = env["tensors"][name][tuple(idx)]
    if ld.dtype in NARROW:  # 8/16-bit storage: computed in int32 / float32 (cast on load)
        ld = ld.astype(NARROW[ld.dtype])
    return ld if guard is None else te.if_then_else(guard, ld, pad)


def _fold(f: Any) -> Any:
    return lambda cs: functools.reduce(f, cs)


NP = dict(
    dim=lambda d: d.val, imin=np.minimum, imax=np.maximum, all=_fold(np.logical_and),
    any=_fold(np.logical_or), load=_np_load, sel=np.where,
    const=lambda v, dt: np.float64(v) if dt == "float32" else np.int64(v),
    ixval=lambda ix, dt: np.asarray(ix, np.float64 if dt == "float32" else np.int64),
    cast=lambda dt, x: np.trunc(x).astype(np.int64) if dt == "int32" else np.asarray(x, np.float64),
    neg=np.negative, abs=np.abs, exp=lambda x: np.exp(np.minimum(x, 3.0)), tanh=np.tanh,
    sigmoid=lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),  # the logistic function, without overflow
    sqrt=lambda x: np.sqrt(np.abs(x)), sqrtp=lambda x: np.sqrt(np.abs(x) + 0.25),
    add=np.add, sub=np.subtract, mul=np.multiply, max=np.maximum, min=np.minimum,
    tdiv=lambda x, c: np.abs(x) // abs(c) * np.sign(x) * np.sign(c), fdiv=np.divide,
    floordiv=np.floor_divide, mod=np.mod, truncmod=np.fmod, ceildiv=lambda x, c: -(-x // c),
    band=np.bitwise_and, bxor=np.bitwise_xor, shr=np.right_shift, shl=np.left_shift,
    atan=np.arctan, log1pa=lambda x: np.log1p(np.abs(x)), fmodc=lambda x: np.fmod(x, 0.75),
)
TE = dict(
    dim=lambda d: d.expr, imin=lambda a, b: te.min(tc.const(a) if isinstance(a, int) else a, b),
    imax=lambda a, b: te.max(tc.const(a) if isinstance(a, int) else a, b),
    all=lambda cs: te.all(*cs), any=lambda cs: te.any(*cs), load=_te_load, sel=te.if_then_else,
    const=tc.const, ixval=lambda ix, dt: (tc.const(ix) if isinstance(ix, int) else ix).astype(dt),
    cast=lambda dt, x: x.astype(dt), neg=lambda x: -x, abs=te.abs,
    exp=lambda x: te.exp(te.min(x, 3.0)), tanh=te.tanh, sigmoid=te.sigmoid,
    sqrt=lambda x: te.sqrt(te.abs(x)), sqrtp=lambda x: te.sqrt(te.abs(x) + 0.25),
    add=lambda a, b: a + b, sub=lambda a, b: a - b, mul=lambda a, b: a * b, max=te.max, min=te.min,
    tdiv=te.truncdiv, fdiv=lambda x, c: x / c, floordiv=lambda x, c: x // c, mod=lambda x, c: x % c,
    truncmod=te.truncmod, ceildiv=te.ceildiv, band=lambda x, c: x & c, bxor=lambda x, c: x ^ c,
    shr=lambda x, c: x >> c, shl=lambda x, c: x << c,
    atan=te.atan, log1pa=lambda x: te.log1p(te.abs(x)), fmodc=lambda x: te.fmod(x, tc.const(0.75, "float32")),
)
TXT = {k: (lambda k: lambda *a: Src(f"{k}({', '.join(map(str, a))})"))(k) for k in NP}
TXT.update(
    dim=lambda d: Src(str(d)), imin=lambda a, b: Src(f"te.min({a}, {b})"),
    imax=lambda a, b: Src(f"te.max({a}, {b})"), all=lambda cs: Src(f"te.all({', '.join(cs)})"),
    any=lambda cs: Src(f"te.any({', '.join(cs)})"),
    load=lambda env, name, idx, guard, pad: Src(
        f"{name}[{', '.join(map(str, idx))}]" if guard is None
        else f"te.if_then_else({guard}, {name}[{', '.join(map(str, idx))}], {pad!r})"),
    sel=lambda c, a, b: Src(f"te.if_then_else({c}, {a}, {b})"),
    const=lambda v, dt: Src(f"tc.const({v!r}, {dt!r})"),
    ixval=lambda ix, dt: Src(f"({ix}).astype({dt!r})"), cast=lambda dt, x: Src(f"({x}).astype({dt!r})"),
    neg=lambda x: Src(f"(-{x})"), exp=lambda x: Src(f"te.exp(te.min({x}, 3.0))"),
    sqrt=lambda x: Src(f"te.sqrt(te.abs({x}))"), sqrtp=lambda x: Src(f"te.sqrt(te.abs({x}) + 0.25)"),
    add=Src.__add__, sub=lambda a, b: Src(f"({a} - {b})"), mul=Src.__mul__,
    tdiv=lambda x, c: Src(f"te.truncdiv({x}, {c})"), fdiv=Src.__truediv__, floordiv=Src.__floordiv__, mod=Src.__mod__,
    truncmod=lambda x, c: Src(f"te.truncmod({x}, {c})"), ceildiv=lambda x, c: Src(f"te.ceildiv({x}, {c})"),
    band=lambda x, c: Src(f"({x} & {c})"), bxor=lambda x, c: Src(f"({x} ^ {c})"),
    shr=lambda x, c: Src(f"({x} >> {c})"), shl=lambda x, c: Src(f"({x} << {c})"),
    atan=lambda x: Src(f"te.atan({x})"), log1pa=lambda x: Src(f"te.log1p(te.abs({x}))"),
    fmodc=lambda x: Src(f"te.fmod({x}, tc.const(0.75, 'float32'))"),
)
for _k in ("abs", "tanh", "sigmoid", "max", "min"):
    TXT[_k] = (lambda k: lambda *a: Src(f"te.{k}({', '.join(map(str, a))})"))(_k)


def ev(node: tuple, B: dict, env: dict) -> Any:
    """Evaluate an index / condition / value tree with backend ``B``."""
    op = node[0]
    if op == "v":
        return env[node[1]]
    if op == "c":
        return node[1]
    if op == "dim":
        return B["dim"](node[1])
    if op in ("imul", "ifdiv"):
        a = ev(node[1], B, env)
        return a * node[2] if op == "imul" else a // node[2]
    if op in ("iadd", "imod", "imin", "imax", "lt", "ge", "eq"):
        a, b = ev(node[1], B, env), ev(node[2], B, env)
        fns = dict(iadd=lambda: a + b, imod=lambda: a % b, lt=lambda: a < b, ge=lambda: a >= b,
                   eq=lambda: a == b, imin=lambda: B["imin"](a, b), imax=lambda: B["imax"](a, b))
        return fns[op]()
    if op in ("all", "any"):
        return B[op]([ev(c, B, env) for c in node[1]])
    if op == "load":
        guard = ev(node[3], B, env) if node[3] is not None else None
        return B["load"](env, node[1], [ev(i, B, env) for i in node[2]], guard, node[4])
    if op == "const":
        return B["const"](node[1], node[2])
    if op in ("ixval", "cast"):
        x = ev(node[1 if op == "ixval" else 2], B, env)
        return B["ixval"](x, node[2]) if op == "ixval" else B["cast"](node[1], x)
    if op == "un":
        return B[node[1]](ev(node[2], B, env))
    if op == "bin":
        return B[node[1]](ev(node[2], B, env), ev(node[3], B, env))
    if op == "cdiv":
        return B[node[1]](ev(node[2], B, env), node[3])
    assert op == "sel", op
    return B["sel"](ev(node[1], B, env), ev(node[2], B, env), ev(node[3], B, env))


# random programs ------------------------------------------------------------------------------


@dataclass
class StageSpec:
    name: str
    dims: list[Dim]
    body: tuple
    info: Info
    rdims: list[Dim] = field(default_factory=list)
    reducer: str = ""
    where: tuple | None = None
    init: Any = None
    store: str = ""  # float16/bfloat16: a float32 stage stored in 16 bits (an output only)


@dataclass
class Program:
    n: Any  # the te.var of the symbolic dim, or None
    inputs: list[tuple[str, list[Dim], str]]
    stages: list[StageSpec]
    outputs: list[str]

    def dims_of(self, name: str) -> list[Dim]:
        return next(d for n, d, _ in self.inputs if n == name) if name.startswith("A") else \
            next(s.dims for s in self.stages if s.name == name)


def _grid_env(dims: list[Dim], rdims: list[Dim]) -> dict:
    """Index arrays of every axis, shaped to broadcast over the grid (out axes, reduce axes)."""
    g = [d.val for d in dims + rdims]
    keys = [("s", k) for k in range(len(dims))] + [("r", k) for k in range(len(rdims))]
    return {key: np.arange(n, dtype=np.int64).reshape([n if j == k else 1 for j in range(len(g))])
            for k, (key, n) in enumerate(zip(keys, g))}


class Gen:
    """Draws one random program; static Infos are computed as the trees are built."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.prog = Program(None, [], [], [])
        self.info: dict[str, Info] = {}
        self.read: set[str] = set()

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - int(100 * p)  # shrinks to False

    def pick(self, xs: list) -> Any:
        return self.draw(st.sampled_from(xs))

    def run(self) -> Program:
        self.pool = [Dim(v, v) for v in self.draw(st.lists(st.sampled_from(EXTENTS), min_size=2, max_size=3))]
        if self.chance(0.25):
            self.prog.n = te.var("n")
            self.pool.append(Dim(self.prog.n, self.draw(st.integers(1, 20))))
        for k in range(self.draw(st.integers(1, 4))):
            self.stage(k)
        p = self.prog
        # every stage nothing reads is an output (branches), sometimes an intermediate one too
        p.outputs = [s.name for s in p.stages if s.name not in self.read]
        if len(p.stages) > 1 and self.chance(0.15):
            p.outputs = sorted({*p.outputs, self.pick([s.name for s in p.stages[:-1]])})
        for sp in p.stages:  # some float outputs nothing reads are stored in 16 bits
            if (sp.name in p.outputs and sp.name not in self.read and sp.info.dtype == "float32"
                    and not sp.reducer and self.chance(0.5)):
                sp.store = self.pick(["float16", "bfloat16"] if sp.info.M <= 60000 else ["bfloat16"])
        return p

    def dims(self, lo: int, hi: int, budget: int) -> list[Dim]:
        ds = [self.pick(self.pool) for _ in range(self.draw(st.integers(lo, hi)))]
        while math.prod(d.val for d in ds) > budget:
            big = max(range(len(ds)), key=lambda k: ds[k].val)
            ds[big] = Dim(ds[big].val // 3, ds[big].val // 3) if ds[big].val > 3 else Dim(1, 1)
        return ds

    def stage(self, k: int) -> None:
        name = f"S{k}"
        red = self.chance(0.5)
        dims = self.dims(1, 3, 400 if red else GRID_BUDGET)
        rdims = self.dims(1, 2, max(1, GRID_BUDGET // math.prod(d.val for d in dims))) if red else []
        slots = [(("s", j), d) for j, d in enumerate(dims)] + [(("r", j), d) for j, d in enumerate(rdims)]
        prev = (self.prog.stages[-1] if self.chance(0.7) else self.pick(self.prog.stages)).name if k else "new"
        self.ctx = dict(slots=slots, grid=_grid_env(dims, rdims), forced=prev)
        body, info = self.value(self.draw(st.integers(1, 3)))
        if self.ctx["forced"] is not None:
            ld, li = self.load()
            body, info = self.binop(self.pick(["add", "mul", "max"]), (body, info), (ld, li))
        spec = StageSpec(name, dims, body, info, rdims)
        if red:
            n_red = math.prod(d.val for d in rdims)
            spec.reducer = self.pick(["sum", "sum", "max", "min"])
            lim = INT_MAX_MAG if info.dtype == "int32" else FLOAT_MAX_MAG
            if spec.reducer == "sum" and n_red * info.M > lim / 8:
                spec.reducer = "max"
            if self.chance(0.3):
                spec.where = self.cond(reduce=True)
            if (spec.where is not None and spec.reducer != "sum") or self.chance(0.15):
                spec.init = self.pick([-2, 0, 1, 3]) if info.dtype == "int32" else self.pick([-2.5, 0.0, 1.25])
            iM = abs(spec.init or 0)
            if spec.reducer == "sum":
                E = n_red * info.E + EPS * n_red * n_red * info.M
                info = _fin(info.dtype, n_red * info.M + iM, _gmax(info.g, 2), E)
            else:
                info = Info(info.dtype, max(info.M, iM), _gmax(info.g, 2), info.E)
        spec.info = _fin(info.dtype, info.M, info.g, info.E)
        self.info[name] = spec.info
        self.prog.stages.append(spec)

    # index expressions ------------------------------------------------------------------------
    def slot(self, reduce_first: bool = False) -> tuple:
        slots = self.ctx["slots"]
        reds = [s for s in slots if s[0][0] == "r"]
        return self.pick(reds) if reduce_first and reds else self.pick(slots)

    def index(self, d: Dim) -> tuple[tuple, tuple | None]:
        """An index into an extent-``d`` dim, and the guard it needs (None when in bounds)."""
        ix = self.raw_index(d)
        vals = np.asarray(ev(ix, NP, self.ctx["grid"]))
        if vals.min() >= 0 and vals.max() < d.val:
            return ix, None
        fix = self.pick(["guard", "guard", "wrap", "clamp"])
        if fix != "guard":
            return (("imod", ix, ("dim", d)) if fix == "wrap" else
                    ("imin", ("imax", ix, ("c", 0)), ("iadd", ("dim", d), ("c", -1)))), None
        return ix, ("all", [("ge", ix, ("c", 0)), ("lt", ix, ("dim", d))])

    def raw_index(self, d: Dim) -> tuple:
        slots = self.ctx["slots"]
        same = [s for s in slots if s[1].val == d.val]
        kind = self.pick(["same"] * 5 + ["shift", "sum2", "rev", "div", "mod", "const", "mix", "any"])
        v1, v2 = ("v", self.slot()[0]), ("v", self.slot(True)[0])
        if kind == "same" and same:
            ix: tuple = ("v", self.pick(same)[0])
        elif kind == "shift":
            ix = ("iadd", v1, ("c", self.pick([-2, -1, 1, 2, 3])))
        elif kind == "sum2":
            ix = ("iadd", ("imul", v1, self.pick([1, 2])), v2)
        elif kind == "rev":
            ix = ("iadd", ("iadd", ("dim", d), ("c", -1)), ("imul", v1, -1))
        elif kind == "div":
            ix = ("ifdiv", ("iadd", v1, ("c", self.draw(st.integers(0, 2)))), self.draw(st.integers(2, 4)))
        elif kind == "mod":
            ix = ("imod", v1, ("c", self.draw(st.integers(2, 5))))
        elif kind == "const":
            ix = ("c", self.draw(st.integers(0, d.val - 1)))
        elif kind == "mix":
            ix = ("iadd", ("iadd", ("imul", v1, self.pick([-1, 1, 2])), ("imul", v2, self.pick([-1, 1]))),
                  ("c", self.draw(st.integers(-3, 3))))
        else:
            ix = v1
        return ix

    def cond(self, reduce: bool = False) -> tuple:
        v1, v2 = ("v", self.slot(reduce)[0]), ("v", self.slot()[0])
        kind = self.pick(["lt", "pad", "parity", "any"])
        if kind == "lt":
            return ("lt", v1, ("iadd", v2, ("c", self.draw(st.integers(-2, 2)))))
        if kind == "pad":
            d = next(s[1] for s in self.ctx["slots"] if s[0] == v1[1])
            return ("all", [("ge", v1, ("c", self.draw(st.integers(0, 2)))),
                            ("lt", v1, ("iadd", ("dim", d), ("c", -self.draw(st.integers(0, 2)))))])
        if kind == "parity":
            return ("eq", ("imod", ("iadd", v1, v2), ("c", 2)), ("c", 0))
        return ("any", [("lt", v1, ("c", 2)), ("eq", v2, ("c", 1))])

    # values -----------------------------------------------------------------------------------
    def load(self) -> tuple[tuple, Info]:
        p, ctx = self.prog, self.ctx
        names = [n for n, _, _ in p.inputs] + [s.name for s in p.stages]
        if ctx["forced"] not in (None, "new"):
            name, ctx["forced"] = ctx["forced"], None
        elif ctx["forced"] == "new" or not names or (len(p.inputs) < 3 and self.chance(0.35)):
            return self.new_input()
        else:
            name = self.pick(names)
        self.read.add(name)
        idx, guards = [], []
        for d in p.dims_of(name):
            ix, g = self.index(d)
            idx.append(ix)
            if g is not None:
                guards.extend(g[1])
        info = self.info[name]
        if not guards:
            return ("load", name, tuple(idx), None, None), info
        pad = self.pick([0, -1, 3]) if info.dtype == "int32" else self.pick([0.0, -1.0, 0.5])
        return (("load", name, tuple(idx), ("all", guards), pad),
                Info(info.dtype, max(info.M, abs(pad)), _gmax(info.g, 2), info.E))

    def new_input(self) -> tuple[tuple, Info]:
        slots, self.ctx["forced"] = self.ctx["slots"], None
        chosen = self.draw(st.permutations(slots))[: self.draw(st.integers(1, min(3, len(slots))))]
        name = f"A{len(self.prog.inputs)}"
        dtype = "int32" if self.chance(0.4) else "float32"
        # some inputs stored in 8/16 bits; their values (ints in [-8, 8] or [0, 8], multiples of
        # 1/4 in [-3, 3]) are exact in every storage dtype, so the Info stays that of the input
        storage = dtype
        if self.chance(0.5):
            storage = self.pick(["uint8", "int16"] if dtype == "int32" else ["float16", "bfloat16"])
        self.prog.inputs.append((name, [s[1] for s in chosen], storage))
        self.info[name] = Info(dtype, 8.0, 0, 0.0) if dtype == "int32" else Info(dtype, 3.0, 2, 0.0)
        return ("load", name, tuple(("v", s[0]) for s in chosen), None, None), self.info[name]

    def leaf(self) -> tuple[tuple, Info]:
        kind = self.pick(["load"] * 7 + ["ixval", "const"])
        if kind == "load" or self.ctx["forced"] is not None:
            return self.load()
        if kind == "ixval":
            ix = self.raw_index(self.pick(self.pool))
            M = float(np.abs(np.asarray(ev(ix, NP, self.ctx["grid"]))).max())
            dtype = self.pick(["int32", "float32"])
            return ("ixval", ix, dtype), Info(dtype, M, 0, 0.0)
        if self.chance(0.5):
            v = self.pick([-3, -1, 2, 5])
            return ("const", v, "int32"), Info("int32", abs(v), 0, 0.0)
        v = self.pick([-1.5, 0.25, 2.0, 3.75])
        return ("const", v, "float32"), Info("float32", abs(v), 2, 0.0)

    def to_float(self, x: tuple[tuple, Info]) -> tuple[tuple, Info]:
        n, i = x
        if i.dtype == "float32":
            return x
        return ("cast", "float32", n), _fin("float32", i.M, 0, 0.0)

    def binop(self, op: str, x: tuple[tuple, Info], y: tuple[tuple, Info]) -> tuple[tuple, Info]:
        if x[1].dtype != y[1].dtype:
            x, y = self.to_float(x), self.to_float(y)
        (a, ia), (b, ib) = x, y
        g = _gmax(ia.g, ib.g)
        if op in ("add", "sub"):
            M, E = ia.M + ib.M, ia.E + ib.E
        elif op == "mul":
            M, E = ia.M * ib.M, ia.E * ib.M + ib.E * ia.M + ia.E * ib.E
            g = None if g is None else ia.g + ib.g  # type: ignore[operator]
        else:
            M, E = max(ia.M, ib.M), max(ia.E, ib.E)
        if op not in ("max", "min") and M > (INT_MAX_MAG if ia.dtype == "int32" else FLOAT_MAX_MAG):
            return self.binop("max", x, y)
        rounds = op not in ("max", "min")
        return ("bin", op, a, b), _fin(ia.dtype, M, g, E, rounds)

    def value(self, depth: int) -> tuple[tuple, Info]:
        if depth <= 0 or self.chance(0.25):
            return self.leaf()
        kind = self.pick(["un", "bin", "bin", "bin", "sel", "cdiv", "cast"])
        x = self.value(depth - 1)
        n, i = x
        if kind == "bin":
            return self.binop(self.pick(["add", "sub", "mul", "max", "min"]), x, self.value(depth - 1))
        if kind == "sel":
            y = self.value(depth - 1)
            if i.dtype != y[1].dtype:
                x, y = self.to_float(x), self.to_float(y)
            (a, ia), (b, ib) = x, y
            return ("sel", self.cond(), a, b), Info(ia.dtype, max(ia.M, ib.M), _gmax(ia.g, ib.g), max(ia.E, ib.E))
        if kind == "cast":
            if i.dtype == "int32":
                return self.to_float(x)
            if i.E == 0.0:  # exact: truncation cannot flip between implementations
                return ("cast", "int32", n), Info("int32", i.M, 0, 0.0)
            return ("un", "neg", n), i
        if kind == "cdiv":
            if i.dtype == "int32":
                # TVM's division family and bit operations by a constant (issue 15)
                op = self.pick(["tdiv", "floordiv", "mod", "truncmod", "ceildiv", "band", "bxor",
                                "shr", "shl"])
                if op in ("band", "bxor"):
                    c = self.pick([1, 3, 7, 12, 255])
                    M = c if op == "band" else i.M + 256  # x ^ c differs from x below bit 8
                elif op in ("shr", "shl"):
                    c = self.pick([1, 2, 3])
                    M = i.M / 2 ** c + 1 if op == "shr" else i.M * 2 ** c
                    if M > INT_MAX_MAG:  # keep int32 from overflowing
                        op, M = "shr", i.M / 2 ** c + 1
                else:
                    c = self.pick([2, 3, -2, -3, 5]) if op not in ("mod", "truncmod") else self.pick([2, 3, 4, -3])
                    M = abs(c) if op in ("mod", "truncmod") else i.M / abs(c) + 1
                return ("cdiv", op, n, c), Info("int32", M, 0, 0.0)
            c = self.pick([2.0, -2.0, 4.0, 0.5, 3.0, -1.5])
            k = {2.0: 1, -2.0: 1, 4.0: 2, 0.5: -1}.get(c)
            g = None if (k is None or i.g is None) else i.g + k
            return ("cdiv", "fdiv", n, c), _fin("float32", i.M / abs(c), g, i.E / abs(c))
        if i.dtype == "int32":
            op = self.pick(["neg", "abs", "exp", "tanh"])
            if op in ("neg", "abs"):
                return ("un", op, n), i
            x = self.to_float(x)
            n, i = x
        op = self.pick(["neg", "abs", "exp", "tanh", "sigmoid", "sqrt", "atan", "log1pa", "fmodc"])
        if op in ("neg", "abs"):
            return ("un", op, n), i
        # issue 15's math, vector code in vectorized loops: atan and log1p have slopes <= 1
        # (an input error passes through unamplified) and err by a few ulp of their output;
        # fmod is exact but jumps by 0.75 at multiples of it, so only exact inputs take it
        if op == "atan":
            return ("un", op, n), _fin("float32", 1.6, None, i.E + 8 * EPS * 1.6, False)
        if op == "log1pa":
            M = math.log1p(i.M)
            return ("un", op, n), _fin("float32", M, None, i.E + 8 * EPS * M, False)
        if op == "fmodc":
            if i.E == 0.0 and i.g is not None:
                return ("un", op, n), Info("float32", 0.75, max(i.g, 2), 0.0)
            op = "tanh"
        if op == "exp":
            return ("un", op, n), _fin("float32", 20.1, None, 20.1 * i.E + 8 * EPS * 20.1, False)
        if op in ("tanh", "sigmoid"):
            return ("un", op, n), _fin("float32", 1.0, None, i.E + 8 * EPS, False)
        if i.E == 0.0:
            return ("un", "sqrt", n), _fin("float32", math.sqrt(i.M), None, 8 * EPS * math.sqrt(i.M), False)
        M = math.sqrt(i.M + 0.25)
        return ("un", "sqrtp", n), _fin("float32", M, None, i.E + EPS * (i.M + 0.25) + 8 * EPS * M, False)


@st.composite
def programs(draw: Any) -> Program:
    return Gen(draw).run()


# te declaration, numpy reference, text ---------------------------------------------------------

_REDUCERS = {"sum": te.sum, "max": te.max, "min": te.min}


def build_te(p: Program) -> dict[str, te.Tensor]:
    T: dict[str, te.Tensor] = {}
    for name, dims, dtype in p.inputs:
        T[name] = te.placeholder(tuple(d.expr for d in dims), dtype, name=name)
    for k, sp in enumerate(p.stages):
        raxes = [te.reduce_axis((0, d.expr), name=f"r{j}_{k}") for j, d in enumerate(sp.rdims)]

        def fcompute(*ax: Any, sp: StageSpec = sp, raxes: list = raxes) -> Any:
            env: dict = {("s", j): a for j, a in enumerate(ax)}
            env.update({("r", j): r.var for j, r in enumerate(raxes)})
            env["tensors"] = T
            body = ev(sp.body, TE, env)
            if not sp.reducer:
                return body.astype(sp.store) if sp.store else body
            where = ev(sp.where, TE, env) if sp.where is not None else None
            return _REDUCERS[sp.reducer](body, axis=raxes, where=where, init=sp.init)

        T[sp.name] = te.compute(tuple(d.expr for d in sp.dims), fcompute, name=sp.name)
    return T


def reference(p: Program, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    vals: dict[str, np.ndarray] = {k: v.astype(np.float64 if v.dtype.kind in "fV" else np.int64)
                                   for k, v in arrays.items()}
    for sp in p.stages:
        env = _grid_env(sp.dims, sp.rdims)
        env["tensors"] = vals
        grid = tuple(d.val for d in sp.dims + sp.rdims)
        x = np.broadcast_to(ev(sp.body, NP, env), grid)
        if sp.reducer:
            axes = tuple(range(len(sp.dims), len(grid)))
            if sp.where is not None:
                mask = np.broadcast_to(ev(sp.where, NP, env), grid)
                lim = np.iinfo(np.int32) if x.dtype.kind == "i" else np.finfo(np.float64)
                x = np.where(mask, x, {"sum": 0, "max": lim.min, "min": lim.max}[sp.reducer])
            x = {"sum": np.sum, "max": np.max, "min": np.min}[sp.reducer](x, axis=axes)
            if sp.init is not None:
                x = {"sum": np.add, "max": np.maximum, "min": np.minimum}[sp.reducer](x, sp.init)
        vals[sp.name] = np.asarray(x, np.float64 if sp.info.dtype == "float32" else np.int64)
    return vals


def program_text(p: Program) -> str:
    lines = ['n = te.var("n")'] if p.n is not None else []
    for name, dims, dtype in p.inputs:
        lines.append(f"{name} = te.placeholder(({', '.join(map(str, dims))},), {dtype!r}, name={name!r})")
    for k, sp in enumerate(p.stages):
        env: dict = {("s", j): Src(f"i{j}") for j in range(len(sp.dims))}
        env.update({("r", j): Src(f"r{j}_{k}") for j in range(len(sp.rdims))})
        for j, d in enumerate(sp.rdims):
            lines.append(f"r{j}_{k} = te.reduce_axis((0, {d}), name='r{j}_{k}')")
        body = ev(sp.body, TXT, env)
        if sp.reducer:
            rs = ", ".join(f"r{j}_{k}" for j in range(len(sp.rdims)))
            where = f", where={ev(sp.where, TXT, env)}" if sp.where is not None else ""
            init = f", init={sp.init!r}" if sp.init is not None else ""
            body = f"te.{sp.reducer}({body}, axis=[{rs}]{where}{init})"
        axes = ", ".join(f"i{j}" for j in range(len(sp.dims)))
        lines.append(f"{sp.name} = te.compute(({', '.join(map(str, sp.dims))},), lambda {axes}: {body}, "
                     f"name={sp.name!r})  # tol {sp.info.E:.3g}"
                     + (f"; body .astype({sp.store!r})" if sp.store else ""))
    lines.append(f"# outputs: {p.outputs}")
    return "\n".join(lines)


# random legal schedules ------------------------------------------------------------------------


class Sched:
    """Applies random legal primitives to ``s`` and logs them as text."""

    def __init__(self, g: Gen, p: Program, T: dict[str, te.Tensor]) -> None:
        self.g, self.p, self.T = g, p, T
        self.s = te.create_schedule([T[n].op for n in p.outputs])
        self.log: list[str] = []
        self.ext: dict[Any, int | None] = {}
        self.cache_stages: list[Any] = []

    def computes(self) -> list:
        return [x for x in self.s.stages if isinstance(x.op, ComputeOp)]

    def readers(self, X: Any) -> list:
        return [Y for Y in self.computes()
                if any(self.s._by_op.get(t.op) is X for t in Y.op.input_tensors)]

    def eff_readers(self, X: Any) -> list:
        out, todo = [], [X]
        while todo:
            for Y in self.readers(todo.pop()):
                if Y.attach_type == "inline":
                    todo.append(Y)
                elif Y not in out:
                    out.append(Y)
        return out

    def run(self) -> Any:
        g, s = self.g, self.s
        for _ in range(2):
            if g.chance(0.2):
                X = g.pick([X for X in s.stages if self.readers(X)])
                rs = self.readers(X)
                chosen = [r for r in rs if g.chance(0.6)] or rs[:1]
                t = s.cache_read(X.op.output(0), "local", [r.op for r in chosen])
                self.cache_stages.append(s[t])
                self.log.append(f"cache_read({X.name}, 'local', {[r.name for r in chosen]})")
        if g.chance(0.2):
            X = g.pick([X for X in self.computes() if not X.relations])
            self.cache_stages.append(s[s.cache_write(X.op.output(0), "local")])
            self.log.append(f"cache_write({X.name}, 'local')")
        reds = [X for X in self.computes() if X.op.reduce_axis]
        if reds and g.chance(0.3):
            self.rfactor(g.pick(reds))
        for X in self.computes():
            if not X.is_output and not isinstance(X.op.body[0], Reduce) and g.chance(0.35):
                X.compute_inline()
                self.log.append(f"s[{X.name}].compute_inline()")
        # P goes inside a loop of one reader C; its other readers must then sit inside C too,
        # attached at the same loop or deeper (softmax: max and sum both inside out's row loop)
        plan: dict = {}
        for X in reversed(self.computes()):
            if X.attach_type != "inline" and not X.is_output and g.chance(0.45):
                rs = self.eff_readers(X)
                cands = [C for C in rs if all(plan.get(D) is C for D in rs if D is not C)]
                if cands:
                    plan[X] = g.pick(cands)
        live = [X for X in self.computes() if X.attach_type != "inline"]
        for X in live:
            self.loops(X, attached=X in plan)
        for X in reversed(self.computes()):
            if X in plan:
                C = plan[X]
                lim = min([C.leaf_iter_vars.index(D.attach_ivar) for D in self.eff_readers(X)
                           if D is not C] + [len(C.leaf_iter_vars) - 1])
                leaf = C.leaf_iter_vars[g.draw(st.integers(0, lim))]
                X.compute_at(C, leaf)
                self.log.append(f"s[{X.name}].compute_at(s[{C.name}], {leaf.name})")
        for X in live:
            self.annotate(X)
        return s

    def rfactor(self, X: Any) -> None:
        g = self.g
        leaves = [iv for iv in X.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]
        r = g.pick(leaves)
        if len(leaves) == 1 or g.chance(0.8):
            by, v = g.pick(["factor", "nparts"]), g.draw(st.integers(1, 8))
            r = g.pick(list(X.split(r, **{by: v})))
            self.log.append(f"s[{X.name}].split(reduce, {by}={v}) -> rfactor on {r.name}")
        fa = g.draw(st.integers(0, len(X.op.axis)))
        self.s.rfactor(X.op.output(0), r, fa)
        self.log.append(f"s.rfactor({X.name}, {r.name}, factor_axis={fa})")

    def loops(self, X: Any, attached: bool) -> None:
        g, log = self.g, self.log
        for iv in X.leaf_iter_vars:
            e = iv.dom.extent if iv.dom is not None else None
            known = isinstance(e, IntImm) and (iv.kind == IterVarKind.REDUCE or not attached)
            self.ext[iv] = e.value if known else None
        for _ in range(g.draw(st.integers(0, 4))):
            leaves = X.leaf_iter_vars
            op = g.pick(["split", "split", "tile", "fuse", "reorder"])
            if op == "split":
                iv = g.pick(leaves)
                e, by = self.ext[iv], "nparts" if g.chance(0.3) else "factor"
                v = g.draw(st.integers(1, (e or 8) + 3))  # also factors that do not divide, > e
                o, i = X.split(iv, **{by: v})
                q = -(-e // v) if e else None
                self.ext[o], self.ext[i] = (v, q) if by == "nparts" else (q, v)
                log.append(f"s[{X.name}].split({iv.name}, {by}={v})")
            elif op == "tile" and len(leaves) >= 2:
                a = g.draw(st.integers(0, len(leaves) - 2))
                b = g.draw(st.integers(a + 1, len(leaves) - 1))
                x, y = leaves[a], leaves[b]
                fx, fy = g.draw(st.integers(1, 9)), g.draw(st.integers(1, 9))
                xo, yo, xi, yi = X.tile(x, y, fx, fy)
                for o, i, iv, f in ((xo, xi, x, fx), (yo, yi, y, fy)):
                    e = self.ext[iv]
                    self.ext[o], self.ext[i] = (-(-e // f) if e else None), f
                log.append(f"s[{X.name}].tile({x.name}, {y.name}, {fx}, {fy})")
            elif op == "fuse":
                pairs = [k for k in range(len(leaves) - 1) if leaves[k].kind == leaves[k + 1].kind]
                if pairs:
                    k = g.pick(pairs)
                    a, b = leaves[k], leaves[k + 1]
                    f = X.fuse(a, b)
                    ea, eb = self.ext[a], self.ext[b]
                    self.ext[f] = ea * eb if ea and eb else None
                    log.append(f"s[{X.name}].fuse({a.name}, {b.name})")
            elif op == "reorder":
                perm = g.draw(st.permutations(leaves))
                X.reorder(*perm)
                log.append(f"s[{X.name}].reorder({', '.join(iv.name for iv in perm)})")

    def annotate(self, X: Any) -> None:
        g, log = self.g, self.log
        leaves = X.leaf_iter_vars
        taken = set()
        # vectorize: mostly the innermost spatial loop (any spatial loop of constant extent is
        # legal: inner loops run with vector bodies); parallel: mostly the outermost loop
        sp = [iv for iv in leaves if iv.kind == IterVarKind.DATA_PAR]
        vec = [iv for iv in sp if self.ext.get(iv)]
        if vec and g.chance(0.4):
            iv = vec[-1] if g.chance(0.7) else g.pick(vec)
            X.vectorize(iv)
            taken.add(iv)
            log.append(f"s[{X.name}].vectorize({iv.name})")
        par = [iv for iv in sp if iv not in taken]
        if X.attach_type == "root" and par and g.chance(0.3):
            iv = leaves[0] if leaves[0] in par and g.chance(0.7) else g.pick(par)
            X.parallel(iv)
            taken.add(iv)
            log.append(f"s[{X.name}].parallel({iv.name})")
        # explicit unrolls of big nests only make LLVM slow: keep them to <= 64 body copies
        free = [iv for k, iv in enumerate(leaves) if iv not in taken and self.ext.get(iv)
                and math.prod(self.ext.get(x) or 99 for x in leaves[k:]) <= 64]
        if free and g.chance(0.25):
            iv = g.pick(free)
            X.unroll(iv)
            log.append(f"s[{X.name}].unroll({iv.name})")
        if g.chance(0.15):
            iv, v = g.pick(leaves), g.pick([0, 4, 16, 64])
            X.pragma(iv, "auto_unroll_max_step", v)
            log.append(f"s[{X.name}].pragma({iv.name}, 'auto_unroll_max_step', {v})")
        if (X in self.cache_stages and all(isinstance(a.dom.extent, IntImm) for a in X.op.axis)
                and g.chance(0.5)):
            a, f = g.pick(list(X.op.axis)), g.pick([2, 4, 8, 16])
            o = g.draw(st.integers(0, f - 1))
            X.storage_align(a, f, o)
            log.append(f"s[{X.name}].storage_align({a.name}, {f}, {o})")


# the test --------------------------------------------------------------------------------------


def _inputs(p: Program, seed: int) -> dict[str, np.ndarray]:
    """Ints in [-8, 8]; floats are multiples of 1/4 in [-3, 3] (what makes exactness provable)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims, dtype in p.inputs:
        shape = [d.val for d in dims]
        if NARROW.get(dtype, dtype) == "int32":
            out[name] = rng.integers(0 if dtype == "uint8" else -8, 9, shape).astype(dtype)
        else:
            out[name] = (rng.integers(-12, 13, shape) / 4).astype(_np_dtype(dtype))
    return out


def _np_dtype(dtype: str) -> Any:
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _compare(what: str, p: Program, got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for name in p.outputs:
        sp = next(s for s in p.stages if s.name == name)
        g, r = got[name], ref[name]
        if sp.info.dtype == "int32":
            bad = g.astype(np.int64) != r
        else:
            tol = 4 * sp.info.E + 1e-6 + 1e-5 * np.abs(r)
            if sp.store:  # one more rounding, to 16 bits: u relative, and 2**-24 near zero
                tol = tol + HALF_U[sp.store] * (np.abs(r) + 4 * sp.info.E) + 2.0 ** -24
            bad = ~(np.abs(g.astype(np.float64) - r) <= tol)
        if bad.any():
            k = tuple(int(x) for x in np.argwhere(bad)[0])
            raise AssertionError(f"{what}: {name} differs at {int(bad.sum())}/{bad.size} points, "
                                 f"first {k}: got {g[k]!r}, expected {r[k]!r} (tol {4 * sp.info.E:.3g})")


def _work(p: Program) -> int:
    return sum(math.prod(d.val for d in s.dims + s.rdims) for s in p.stages)


def output_arrays(p: Program, ref: dict) -> dict[str, np.ndarray]:
    """The outputs to run into: each in its stage's storage dtype (16 bits where the stage is
    stored so), filled with a value no program computes."""
    store = {s.name: s.store for s in p.stages}
    return {n: np.full(ref[n].shape, -7777, _np_dtype(store[n] or ref[n].dtype.name.replace("64", "32")))
            for n in p.outputs}


def _run(fn: Any, p: Program, arrays: dict, ref: dict) -> dict[str, np.ndarray]:
    outs = output_arrays(p, ref)
    fn(*[arrays[n] for n, _, _ in p.inputs], *outs.values())
    return outs


def check_example(data: Any) -> None:
    g = Gen(data.draw)
    p = g.run()
    text = program_text(p)
    note(text)
    arg_dims = [d for _, ds, _ in p.inputs for d in ds] + [d for s in p.stages if s.name in p.outputs
                                                            for d in s.dims]
    assume(p.n is None or any(d.expr is p.n for d in arg_dims))  # else no argument binds n
    T = build_te(p)
    sch = Sched(g, p, T)
    debug = g.chance(0.3)
    arrays = _inputs(p, data.draw(st.integers(0, 2**32 - 1)))
    ref = reference(p, arrays)
    args = [T[n] for n, _, _ in p.inputs] + [T[n] for n in p.outputs]
    try:
        s = sch.run()
        _compare("compiled" + (" (debug)" if debug else ""), p, _run(tc.build(s, args, debug=debug), p, arrays, ref), ref)
        if _work(p) <= INTERP_BUDGET:
            func = tc.lower(s, args)
            try:
                got = _run(lambda *a: interp.run(func, *a, max_steps=8 * INTERP_BUDGET, poison=True), p, arrays, ref)
            except TecompError as e:
                if "max_steps" not in str(e):
                    raise
            else:
                _compare("interpreter", p, got, ref)
    except Exception as e:
        if LOG_PATH is None:
            raise
        with open(LOG_PATH, "a") as fh:
            fh.write(json.dumps({"error": f"{type(e).__name__}: {e}", "program": text, "schedule": sch.log}) + "\n")
    finally:
        note("\n".join(sch.log))


@settings(settings.get_profile("differential"))
@seed(int(SEED or 0))
@given(data=st.data())
def test_differential(data: Any) -> None:
    check_example(data)
