"""Interval and constant-bound analysis: examples, then soundness by random evaluation."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tecomp.arith.evaluate import evaluate
from tecomp.arith.interval import Interval, can_prove, const_bounds, eval_interval
from tecomp.arith.simplify import simplify
from tecomp.ir import Var, structural_equal
from tecomp.ir.expr import (
    EQ,
    NE,
    And,
    Broadcast,
    Cast,
    Expr,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Not,
    Or,
    Ramp,
    Select,
)

HYP = settings(
    max_examples=int(os.environ.get("TECOMP_HYPOTHESIS_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

io, ii, n, x, y = Var("io"), Var("ii"), Var("n"), Var("x"), Var("y")


def c(v: int) -> Expr:
    return IntImm(v)


def is_const(e: Expr | None, v: int) -> bool:
    return isinstance(e, IntImm) and e.value == v


def test_tile_index_interval() -> None:
    iv = eval_interval(io * 32 + ii, {ii: Interval.from_range(0, 32)})
    assert structural_equal(iv.lo, io * 32)
    assert structural_equal(iv.hi, io * 32 + 31)
    assert iv.hi is not None and iv.lo is not None
    assert is_const(simplify(iv.hi - iv.lo), 31)
    assert is_const(iv.extent(), 32)


def test_floormod_interval() -> None:
    tile = {ii: Interval.from_range(0, 32)}
    full = eval_interval(FloorMod(io * 32 + ii, c(32)), tile)
    assert is_const(full.lo, 0) and is_const(full.hi, 31)
    part = eval_interval(FloorMod(x, c(8)), {x: Interval.from_range(17, 4)})  # 17..20 in one period
    assert is_const(part.lo, 1) and is_const(part.hi, 4)
    wrap = eval_interval(FloorMod(x, c(8)), {x: Interval.from_range(6, 4)})  # 6..9 wraps
    assert is_const(wrap.lo, 0) and is_const(wrap.hi, 7)
    assert eval_interval(FloorDiv(x, c(8)), {x: Interval.from_range(0, 64)}).same_as(Interval(c(0), c(7)))


def test_min_max_select_interval() -> None:
    dom = {x: Interval.from_range(0, 21), y: Interval.from_range(5, 3)}
    assert eval_interval(Min(x, c(10)), dom).same_as(Interval(c(0), c(10)))
    assert eval_interval(Max(x, y), dom).same_as(Interval(c(5), c(20)))
    assert eval_interval(Select(x < y, x, y * 2), dom).same_as(Interval(c(0), c(20)))
    half = eval_interval(Min(x, n), {x: Interval(c(0), None)})
    assert structural_equal(half.lo, Min(n, c(0))) and half.hi is n  # n may be negative


def test_symbolic_extent() -> None:
    i = Var("i")
    iv = eval_interval(i * 4 + 3, {i: Interval.from_range(0, n)})
    assert is_const(iv.lo, 3)
    assert structural_equal(iv.hi, n * 4 - 1)
    neg = eval_interval(i * -2, {i: Interval.from_range(0, n)})
    assert structural_equal(neg.lo, (n - 1) * -2) or structural_equal(neg.lo, simplify((n - 1) * -2))
    assert is_const(neg.hi, 0)
    assert can_prove(i < n, {i: (0, n)})
    assert can_prove(i * 4 + 3 < n * 4, {i: (0, n)})
    assert not can_prove(i < n - 1, {i: (0, n)})
    assert const_bounds(i - n, {i: (0, n)}) == (None, -1)


def test_vectors_and_casts() -> None:
    r = eval_interval(Ramp(x * 8, c(1), 8), {x: Interval.from_range(0, 4)})
    assert is_const(r.lo, 0) and is_const(r.hi, 31)
    b = eval_interval(Broadcast(x, 4), {x: Interval.from_range(2, 2)})
    assert is_const(b.lo, 2) and is_const(b.hi, 3)
    w = eval_interval(Cast("int64", x), {x: Interval.from_range(0, 10)})
    assert w.hi is not None and is_const(simplify(w.hi), 9)
    narrow = eval_interval(Cast("int8", x), {x: Interval.from_range(0, 1000)})
    assert is_const(narrow.lo, -128) and is_const(narrow.hi, 127)


def test_products_of_intervals() -> None:
    dom = {x: Interval.from_range(-2, 5), y: Interval.from_range(3, 2)}  # [-2, 2] * [3, 4]
    assert eval_interval(x * y, dom).same_as(Interval(c(-8), c(8)))
    sym = eval_interval(x * y, {x: Interval.from_range(0, n), y: Interval.from_range(1, 4)})
    assert is_const(sym.lo, 0) and sym.hi is not None
    assert eval_interval(x * y, {x: Interval(None, c(3)), y: Interval(c(-1), c(1))}).is_everything


def test_const_bounds_and_can_prove() -> None:
    j = Var("j")
    assert const_bounds((io * 32 + j) - io * 32, {j: (0, 32)}) == (0, 31)
    assert const_bounds(FloorMod(x, c(8))) == (0, 7)
    assert const_bounds(x) == (None, None)
    assert const_bounds(Var("u", "uint8")) == (0, 255)
    assert can_prove(j < 32, {j: (0, 32)})
    assert not can_prove(j < 31, {j: (0, 32)})
    assert can_prove(And(j >= 0, Not(j > 40)), {j: (0, 32)})
    assert can_prove(Or(j > 100, j < 32), {j: (0, 32)})
    assert can_prove(EQ(x + 1, 1 + x))
    assert can_prove(NE(x, x + 1))
    assert not can_prove(n >= 1) and can_prove(n >= 1, var_bounds={n: (1, None)})
    assert const_bounds(n // 32 + 1, var_bounds={n: (0, 100)}) == (1, 4)


def test_interval_helpers() -> None:
    p = Interval.point(x)
    assert p.is_point and p.is_bounded and not p.is_everything
    assert Interval.everything().is_everything and Interval.everything().extent() is None
    u = Interval(c(0), c(4)).union(Interval(c(2), c(9)))
    assert u.same_as(Interval(c(0), c(9)))
    assert Interval(c(0), None).union(Interval(c(-1), c(3))).same_as(Interval(c(-1), None))


# soundness ---------------------------------------------------------------------------------------

VARS = (x, y, n)
LEAF = st.one_of(st.sampled_from(VARS), st.integers(-9, 40).map(c))


def _extend(kids: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    k2 = st.tuples(kids, kids)
    cst = st.sampled_from([-3, -1, 1, 2, 4, 8, 32])
    return st.one_of(
        k2.map(lambda t: t[0] + t[1]), k2.map(lambda t: t[0] - t[1]), k2.map(lambda t: t[0] * t[1]),
        st.tuples(kids, cst).map(lambda t: t[0] * t[1]),
        st.tuples(kids, cst).map(lambda t: FloorDiv(t[0], c(t[1]))),
        st.tuples(kids, cst).map(lambda t: FloorMod(t[0], c(t[1]))),
        k2.map(lambda t: FloorDiv(*t)), k2.map(lambda t: FloorMod(*t)),
        k2.map(lambda t: Min(*t)), k2.map(lambda t: Max(*t)),
        st.tuples(kids, kids, kids).map(lambda t: Select(t[0] < t[1], t[1], t[2])),
        st.tuples(kids, st.sampled_from([2, 8, 32]), st.integers(-40, 40)).map(
            lambda t: FloorDiv(t[0] + t[2], c(t[1])) - FloorDiv(t[0], c(t[1]))),
    )


EXPR = st.recursive(LEAF, _extend, max_leaves=8)


@st.composite
def domain(draw: st.DrawFn) -> tuple[dict[Var, tuple[Expr, Expr]], dict[Var, int]]:
    """x in [a, a + e), y in [x, x + n) or constant, n in [1, 30] or free and positive."""
    nv = draw(st.integers(1, 30))
    ranges: dict[Var, tuple[Expr, Expr]] = {}
    if draw(st.booleans()):
        ranges[n] = (c(1), c(30))
    a, e = draw(st.integers(-10, 10)), draw(st.integers(1, 25))
    ranges[x] = (c(a), c(e)) if draw(st.booleans()) else (c(0), n)
    xv = draw(st.integers(a, a + e - 1)) if ranges[x][1] is not n else draw(st.integers(0, nv - 1))
    if draw(st.booleans()):
        ranges[y] = (x, n)
        yv = draw(st.integers(xv, xv + nv - 1))
    else:
        ranges[y] = (c(-4), c(9))
        yv = draw(st.integers(-4, 4))
    return ranges, {x: xv, y: yv, n: nv}


def _val(e: Expr, env: dict[Var, int]) -> int | None:
    try:
        v = evaluate(e, env)
    except ZeroDivisionError:
        return None
    assert isinstance(v, int)
    return v


@HYP
@given(EXPR, domain(), st.data())
def test_eval_interval_is_sound(e: Expr, dom: tuple, data: st.DataObject) -> None:
    ranges, env = dom
    v = _val(e, env)
    assume(v is not None)
    keep = data.draw(st.sets(st.sampled_from(sorted(ranges, key=lambda q: q.name))))
    iv = eval_interval(e, {q: Interval.from_range(*ranges[q]) for q in keep}, ranges)
    if iv.lo is not None:
        lo = _val(iv.lo, env)
        assert lo is None or lo <= v, f"{e}: {v} < lo {iv.lo} = {lo}"
    if iv.hi is not None:
        hi = _val(iv.hi, env)
        assert hi is None or v <= hi, f"{e}: {v} > hi {iv.hi} = {hi}"


@HYP
@given(EXPR, domain())
def test_const_bounds_are_sound(e: Expr, dom: tuple) -> None:
    ranges, env = dom
    v = _val(e, env)
    assume(v is not None)
    lo, hi = const_bounds(e, ranges)
    assert lo is None or lo <= v, f"{e}: {v} < {lo}"
    assert hi is None or v <= hi, f"{e}: {v} > {hi}"


@HYP
@given(EXPR, EXPR, domain(), st.sampled_from(["lt", "le", "eq", "ne"]))
def test_can_prove_is_sound(a: Expr, b: Expr, dom: tuple, op: str) -> None:
    ranges, env = dom
    cond = {"lt": a < b, "le": a <= b, "eq": EQ(a, b), "ne": NE(a, b)}[op]
    truth = _val(cond, env)
    assume(truth is not None)
    if can_prove(cond, ranges):
        assert truth, f"proved {cond} but it is false at {env}"
