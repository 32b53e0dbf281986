"""The papers' experiment files (conf/experiment): each composes and trains one batch
(debug=fdr) with its own protocol, party model, head and partition, on synthetic data of its
dataset's shape (the real sets are downloads or licensed copies; the slow multirun test of
tests/test_train.py runs the ones installed here on their real data). The quick experiments
(*_digits, *_breast_cancer) keep the values the reference digests pin."""

from pathlib import Path

import numpy as np
import pytest
from conftest import CONF_DIR
from omegaconf import OmegaConf

from vfl_lightning.data import datasets
from vfl_lightning.data.raw import RawDataset
from vfl_lightning.run.key_index import target_parameters
from vfl_lightning.run.schema import META_KEYS
from vfl_lightning.train import train

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
QUICK = {"pbm_search", "npq_breast_cancer", "audit_ldp_tight"} | {
    e for e in EXPERIMENTS if e.endswith(("_digits", "_breast_cancer"))
}
PAPERS = [e for e in EXPERIMENTS if e not in QUICK]
"""Every experiment of a paper's table or figure (docs/papers.md maps them)."""


def _shape(feature_shape, classes, *, views=None, image=False, official_test=False):
    return {
        "shape": feature_shape,
        "classes": classes,
        "views": views,
        "image": image,
        "official_test": official_test,
    }


# name -> one sample's shape, classes, views, image, official test split (docs/datasets.md)
SHAPES = {
    "cifar10": _shape((3, 32, 32), 10, image=True, official_test=True),
    "mnist": _shape((1, 28, 28), 10, image=True, official_test=True),
    "fashion_mnist": _shape((1, 28, 28), 10, image=True, official_test=True),
    "emnist": _shape((1, 28, 28), 47, image=True, official_test=True),
    "har": _shape((561,), 6, official_test=True),
    "phishing": _shape((30,), 2),
    "credit_default": _shape((23,), 2),
    "parkinson": _shape((753,), 2),
    "mfeat": _shape((649,), 10, views=[76, 216, 64, 240, 47, 6]),
    "caltech7": _shape((3766,), 7, views=[48, 40, 254, 1984, 512, 928]),
    "mimic3": _shape((714,), 2, views=[42] * 17, official_test=True),
    "nus_wide": _shape((1634,), 2, views=[634, 1000], official_test=True),
    "modelnet10": _shape((12, None, None), 10, views=[1] * 12, image=True, official_test=True),
    "imagenet100": _shape((3, None, None), None, image=True, official_test=True),
}

SPEED = ["data.batch_size=4", "data.eval_batch_size=8"]
"""Small batches for the synthetic run (the experiment's own protocol and models all the same)."""
SMALLER_IMAGES = {
    "pbm_modelnet10": ["data.options.image_size=16"],
    "pbm_imagenet100": ["data.options.image_size=16"],
}


