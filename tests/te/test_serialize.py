"""A compute DAG written as JSON and read back is the same computation (tecomp.te.serialize)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.te.serialize import dag_from_json, dag_to_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_differential import build_te, programs  # noqa: E402 - the fuzzer's program generator


def roundtrip(tensors: list[te.Tensor]) -> list[te.Tensor]:
    return dag_from_json(json.loads(json.dumps(dag_to_json(tensors), allow_nan=False)))


def lowered(tensors: list[te.Tensor]) -> str:
    outs = [t.op for t in tensors if isinstance(t.op, te.ComputeOp)]
    return str(tc.lower(te.create_schedule(outs), tensors))


def test_matmul_round_trip_lowers_and_runs_the_same() -> None:
    n = te.var("n")
    A = te.placeholder((n, 24), "float32", name="A")
    B = te.placeholder((24, 16), "float32", name="B")
    k = te.reduce_axis((0, 24), name="k")
    C = te.compute((n, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    A2, B2, C2 = roundtrip([A, B, C])
    assert (A2.name, B2.name, C2.name) == ("A", "B", "C")
    assert A2.shape[0] is not A.shape[0]  # a fresh DAG ...
    assert A2.shape[0] is C2.shape[0]  # ... in which the symbolic n is still one variable
    assert lowered([A2, B2, C2]) == lowered([A, B, C])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 24), dtype=np.float32)
    b = rng.standard_normal((24, 16), dtype=np.float32)
    c = np.empty((5, 16), np.float32)
    tc.build(te.create_schedule(C2.op), [A2, B2, C2])(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_tuple_reducer_and_special_floats() -> None:
    # argmax (a user comm_reducer of two values, one op with two outputs), -inf identities,
    # an intrinsic call and a select: everything a body can hold
    A = te.placeholder((6, 9), "float32", name="A")
    k = te.reduce_axis((0, 9), name="k")
    argmax = te.comm_reducer(
        lambda x, y: (te.if_then_else(x[1] >= y[1], x[0], y[0]), te.if_then_else(x[1] >= y[1], x[1], y[1])),
        lambda t0, t1: (tc.const(-1, t0), te.min_value(t1)), name="argmax")
    idx, val = te.compute((6,), lambda i: argmax((k, A[i, k]), axis=k), name="am")
    m = te.compute((6,), lambda i: te.max(A[i, k], axis=k), name="m")
    B = te.compute((6,), lambda i: te.exp(val[i] - m[i]) + te.if_then_else(idx[i] > 3, 1.0, float("-inf")),
                   name="B")
    tensors = [A, idx, val, m, B]
    again = roundtrip(tensors)
    assert lowered(again) == lowered(tensors)
    a = np.random.default_rng(1).standard_normal((6, 9), dtype=np.float32)
    outs = []
    for ts in (tensors, again):
        f = tc.build(te.create_schedule([ts[4].op, ts[1].op]), ts)
        o = [np.empty(6, "int32"), np.empty(6, "float32"), np.empty(6, "float32"), np.empty(6, "float32")]
        f(a, *o)
        outs.append(o)
    for x, y in zip(*outs):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(outs[0][0], a.argmax(axis=1))


def test_the_document_is_plain_json() -> None:
    A = te.placeholder((4,), "float32", name="A")
    B = te.compute((4,), lambda i: te.max(A[i], te.max_value("float32")) * float("inf"), name="B")
    d = dag_to_json([A, B])
    json.dumps(d, allow_nan=False)  # no NaN/inf tokens: strict JSON readers accept it
    assert d["format"] == "tecomp-dag" and d["version"] == 1


@pytest.mark.parametrize("bad, match", [
    ({"format": "something else"}, "not a serialized tecomp DAG"),
    ({"format": "tecomp-dag", "version": 99}, "version 99"),
    ({"format": "tecomp-dag", "version": 1, "vars": [], "itervars": [], "reducers": [],
      "ops": [{"kind": "placeholder", "name": "A", "dtype": "float32", "shape": [{"n": "Nope"}]}],
      "tensors": [[0, 0]]}, "unknown expression node 'Nope'"),
    ({"format": "tecomp-dag", "version": 1, "vars": [], "itervars": [], "reducers": [], "ops": [],
      "tensors": [[3, 0]]}, "operation 3 before it is defined"),
    ({"format": "tecomp-dag", "version": 1}, "malformed serialized DAG"),
])
def test_bad_documents_are_clear_errors(bad: dict, match: str) -> None:
    with pytest.raises(TecompError, match=match):
        dag_from_json(bad)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(p=programs(), seed=st.integers(0, 2**16))
def test_random_programs_round_trip(p, seed: int) -> None:
    # the differential fuzzer's random programs (reductions with where/init, casts, selects,
    # symbolic dims): the rebuilt DAG lowers to the same text as the original
    T = build_te(p)
    order = [name for name, _, _ in p.inputs] + [sp.name for sp in p.stages]
    tensors = [T[name] for name in order]
    again = roundtrip(tensors)
    assert [t.name for t in again] == order
    assert lowered(again) == lowered(tensors)
