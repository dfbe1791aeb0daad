"""User-written templates: the space their knobs span, the errors a template can make, and a
short tune whose best record replays to a correct kernel."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import tuning_templates as tt
import tuning_workloads as wl

import tecomp as tc
import tuning
from tecomp import te
from tuning import ConfigSpace, TuningError
from tuning.cli import main as cli_main
from tuning.measure import LocalBuilder, LocalRunner
from tuning.records import load_records
from tuning.steps import SplitStep, TemplateConfigStep, steps_from_json, steps_key, steps_to_json
from tuning.template import TemplateSpace

HERE = Path(__file__).resolve().parent


# the space --------------------------------------------------------------------------------------


def test_split_of_64_into_two_has_seven_configs() -> None:
    task = tuning.SearchTask(tt.split_only, (64,))
    space = task.config_space
    assert space is not None and len(space) == 7 and len(task.make_space()) == 7
    sizes = [c["t"] for c in space.configs()]
    assert sizes == [(64, 1), (32, 2), (16, 4), (8, 8), (4, 16), (2, 32), (1, 64)]
    assert space.default() == {"t": (64, 1)}


def test_split_policies_and_limits() -> None:
    cfg = ConfigSpace("test")
    cfg.define_split("three", 64, num_outputs=3)  # 2^6 spread over 3 parts: C(8, 2)
    cfg.define_split("p2", 100, policy="power2")  # inner 1..64, the outer loop rounded up
    cfg.define_split("capped", 64, num_outputs=3, max_factor=4)
    knobs = cfg.knobs
    assert len(knobs["three"].choices) == 28
    assert all(np.prod(c) == 64 for c in knobs["three"].choices)
    assert knobs["p2"].choices == ((100, 1), (50, 2), (25, 4), (13, 8), (7, 16), (4, 32), (2, 64))
    assert all(max(c[1:]) <= 4 for c in knobs["capped"].choices) and len(knobs["capped"].choices) == 9
    assert cfg["three"].size == (64, 1, 1)  # the discovery call sees every knob's first choice
    assert len(cfg) == 28 * 7 * 9
    for bad in ({"num_outputs": 1}, {"policy": "primes"}, {"max_factor": 0}):
        with pytest.raises(TuningError, match="define_split"):
            cfg.define_split("bad", 16, **bad)  # type: ignore[arg-type]


def test_knob_values_are_json() -> None:
    cfg = ConfigSpace("test")
    cfg.define_knob("order", [[0, 1], [1, 0], [0, 1]])  # lists become tuples; repeats drop out
    cfg.define_knob("mixed", [0, 1, True, 1.0, None, "x"])  # 1, True and 1.0 are three values
    cfg.define_knob("np", np.arange(3))
    assert cfg.knobs["order"].choices == ((0, 1), (1, 0))
    assert [type(v) for v in cfg.knobs["mixed"].choices] == [int, int, bool, float, type(None), str]
    assert cfg.knobs["np"].choices == (0, 1, 2) and type(cfg["np"].val) is int
    assert cfg["order"].val == (0, 1)
    with pytest.raises(TuningError, match="not a JSON value"):
        cfg.define_knob("obj", [{"a": 1}])
    with pytest.raises(TuningError, match="no candidates"):
        cfg.define_knob("empty", [])
    with pytest.raises(TuningError, match="must be a list"):
        cfg.define_knob("str", "abc")


def test_template_task_key_differs_from_the_plain_workload() -> None:
    tmpl = tuning.SearchTask(tt.matmul_tmpl, (32, 32, 32))
    plain = tuning.SearchTask(wl.matmul, (32, 32, 32))
    assert tmpl.is_template and not plain.is_template and plain.config_space is None
    assert tmpl.workload_key != plain.workload_key
    assert tmpl.flop_ct == plain.flop_ct == 2 * 32**3
    assert [t.name for t in tmpl.tensors] == ["A", "B", "C"]
    assert tmpl.workload_key == tuning.SearchTask(tt.matmul_tmpl, (32, 32, 32)).workload_key
    back = pickle.loads(pickle.dumps(tmpl))  # how tasks reach worker processes
    assert back.workload_key == tmpl.workload_key and back.config_space is not None
    assert tuning.SearchTask.from_json(tmpl.to_json()).workload_key == tmpl.workload_key


def test_template_step_round_trip_and_keys() -> None:
    a = TemplateConfigStep({"tile": [4, 8], "unroll": 1})
    assert a.config == (("tile", (4, 8)), ("unroll", 1)) and hash(a)
    back = steps_from_json(json.loads(json.dumps(steps_to_json((a,)))))
    assert back == (a,) and steps_key(back) == steps_key((a,))
    assert steps_key((TemplateConfigStep({"tile": [4, 8], "unroll": 0}),)) != steps_key((a,))


# errors ------------------------------------------------------------------------------------------


def test_template_errors_are_clear() -> None:
    with pytest.raises(TuningError, match="'nope'"):
        tuning.SearchTask(tt.reads_undefined, (16,))
    with pytest.raises(TuningError, match="'x' defined twice with different choices"):
        tuning.SearchTask(tt.defines_twice, (16,))
    with pytest.raises(TuningError, match="first choice"):
        tuning.SearchTask(tt.bad_default, (16,))

    with pytest.raises(TuningError, match="expects a function"):
        tuning.template(3)  # type: ignore[arg-type]


def test_a_local_template_travels_by_value() -> None:
    """A template's schedule is code: it is pickled by value (a notebook cell's or a script's
    function cannot be imported by a worker) and rebuilds the same task."""
    import pickle

    @tuning.template
    def local(cfg, n):  # noqa: ANN001, ANN202
        A = te.placeholder((n,), name="A")
        B = te.compute((n,), lambda i: A[i] * 3, name="B")
        s = te.create_schedule(B.op)
        cfg.define_knob("vec", [0, 1])
        if cfg["vec"].val:
            s[B].vectorize(s[B].op.axis[0])
        return s, [A, B]

    task = tuning.SearchTask(local, (32,))
    again = pickle.loads(pickle.dumps(task))
    assert again.is_template and again.workload_key == task.workload_key
    assert again.config_space is not None and len(again.config_space) == 2


def test_steps_and_configs_that_do_not_fit() -> None:
    tmpl = tuning.SearchTask(tt.split_only, (64,))
    plain = tuning.SearchTask(wl.add_one, (64,))
    with pytest.raises(TuningError, match="is a template"):
        tmpl.apply_steps((SplitStep("B", 0, (4,)),))
    with pytest.raises(TuningError, match="not a template"):
        plain.apply_steps((TemplateConfigStep({"t": (8, 8)}),))
    with pytest.raises(TuningError, match="not a choice"):
        tmpl.apply_steps((TemplateConfigStep({"t": (3, 3)}),))
    with pytest.raises(TuningError, match="unknown"):
        tmpl.apply_steps((TemplateConfigStep({"t": (8, 8), "gone": 1}),))


def test_a_config_the_schedule_rejects_is_no_candidate() -> None:
    task = tuning.SearchTask(tt.vector_knob, (64,))
    space = task.make_space()
    assert isinstance(space, TemplateSpace) and len(space) == 8
    assert space.instantiate(0, {"v": 3, "mode": "a"}) is None
    ok = space.instantiate(0, {"v": 4, "mode": "b"})
    assert ok is not None and ok.params == (("mode", "b"), ("v", 4))
    assert space.instantiate(0, {"v": 4}) is None  # a knob missing and no Generator to draw it
    rng = np.random.default_rng(0)
    seen = {c.param_dict["v"] for c in (space.sample(rng) for _ in range(40)) if c is not None}
    assert seen == {1, 2, 4}


# search operators ----------------------------------------------------------------------------


def test_mutate_and_crossover_give_valid_configs() -> None:
    task = tuning.SearchTask(tt.matmul_tmpl, (32, 32, 32))
    space = task.make_space()
    cs = task.config_space
    assert cs is not None
    rng = np.random.default_rng(1)
    pop = [c for c in (space.sample(rng) for _ in range(8)) if c is not None]
    assert len(pop) == 8
    for _ in range(40):
        a, b = pop[int(rng.integers(len(pop)))], pop[int(rng.integers(len(pop)))]
        m = space.mutate(a, rng)
        assert m is not None and cs.validate(m.param_dict) == m.params
        changed = [k for k in cs if m.param_dict[k] != a.param_dict[k]]
        assert len(changed) == 1  # one knob moved
        if changed[0] == "tile_i":  # exact splits: a factor moved, the product kept
            assert np.prod(m.param_dict["tile_i"]) == 32
        x = space.crossover(a, b, rng)
        assert x is not None and cs.validate(x.param_dict) == x.params
        assert all(x.param_dict[k] in (a.param_dict[k], b.param_dict[k]) for k in cs)
        s, args = task.apply_steps(m.steps)
        tc.lower(s, args)
    for k in cs:  # the knob named moves, and only it (the search's local moves name one)
        m = space.mutate(pop[0], rng, knob=k)
        if m is not None:
            assert [j for j in cs if m.param_dict[j] != pop[0].param_dict[j]] == [k]
    assert space.mutate(pop[0], rng, knob="no_such_knob") is None


# end to end --------------------------------------------------------------------------------


def test_tune_template_and_apply_best(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(tt.matmul_tmpl, (32, 48, 16))
    log = str(tmp_path / "t.jsonl")
    small = tuning.SearchOptions(population=16, generations=1, fresh_pool=16)
    res = tuning.tune([task], trials=8, log=log, seed=0, batch_size=8, builder=builder,
                      runner=runner, search=small, progress=False)[0]
    assert res.trials == 8 and np.isfinite(res.best_cost), res.errors
    recs = load_records(log, task)
    assert len({r.key for r in recs}) == 8 and all(r.valid for r in recs)
    assert all(len(r.steps) == 1 and isinstance(r.steps[0], TemplateConfigStep) for r in recs)
    assert all(r.sketch == 0 and dict(r.params) == dict(r.steps[0].config) for r in recs)
    space = task.make_space()
    for r in recs:  # what a resumed search does with each record
        c = space.instantiate(0, dict(r.params))
        assert c is not None and c.key == r.key
    s, args = task.apply_best(log)
    f = tc.build(s, args, name="best")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 16)).astype("float32")
    b = rng.standard_normal((16, 48)).astype("float32")
    c = np.zeros((32, 48), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # a re-run resumes from the log: its records re-create their candidates, nothing is redone
    again = tuning.tune([task], trials=8, log=log, seed=0, builder=builder, runner=runner,
                        search=small, progress=False)[0]
    assert again.new_trials == 0 and again.best_cost == res.best_cost


def test_tune_stops_when_the_space_is_exhausted(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(tt.vector_knob, (64,))  # 8 configs, 2 of them rejected
    log = str(tmp_path / "v.jsonl")
    res = tuning.tune([task], trials=16, log=log, seed=0, batch_size=8, builder=builder, runner=runner,
                      search=tuning.SearchOptions(population=8, generations=1, fresh_pool=8), progress=False)[0]
    assert res.trials == 6 and res.errors == {"NO_ERROR": 6}


def test_cli_tunes_a_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "s.jsonl"
    spec = f"{HERE / 'tuning_templates.py'}:split_only"
    assert cli_main(["tune", spec, "--args", "64", "--trials", "3", "--log", str(log)]) == 0
    assert "split_only(64)" in capsys.readouterr().out
    assert len({r.key for r in load_records(str(log))}) == 3