def synthetic_loader(name: str):
    """A loader returning random data of ``name``'s shape (image sizes and class counts from the
    data config's options, as the real loaders read them)."""
    spec = SHAPES[name]

    def load(data_dir=None, *, image_size=None, num_classes=None, **options) -> RawDataset:
        shape = tuple(image_size if s is None else s for s in spec["shape"])
        classes = spec["classes"] or num_classes
        rows = 20 * classes + 40  # every class in a stratified validation split
        rng = np.random.default_rng(0)
        # pixels in [0, 1] as the image loaders give them; standardized-like table columns
        draw = rng.random if spec["image"] else rng.standard_normal
        x = draw(size=(rows, *shape)).astype(np.float32)
        y = np.arange(rows) % classes
        test = np.arange(rows - rows // 5, rows) if spec["official_test"] else None
        return RawDataset(
            name, x, y, classes, test_index=test, view_sizes=spec["views"], is_image=spec["image"]
        )

    return load


def test_every_table_and_figure_has_its_experiment():
    """The names docs/papers.md maps every table and figure of the four papers to."""
    expected = {
        *("pbm_cifar10", "pbm_har", "pbm_phishing", "pbm_modelnet10", "pbm_imagenet100"),
        *("cascade_mnist", "cascade_label_inference", "cascade_cifar10"),
        *("fedbcd_mnist_cnn", "fedbcd_mimic", "fedbcd_credit", "fedbcd_nus_wide"),
        *("fedvs_fashion_mnist", "fedvs_mfeat", "fedvs_emnist", "fedvs_parkinson"),
        *("fedvs_credit", "fedvs_caltech7", "fedvs_table1", "fedvs_motivation"),
    }
    assert set(PAPERS) == expected
    papers_md = (Path(CONF_DIR).parent / "docs" / "papers.md").read_text()
    for name in PAPERS:
        assert f"experiment={name}" in papers_md, name


@pytest.mark.parametrize("name", PAPERS)
def test_paper_experiment_trains_one_batch_on_data_of_its_shape(make_cfg, monkeypatch, name):
    cfg = make_cfg(f"experiment={name}", "debug=fdr", *SPEED, *SMALLER_IMAGES.get(name, []))
    monkeypatch.setitem(datasets.LOADERS, cfg.data.name, synthetic_loader(cfg.data.name))
    results = train(cfg)
    assert results["algo"] == cfg.algo.name
    assert results["comm/rounds"] >= 1
    assert 0.0 <= results["val/acc"] <= 1.0
    assert cfg.optimizer.momentum == 0.0  # plain SGD, every paper's update


@pytest.mark.parametrize("name", ["fedvs_fashion_mnist", "fedvs_credit"])
def test_fedvs_experiments_compose_with_the_vafl_baseline(make_cfg, name):
    """algo=vafl in a FedVS experiment: the experiment's PN clients, mean fusion, stragglers and
    simulated-time stop, none of the FedVS family's coding settings (every FedVS experiment's
    vafl job: the slow test of the documented sweeps)."""
    cfg = make_cfg(f"experiment={name}", "algo=vafl")
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    assert algo["name"] == "vafl" and "K" not in algo and "l_x" not in algo
    assert algo["max_simulated_s"] is not None
    assert cfg.party._target_.endswith("PolynomialNetwork")
    assert cfg.mechanism.fusion == "mean" and cfg.network.straggler_fraction > 0


def test_vafl_trains_in_a_fedvs_experiment_with_coding_settings(make_cfg, monkeypatch):
    """fedvs_mfeat sets the FedVS family's quantization (fedvs.l_x, ...): vafl still trains."""
    cfg = make_cfg("experiment=fedvs_mfeat", "algo=vafl", "debug=fdr", *SPEED)
    monkeypatch.setitem(datasets.LOADERS, "mfeat", synthetic_loader("mfeat"))
    results = train(cfg)
    assert results["algo"] == "vafl" and results["comm/rounds"] >= 1


def _sweep_jobs(line: str) -> list[list[str]]:
    """The jobs of a documented `python train.py -m ...` line to compose: every choice of the
    groups that change what is built (algo, party, fusion, head widths), the first value of the
    other swept keys."""
    import itertools
    import shlex

    structural = ("algo", "party", "mechanism.fusion", "head.hidden")
    fixed, varied = [], []
    for arg in shlex.split(line)[2:]:
        if arg == "-m" or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        choices, depth, start = [], 0, 0
        for i, char in enumerate(value):
            depth += {"[": 1, "]": -1}.get(char, 0)
            if char == "," and depth == 0:
                choices.append(value[start:i])
                start = i + 1
        choices.append(value[start:])
        if key in structural:
            varied.append([f"{key}={c}" for c in choices])
        else:
            fixed.append(f"{key}={choices[0]}")
    return [[*fixed, *combo] for combo in itertools.product(*varied)]


@pytest.mark.slow
def test_every_documented_sweep_composes(make_cfg):
    """Each `python train.py` line of docs/papers.md composes for every algorithm, party model
    and fusion it names, and every key of its algo, models, mechanism and optimizer is one their
    class takes (a typo, or an experiment's protocol setting that a swept baseline does not take,
    fails here, not on a GPU)."""
    papers_md = (Path(CONF_DIR).parent / "docs" / "papers.md").read_text()
    lines = [line for line in papers_md.splitlines() if line.startswith("python train.py")]
    assert len(lines) > 30
    for line in lines:
        for job in _sweep_jobs(line):
            cfg = make_cfg(*job)
            assert cfg.algo.name, line
            for group in ("algo", "party", "head", "mechanism", "optimizer"):
                taken = target_parameters(str(cfg[group]["_target_"]))
                extra = set(cfg[group]) - META_KEYS - (taken or set(cfg[group]))
                assert not extra, f"{line}: {group} ({cfg[group]['_target_']}) gets {extra}"
