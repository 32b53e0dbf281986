"""VertiBench's splits and measures (data/vertibench.py, the two partitions): the definitions on
cases with known answers, the α estimator on Dirichlet draws, the partitions hitting their α and
β, and the same numbers as the vertibench package's evaluators where it is installed."""

from __future__ import annotations

import numpy as np
import pytest

from vfl_lightning.data.datamodule import VerticalDataModule
from vfl_lightning.data.partition import make_partition
from vfl_lightning.data.vertibench import (
    assign_by_importance,
    dirichlet_alpha,
    icor,
    pcor,
    spearman,
    split_beta,
)

CORRELATION = "vfl_lightning.data.partition.vertibench_correlation"
IMPORTANCE = "vfl_lightning.data.partition.vertibench_importance"


def breast_cancer(**kwargs) -> VerticalDataModule:
    return VerticalDataModule(
        **{"name": "breast_cancer", "num_parties": 3, "partition": "even", **kwargs}
    )


def test_pcor_and_icor_on_blocks_with_known_answers():
    assert pcor(np.eye(6)) == pytest.approx(0.0, abs=1e-12)  # uncorrelated: equal singular values
    assert pcor(np.ones((5, 5))) == pytest.approx(1.0)  # one group: singular values (5, 0, ...)
    assert pcor(np.ones((1, 4))) == 0.0  # one singular value
    # two groups of 4 perfectly correlated features, no correlation between the groups
    corr = np.kron(np.eye(2), np.ones((4, 4)))
    grouped = [np.arange(4), np.arange(4, 8)]
    spread = [np.array([0, 1, 4, 5]), np.array([2, 3, 6, 7])]
    assert icor(corr, grouped) == pytest.approx(-1.0)  # inner 1, inter 0
    assert icor(corr, spread) > icor(corr, grouped)
    assert split_beta(corr, grouped, seed=0) == 0.0
    assert split_beta(corr, spread, seed=0) == pytest.approx(1.0)


def test_spearman_ranks_and_constant_columns():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    x[:, 1] = np.exp(x[:, 0])  # a monotone function: rank correlation exactly 1
    x[:, 2] = 4.0  # constant: correlates 0 with everything, itself too
    corr = spearman(x)
    assert corr[0, 1] == pytest.approx(1.0) and corr[0, 0] == pytest.approx(1.0)
    assert np.all(corr[2] == 0) and np.all(corr[:, 2] == 0)


def test_the_alpha_estimator_recovers_the_dirichlet_parameter():
    rng = np.random.default_rng(1)
    for alpha in (0.3, 1.0, 5.0):
        estimates = [dirichlet_alpha(rng.dirichlet(np.full(40, alpha))) for _ in range(200)]
        assert np.median(estimates) == pytest.approx(alpha, rel=0.2)
    assert dirichlet_alpha([1.0, 1.0, 1.0]) == float("inf")


def test_importance_is_assigned_to_match_the_shares():
    importance = np.ones(100)
    parts = assign_by_importance(importance, np.array([0.5, 0.3, 0.2]))
    assert [len(p) for p in parts] == [50, 30, 20]
    parts = assign_by_importance(np.array([5.0, 1.0, 1.0]), np.array([0.98, 0.01, 0.01]))
    assert all(len(p) >= 1 for p in parts)  # no party is left empty


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_the_correlation_partition_reaches_its_beta(beta):
    data = breast_cancer(partition={"_target_": CORRELATION, "beta": beta})
    assert [len(s.index) for s in data.slices] == [10, 10, 10]
    assert data.split_scores["data/split_beta"] == pytest.approx(beta, abs=0.05)


def test_the_importance_partition_follows_alpha():
    measured = {}
    for alpha in (0.05, 1000.0):
        data = breast_cancer(partition={"_target_": IMPORTANCE, "alpha": alpha}, seed=3)
        measured[alpha] = data.split_scores["data/split_alpha"]
        again = breast_cancer(partition={"_target_": IMPORTANCE, "alpha": alpha}, seed=3)
        assert all(
            np.array_equal(a.index, b.index) for a, b in zip(data.slices, again.slices, strict=True)
        )
    assert measured[0.05] < 0.5 < 50 < measured[1000.0]
    other_seed = breast_cancer(partition={"_target_": IMPORTANCE, "alpha": 1.0}, seed=4)
    same_seed = breast_cancer(partition={"_target_": IMPORTANCE, "alpha": 1.0}, seed=3)
    assert any(
        not np.array_equal(a.index, b.index)
        for a, b in zip(other_seed.slices, same_seed.slices, strict=True)
    )


def test_string_partitions_keep_working_and_get_only_what_they_take():
    assert [s.shape for s in make_partition("quadrants", (1, 8, 8), 4)] == [(1, 4, 4)] * 4
    columns = [[0, 2], [1, 3]]
    parts = make_partition("explicit", (4,), 2, columns=columns, seed=5)
    assert [p.index.tolist() for p in parts] == columns
    parts = make_partition("views", (6,), 2, view_sizes=[2, 4])
    assert [len(p.index) for p in parts] == [2, 4]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"_target_": "no_such_module.split"},
            "data.partition._target_=no_such_module.split cannot be imported",
        ),
        (
            {"_target_": CORRELATION, "beta": "high"},
            "data.partition.beta must be a number for vertibench_correlation",
        ),
        ({"_target_": CORRELATION, "beta": 1.5}, "data.partition.beta must be a number in [0, 1]"),
        ({"_target_": IMPORTANCE, "alpha": 0}, "data.partition.alpha must be a number > 0"),
        ({"_target_": IMPORTANCE, "gamma": 1}, "data.partition.gamma is not an option of"),
        ({"_target_": IMPORTANCE, "seed": 1}, "data.partition.seed is not an option of"),
        ("no_partition", "unknown partition 'no_partition'"),
    ],
)
def test_bad_partitions_are_one_line(spec, words):
    with pytest.raises(ValueError) as refused:
        make_partition(spec, (30,), 3, x_train=np.zeros((5, 30)), y_train=np.zeros(5))
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_the_vertibench_package_measures_the_same():
    """The package's evaluators on breast_cancer: the same Pcor, Icor and α (of the same
    scores) as ours, and its Spearman matrix equals ours."""
    evaluator = pytest.importorskip("vertibench.Evaluator")
    data = breast_cancer(partition={"_target_": CORRELATION, "beta": 0.3})
    from vfl_lightning.data.vertibench import (
        feature_importance,
        party_importance,
        sample_rows,
    )

    x, y = sample_rows(_train_rows(data), data.splits["train"].y.numpy())
    parts = [s.index for s in data.slices]
    ours = spearman(x)
    theirs = evaluator.CorrelationEvaluator(svd_algo="exact")
    np.testing.assert_allclose(theirs.spearmanr_pandas(x), ours, atol=1e-10)
    order = np.concatenate(parts)
    permuted = ours[np.ix_(order, order)]
    assert theirs.overall_corr_score(permuted, [len(p) for p in parts]) == pytest.approx(
        icor(ours, parts), abs=1e-10
    )
    block = ours[np.ix_(parts[0], parts[1])]
    assert evaluator.CorrelationEvaluator.pcor_singular_exact(block) == pytest.approx(pcor(block))
    scores = party_importance(feature_importance(x, y), parts)
    reference = evaluator.ImportanceEvaluator().evaluate_alpha(scores=scores)
    assert reference == pytest.approx(dirichlet_alpha(scores))


def _train_rows(data: VerticalDataModule) -> np.ndarray:
    from vfl_lightning.data.datasets import load_dataset

    raw = load_dataset(data.name)
    return raw.x[data.split_index["train"]]
