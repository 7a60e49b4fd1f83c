"""The copy-task example: training through backend.mha makes attention diagonal, in torch and JAX.

The training test runs a small setting (n=6, V=32, E=16, H=2, 60 Adam steps) per framework.
Its thresholds, from the setup rather than from a run:

* before training the readout is random, so the held-out cross-entropy is near ln V = 3.47;
  after it must be below a quarter of its starting value and the accuracy at least 0.9
  (chance is 1/V = 0.03).
* uniform attention puts 1/n = 0.17 on the diagonal. With no residual connection the readout
  sees token i only through attention, so copying needs query i to weight key i: the mean
  diagonal mass must reach 0.5 (3/n, i.e. half of every row's weight on average) and rise by
  at least 0.3. Six seeds of this setting reached 0.66 to 0.83 with torch.
"""

import json
import math

import numpy as np
import pytest

from attnspec.bench import copy_task
from attnspec.reports import copy_task_report
from attnspec.reports._io import ResultsError

SMALL = copy_task.Settings(
    vocab=32, n=6, embed_dim=16, num_heads=2, batch=16, steps=60, lr=0.02, eval_batch=64
)


def test_diagonal_mass_of_identity_and_uniform():
    n = 5
    assert copy_task.diagonal_mass(np.broadcast_to(np.eye(n), (3, 2, n, n))) == 1.0
    assert copy_task.diagonal_mass(np.full((2, n, n), 1 / n)) == pytest.approx(1 / n, rel=1e-15)
    w = np.zeros((n, n))
    w[np.arange(n), (np.arange(n) + 1) % n] = 1  # every query on its neighbour: none on i
    assert copy_task.diagonal_mass(w) == 0.0


def test_both_frameworks_get_the_same_start_and_batches():
    a, b = copy_task.initial_params(SMALL), copy_task.initial_params(SMALL)
    assert all(np.array_equal(a[k], b[k]) for k in ("embed", "w_r", "b_r"))
    assert np.array_equal(a["mha"].w_q, b["mha"].w_q)
    (train, held), (train2, _) = copy_task.batches(SMALL), copy_task.batches(SMALL)
    assert train.shape == (SMALL.steps, SMALL.batch, SMALL.n) and held.shape == (SMALL.eval_batch, SMALL.n)
    assert np.array_equal(train, train2)
    assert not np.array_equal(train[0, : SMALL.batch], held[: SMALL.batch])  # held out is another draw


@pytest.mark.parametrize("framework", copy_task.FRAMEWORKS)
def test_training_makes_attention_diagonal(framework):
    pytest.importorskip(framework)
    r = copy_task.train(framework, SMALL)
    before, after = r["before"], r["after"]
    assert len(r["losses"]) == SMALL.steps
    assert before["loss"] == pytest.approx(math.log(SMALL.vocab), rel=0.25)  # random readout
    assert after["loss"] < before["loss"] / 4, (before["loss"], after["loss"])
    assert np.mean(r["losses"][-10:]) < r["losses"][0] / 4
    assert after["accuracy"] >= 0.9, after["accuracy"]
    uniform = 1 / SMALL.n
    assert after["diagonal_mass"] >= 3 * uniform, after["diagonal_mass"]
    assert after["diagonal_mass"] - before["diagonal_mass"] >= 0.3, (
        before["diagonal_mass"],
        after["diagonal_mass"],
    )
    w = np.asarray(after["weights"])  # (n, n), rows are attention distributions
    assert w.shape == (SMALL.n, SMALL.n)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)  # float32 sums of n = 6 weights
    assert (np.argmax(w, axis=-1) == np.arange(SMALL.n)).all()  # every query's peak is itself


def _doc(n=3):
    eye = np.eye(n).tolist()
    run = {
        "framework": "torch",
        "version": "x",
        "losses": [2.0, 1.0],
        "wall_s": 0.5,
        "before": {"loss": 2.0, "accuracy": 0.1, "diagonal_mass": 1 / n, "weights": eye},
        "after": {"loss": 0.1, "accuracy": 1.0, "diagonal_mass": 1.0, "weights": eye},
    }
    settings = {"vocab": 4, "n": n, "embed_dim": 4, "num_heads": 1, "batch": 2, "eval_batch": 2, "lr": 0.01}
    return {"schema": copy_task.SCHEMA, "settings": settings, "runs": [run]}


def test_load_names_the_file_and_the_problem(tmp_path):
    path = tmp_path / "copy_task.json"
    doc = _doc()
    doc["runs"][0]["after"]["weights"] = [[1.0, 0.0]]
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"copy_task\.json: runs\[0\]\.after: field 'weights' must be"):
        copy_task_report.load(path)
    path.write_text(json.dumps({**_doc(), "schema": "attnspec.bench/1"}))
    with pytest.raises(ResultsError, match=r"expected 'attnspec\.copy_task/1'"):
        copy_task_report.load(path)
    path.write_text(json.dumps(_doc()))
    assert copy_task_report.load(path)["runs"][0]["framework"] == "torch"


def test_render_gives_the_index_a_copy_task_section(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tabulate")
    from attnspec.reports.render import render

    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    (results / "copy_task.json").write_text(json.dumps(_doc()))
    written = render(results, out)
    assert "plots/copy_task.png" in written
    index = (out / "index.md").read_text()
    assert "## Copy task" in index
    assert "![Copy task: attention before and after training, and the loss](plots/copy_task.png)" in index
    assert "| torch | x | 2 → 0.1 | 0.1 → 1 | 0.333 → 1 | 2 |" in index


def test_unknown_framework_is_refused_by_name():
    from attnspec import SpecError

    with pytest.raises(SpecError, match=r"copy_task\.train: framework='mxnet' must be one of torch, jax"):
        copy_task.train("mxnet", SMALL)
