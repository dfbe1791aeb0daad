"""Tasks tuned with their weights prepacked (`SearchTask(..., prepack=True)`): each candidate
is timed with its layout copies of inputs done once, outside the timed kernel; the task is
another objective (its own key), and export writes the kernel with its pre-transform."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
import tuning
from tuning import LocalBuilder, LocalRunner, SearchTask, workloads
from tuning.measure import MeasureErrorNo, MeasureInput, RunOptions, _build_job, _prepare_job, _run_job
from tuning.prepack import layout_copies
from tuning.records import RecordWriter, load_records, record_from_json, record_to_json
from tuning.space import SearchSpace

ARGS = (1, 8, 9, 9, 16, 3, 3, 2, 1)


def test_a_prepack_task_is_another_task_that_survives_json_and_pickling() -> None:
    plain, packed = SearchTask(workloads.conv2d, ARGS), SearchTask(workloads.conv2d, ARGS, prepack=True)
    assert packed.prepack and not plain.prepack
    assert packed.workload_key != plain.workload_key and packed.name == f"{plain.name} prepacked"
    assert "prepack" not in plain.to_json() and packed.to_json()["prepack"] is True
    for again in (SearchTask.from_json(packed.to_json()), SearchTask.from_json(packed.to_json(), packed.dag_json()),
                  pickle.loads(pickle.dumps(packed))):
        assert again.prepack and again.workload_key == packed.workload_key and again.name == packed.name
    # a record of it rebuilds it, with its flag
    d = record_to_json(MeasureInput(packed, ()), tuning.MeasureResult((1e-3,), MeasureErrorNo.NO_ERROR))
    assert record_from_json(d).task().workload_key == packed.workload_key
    with pytest.raises(tuning.TuningError, match="CPU targets"):
        SearchTask(workloads.conv2d, ARGS, target="cuda -arch=sm_80", prepack=True)


def test_a_candidate_is_timed_with_its_weight_packed_outside_the_kernel(tmp_path: Path) -> None:
    task = SearchTask(workloads.conv2d, ARGS, prepack=True)
    cand = SearchSpace(task).instantiate(2, {}, np.random.default_rng(3))  # a relayout sketch
    assert cand is not None and layout_copies(cand.steps) == ["kernel.pack"]
    build = _build_job(task, cand.steps, "f")
    assert build.error == MeasureErrorNo.NO_ERROR, build.error_msg
    (about,) = build.info["prepack"]
    # the kernel reads the packed weight in the plain one's place; the pre-transform reads the
    # task's tensor 1 (the weight)
    assert about["func"] == "f_pack_kernel" and about["src"] == 1
    assert build.info["kernel_args"] == [["t", 0], ["p", 0], ["t", 2]]
    assert int(np.prod(about["shape"])) == 16 * 8 * 3 * 3
    key = _prepare_job(task, str(tmp_path))
    err, costs, msg = _run_job(key, build, RunOptions(number=1, repeat=2, min_repeat_ms=0.0))
    assert err == "NO_ERROR" and len(costs) == 2, msg  # checked against the default schedule
    # a candidate without a layout copy is built and timed as it is
    plain = SearchSpace(task).instantiate(0, {}, np.random.default_rng(0))
    assert plain is not None and not layout_copies(plain.steps)
    b0 = _build_job(task, plain.steps, "g")
    assert b0.error == MeasureErrorNo.NO_ERROR and not b0.info.get("prepack")
    assert _run_job(key, b0, RunOptions(number=1, repeat=1, min_repeat_ms=0.0))[0] == "NO_ERROR"


def test_tune_and_export_a_prepack_task(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tuning.cli import main

    builder, runner = pools
    task = SearchTask(workloads.conv2d, ARGS, prepack=True)
    log = str(tmp_path / "conv.jsonl")
    tuning.tune([task], trials=8, log=log, seed=0, batch_size=8, cost_model="random", remeasure=0,
                builder=builder, runner=runner, progress=False)
    recs = [r for r in load_records(log, task) if r.valid]
    # relayout candidates measured (and checked) with the weight packed outside the kernel
    assert any(layout_copies(r.steps) for r in recs), "the short tune measured no relayout candidate"
    # export, from a log whose best packs the weight: the kernel takes the packed weight and
    # the library carries its pre-transform, described in the manifest
    best = min((r for r in recs if layout_copies(r.steps)), key=lambda r: r.mean)
    one = str(tmp_path / "one.jsonl")
    with RecordWriter(one) as w:
        w.write(MeasureInput(task, best.steps, best.sketch, best.params), best.result())
    assert main(["export", "--log", one, "-o", str(tmp_path / "out"), "--name", "k"]) == 0
    capsys.readouterr()
    lib = tc.runtime.load_module(str(tmp_path / "out" / "k.so"))
    name = "conv2d_1_8_9_9_16_3_3_2_1_prepacked"
    pp = tuning.prepacked_best(task, one)
    assert len(pp.packs) == 1
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    w8 = rng.standard_normal((16, 8, 3, 3)).astype("float32")
    want = numpy_conv(x, w8, 2, 1)
    got = np.full(want.shape, np.nan, np.float32)
    wp = np.empty(pp.packs[0].shape, "float32")
    lib[f"{name}_pack_kernel"](w8, wp)
    lib[name](x, wp, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    manifest = json.dumps(json.loads((tmp_path / "out" / "k.json").read_text()))
    assert f"{name}_pack_kernel" in manifest and "pre_transform_of" in manifest and "prepacked" in manifest
    # apply_best keeps the task's own arguments (the plain weight): the ranked kernel with its
    # copy made once per call at root, in the layout it was tuned to read
    sch, args = task.apply_best(one)
    assert [a.name for a in args] == [t.name for t in task.tensors]
    copies = [st for st in sch.stages if st.op.name == "kernel_pack"]
    assert len(copies) == 1 and copies[0].attach_type == "root"
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(sch, args)(x, w8, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
