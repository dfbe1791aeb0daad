"""A compute DAG as plain JSON data, and back.

The tuner's worker processes and its logs need the computation itself, not the Python function
that declared it: a function defined in a notebook cell, a REPL, ``python -c`` or an unguarded
script cannot be imported by another process, and importing a script runs it again. So the
declaration (placeholders, computes, their bodies, reducers and symbolic sizes) is written out
as JSON, which any process can read back into an equivalent DAG.

The result is structurally identical to the original: same op, axis and variable names, same
dtypes, same expression trees, and variables shared between tensors stay shared (a symbolic
``n`` used by two placeholders is one ``Var`` again). Only te-level objects are supported;
lowered IR (buffers, statements) never needs to travel.

>>> d = dag_to_json([A, B, C])                    # doctest: +SKIP
>>> A2, B2, C2 = dag_from_json(json.loads(json.dumps(d)))   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..errors import TecompError
from ..ir import expr as E
from ..ir.expr import Expr, Var
from .reduction import CommReducer
from .tensor import AxisVar, ComputeOp, IterVar, Operation, PlaceholderOp, Range, Tensor

FORMAT = "tecomp-dag"
VERSION = 1


def _node_classes() -> dict[str, type[Expr]]:
    out: dict[str, type[Expr]] = {}
    todo: list[type[Expr]] = [Expr]
    while todo:
        cls = todo.pop()
        sub: type[Expr]
        for sub in cls.__subclasses__():
            if sub.__module__ == E.__name__:
                out[sub.__name__] = sub
            todo.append(sub)
    return out


# Fields that hold something other than an expression, a scalar or a tuple of those: written
# by reference into the tables of the document.
_REF_FIELDS = {("ProducerLoad", "producer"), ("Reduce", "combiner"), ("Reduce", "axis")}


class _Writer:
    def __init__(self) -> None:
        self.vars: list[dict[str, Any]] = []
        self.var_ids: dict[int, int] = {}
        self.itervars: list[dict[str, Any]] = []
        self.iv_ids: dict[int, int] = {}
        self.reducers: list[dict[str, Any]] = []
        self.red_ids: dict[int, int] = {}
        self.ops: list[dict[str, Any]] = []
        self.op_ids: dict[int, int] = {}

    # leaves and tables ---------------------------------------------------------------------
    def var(self, v: Var) -> int:
        k = self.var_ids.get(id(v))
        if k is None:
            k = self.var_ids[id(v)] = len(self.vars)
            self.vars.append({"name": v.name, "dtype": v.dtype, "axis": isinstance(v, AxisVar)})
        return k

    def itervar(self, iv: IterVar) -> int:
        k = self.iv_ids.get(id(iv))
        if k is None:
            dom = None if iv.dom is None else [self.expr(iv.dom.min), self.expr(iv.dom.extent)]
            entry = {"var": self.var(iv.var), "dom": dom, "kind": iv.kind, "tag": iv.thread_tag}
            k = self.iv_ids[id(iv)] = len(self.itervars)
            self.itervars.append(entry)
        return k

    def reducer(self, r: CommReducer) -> int:
        k = self.red_ids.get(id(r))
        if k is None:
            entry = {"name": r.name, "lhs": [self.var(v) for v in r.lhs],
                     "rhs": [self.var(v) for v in r.rhs],
                     "result": [self.expr(x) for x in r.result],
                     "identity": [self.expr(x) for x in r.identity]}
            k = self.red_ids[id(r)] = len(self.reducers)
            self.reducers.append(entry)
        return k

    def tensor(self, t: Tensor) -> list[int]:
        return [self.op(t.op), t.value_index]

    def op(self, op: Operation) -> int:
        k = self.op_ids.get(id(op))
        if k is not None:
            return k
        entry: dict[str, Any]
        if isinstance(op, PlaceholderOp):
            entry = {"kind": "placeholder", "name": op.name, "dtype": op.dtype,
                     "shape": [self.expr(d) for d in op.shape]}
        elif isinstance(op, ComputeOp):
            for t in op.input_tensors:  # producers first: the reader builds in list order
                self.op(t.op)
            entry = {"kind": "compute", "name": op.name, "tag": op.tag,
                     "attrs": _plain_attrs(op), "axis": [self.itervar(iv) for iv in op.axis],
                     "body": [self.expr(b) for b in op.body]}
        else:
            # an extern body is arbitrary IR over declared buffers (and may name symbols only
            # this process has loaded), a scan's state wiring has no JSON form yet: neither
            # can reach a tuning worker, so such a computation cannot be tuned
            raise TecompError(f"cannot serialize operation {op.name} of kind {type(op).__name__}: "
                              "only placeholders and computes are data (computations with "
                              "te.extern or te.scan stages cannot be tuned; schedule them by hand)")
        k = self.op_ids[id(op)] = len(self.ops)
        self.ops.append(entry)
        return k

    # expressions ---------------------------------------------------------------------------
    def expr(self, e: Any) -> Any:
        if isinstance(e, Var):
            return {"v": self.var(e)}
        if isinstance(e, Expr):
            name = type(e).__name__
            out: dict[str, Any] = {"n": name}
            for f in fields(e):  # type: ignore[arg-type]
                val = getattr(e, f.name)
                if (name, f.name) in _REF_FIELDS:
                    if f.name == "producer":
                        out[f.name] = self.tensor(val)
                    elif f.name == "combiner":
                        out[f.name] = self.reducer(val)
                    else:
                        out[f.name] = [self.itervar(iv) for iv in val]
                else:
                    out[f.name] = self.value(val, f"{name}.{f.name}")
            return out
        raise TecompError(f"cannot serialize {e!r} ({type(e).__name__}) as an expression")

    def value(self, v: Any, where: str) -> Any:
        if isinstance(v, Expr):
            return self.expr(v)
        if isinstance(v, tuple):
            return {"tuple": [self.value(x, where) for x in v]}
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}  # JSON has no inf/nan
        if v is None or isinstance(v, (bool, int, str)):
            return v
        raise TecompError(f"cannot serialize {where} = {v!r} ({type(v).__name__})")


def _plain_attrs(op: ComputeOp) -> dict[str, Any]:
    for k, v in op.attrs.items():
        if not isinstance(v, (bool, int, float, str)) and v is not None:
            raise TecompError(f"cannot serialize attribute {k!r} of {op.name}: {v!r} is not a "
                              "JSON scalar")
    return dict(op.attrs)


def dag_to_json(tensors: Sequence[Tensor]) -> dict[str, Any]:
    """The DAG that produces ``tensors`` as a JSON-serializable dict; `dag_from_json` returns
    the same list of tensors, rebuilt."""
    w = _Writer()
    refs = [w.tensor(t) for t in tensors]
    return {"format": FORMAT, "version": VERSION, "vars": w.vars, "itervars": w.itervars,
            "reducers": w.reducers, "ops": w.ops, "tensors": refs}


class _Reader:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d
        self.vars: list[Var] = [(AxisVar if v["axis"] else Var)(v["name"], v["dtype"]) for v in d["vars"]]
        self.itervars: list[IterVar | None] = [None] * len(d["itervars"])
        self.reducers: list[CommReducer | None] = [None] * len(d["reducers"])
        self.ops: list[Operation] = []
        self.classes = _node_classes()

    def itervar(self, k: int) -> IterVar:
        iv = self.itervars[k]
        if iv is None:
            e = self.d["itervars"][k]
            dom = None if e["dom"] is None else Range(self.expr(e["dom"][0]), self.expr(e["dom"][1]))
            iv = self.itervars[k] = IterVar(dom, self.vars[e["var"]], e["kind"], e["tag"])
        return iv

    def reducer(self, k: int) -> CommReducer:
        r = self.reducers[k]
        if r is None:
            e = self.d["reducers"][k]
            r = self.reducers[k] = CommReducer(
                e["name"], tuple(self.vars[v] for v in e["lhs"]), tuple(self.vars[v] for v in e["rhs"]),
                tuple(self.expr(x) for x in e["result"]), tuple(self.expr(x) for x in e["identity"]))
        return r

    def tensor(self, ref: list[int]) -> Tensor:
        op_k, vi = ref
        if not 0 <= op_k < len(self.ops):
            raise ValueError(f"tensor reference to operation {op_k} before it is defined")
        return self.ops[op_k].output(vi)

    def expr(self, x: Any) -> Expr:
        if "v" in x:
            return self.vars[x["v"]]
        name = x["n"]
        cls = self.classes.get(name)
        if cls is None:
            raise ValueError(f"unknown expression node {name!r}")
        kw: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in x:
                continue
            val = x[f.name]
            if (name, f.name) in _REF_FIELDS:
                if f.name == "producer":
                    kw[f.name] = self.tensor(val)
                elif f.name == "combiner":
                    kw[f.name] = self.reducer(val)
                else:
                    kw[f.name] = tuple(self.itervar(k) for k in val)
            else:
                kw[f.name] = self.value(val)
        return cls(**kw)

    def value(self, v: Any) -> Any:
        if isinstance(v, dict):
            if "tuple" in v:
                return tuple(self.value(x) for x in v["tuple"])
            if "float" in v:
                return float(v["float"])
            return self.expr(v)
        return v

    def op(self, e: dict[str, Any]) -> Operation:
        if e["kind"] == "placeholder":
            return PlaceholderOp(e["name"], tuple(self.expr(s) for s in e["shape"]), e["dtype"])
        if e["kind"] == "compute":
            axis = [self.itervar(k) for k in e["axis"]]
            return ComputeOp(e["name"], axis, [self.expr(b) for b in e["body"]], e.get("tag", ""),
                             e.get("attrs") or {})
        raise ValueError(f"unknown operation kind {e['kind']!r}")


def dag_from_json(d: dict[str, Any]) -> list[Tensor]:
    """The tensors written by `dag_to_json`, in the same order, with a freshly built DAG.

    Raises `TecompError` on a document this version cannot read.
    """
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TecompError("not a serialized tecomp DAG (no 'format': 'tecomp-dag')")
    if d.get("version") != VERSION:
        raise TecompError(f"serialized DAG version {d.get('version')!r}; this tecomp reads {VERSION}")
    try:
        r = _Reader(d)
        for e in d["ops"]:
            r.ops.append(r.op(e))
        return [r.tensor(t) for t in d["tensors"]]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise TecompError(f"malformed serialized DAG: {type(e).__name__}: {e}") from None


__all__ = ["dag_from_json", "dag_to_json"]
