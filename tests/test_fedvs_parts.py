"""FedVS building blocks without Lightning: delays and timelines, segment batches, the codec, DP."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vfl_lightning.data.segments import SegmentBatchSampler, SegmentedDataModule
from vfl_lightning.mechanisms.analytic_gaussian import (
    analytic_gaussian_sigma,
    clip_rows,
    gaussian_delta,
    privatize_embedding,
)
from vfl_lightning.mechanisms.fedvs import FedVSCodec
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.wire.stragglers import (
    StragglerDelays,
    fedvs_timing,
    model_sharing_scale,
    transfer_seconds,
    wait_timing,
)


def test_straggler_means_follow_section_6_2():
    delays = StragglerDelays(8, seed=0)
    assert delays.means.tolist() == [0.1] * 4 + [2 + 4 * i / 8 for i in range(1, 5)]
    draws = np.stack([delays.draw() for _ in range(20000)])
    # Exponential means within 5 standard errors (sd of an exponential = its mean).
    assert np.all(np.abs(draws.mean(0) - delays.means) < 5 * delays.means / math.sqrt(20000))
    assert model_sharing_scale(8, 32) == 9 / 32
    assert transfer_seconds(300e6, 300.0) == pytest.approx(1.0)


def test_same_seed_same_delays_and_state_roundtrip():
    a, b = StragglerDelays(6, seed=3), StragglerDelays(6, seed=3)
    a.draw()
    state = a.state_dict()
    first = a.draw()
    b.load_state_dict(state)
    assert np.array_equal(first, b.draw())
    with pytest.raises(ValueError, match=r"straggler_fraction must be in \[0, 1\], got 1.5"):
        StragglerDelays(4, straggler_fraction=1.5)
    with pytest.raises(ValueError, match="fast_mean must be >= 0, got -1"):
        StragglerDelays(4, fast_mean=-1)


def test_fedvs_waits_for_all_shares_then_the_R_th_upload():
    timing = fedvs_timing(
        share_seconds=np.array([0.1, 0.1, 0.1, 0.1, 0.1]),
        share_delays=np.array([0.0, 0.2, 0.0, 0.0, 0.4]),
        coded_compute_s=0.5,
        upload_delays=np.array([3.0, 0.1, 0.2, 5.0, 0.3]),
        upload_seconds=0.0,
        threshold=3,
        server_s=0.0,
        download_s=0.25,
        update_s=0.0,
    )
    # Shares ready at 0.5, computing until 1.0, then uploads: clients 1, 2, 4 come first.
    assert timing.used == (1, 2, 4)
    assert timing.decision_s == pytest.approx(1.3)
    assert timing.duration_s == pytest.approx(1.55)


def test_wait_and_ignore_timelines():
    kwargs = dict(
        compute_s=np.zeros(4),
        upload_delays=np.array([0.1, 4.0, 0.3, 2.0]),
        upload_seconds=np.zeros(4),
        server_s=0.0,
        download_s=0.0,
        update_s=0.0,
    )
    wait = wait_timing(**kwargs)
    assert wait.used == (0, 2, 3, 1) and wait.decision_s == pytest.approx(4.0)
    ignore = wait_timing(**kwargs, deadline_s=1.0)
    assert ignore.used == (0, 2) and ignore.decision_s == pytest.approx(
        1.0
    )  # waits to the deadline
    first = wait_timing(**kwargs, deadline_s=0.01)  # nothing by the deadline: the first arrival
    assert first.used == (0,) and first.decision_s == pytest.approx(0.1)
    early = wait_timing(**kwargs, deadline_s=9.0)  # everyone arrived: no need to wait longer
    assert early.used == (0, 2, 3, 1) and early.decision_s == pytest.approx(4.0)


def test_segment_batches_take_the_same_positions_from_every_segment():
    sampler = SegmentBatchSampler(103, 3, 5, seed=1)
    assert sampler.segment_size == 34 and len(sampler) == 6
    seen = []
    for batch in sampler:
        assert batch.dtype == torch.int64
        batch = batch.reshape(3, 5)
        assert torch.equal(batch - batch[0], torch.arange(3)[:, None].expand(3, 5) * 34)
        seen += batch[0].tolist()
    assert len(set(seen)) == 30 and max(seen) < 34
    sampler.set_epoch(1)
    assert not torch.equal(next(iter(sampler)), next(iter(SegmentBatchSampler(103, 3, 5, seed=1))))
    with pytest.raises(
        ValueError, match="K=3 segments holds 2 samples, fewer than the per-segment batch 5"
    ):
        SegmentBatchSampler(7, 3, 5, seed=0)


def test_segmented_datamodule_batches_and_errors():
    dm = SegmentedDataModule(
        name="digits", num_parties=8, partition="strips", batch_size=64, segments=2
    )
    xs, y, idx = next(iter(dm.train_dataloader()))
    assert len(xs) == 8 and len(y) == 64
    assert torch.equal(idx[32:] - idx[:32], torch.full((32,), dm.segment_size))
    with pytest.raises(ValueError, match=r"data.batch_size=30 must be a multiple of algo.K=4"):
        SegmentedDataModule(
            name="digits", num_parties=8, partition="strips", batch_size=30, segments=4
        )


def test_codec_decodes_the_average_of_all_clients_from_any_responders():
    gen = torch.Generator().manual_seed(0)
    N, K, T, rows = 6, 2, 1, 40
    models = [PolynomialNetwork((3,), embedding_dim=4, num_layers=2) for _ in range(N)]
    xs = [torch.randn(rows, 3, generator=gen) for _ in range(N)]
    codec = FedVSCodec(N, K, T, l_x=10, l_w=8, weight_bound=1.0)
    codec.check(xs, [2] * N)
    data_bits = codec.share_data(
        [m.power_features(x) for m, x in zip(models, xs, strict=True)], generator=gen
    )
    assert data_bits == [20 * 7 * 31] * N  # S = 20 rows of 3*2+1 features, 31 bits each
    model_bits = codec.share_models([m.weight for m in models], generator=gen)
    assert model_bits == [7 * 4 * 31] * N
    positions = torch.tensor([3, 0, 17])
    responders = [5, 2, 0, 3, 1]
    coded = codec.coded_embeddings(positions, clients=responders)
    assert torch.equal(coded, codec.coded_embeddings(positions)[responders])
    average = codec.decode_average(coded, responders)
    rows_used = torch.cat([positions, positions + 20])
    plain = sum(m(x[rows_used]).double() for m, x in zip(models, xs, strict=True)) / N
    assert torch.allclose(average, plain, atol=1e-2)
    assert (average - plain).abs().max() > 0


def test_codec_precheck_uses_the_data_range():
    codec = FedVSCodec(3, 1, 1, l_x=16, l_w=16)
    with pytest.raises(ValueError, match="lower algo.l_w from 16"):
        codec.check([torch.full((4, 100), 50.0)] * 3, [2] * 3)


def test_analytic_gaussian_calibration():
    sigma = analytic_gaussian_sigma(epsilon=5.0, delta=1e-5, sensitivity=2.0)
    assert gaussian_delta(sigma=sigma, epsilon=5.0, sensitivity=2.0) == pytest.approx(
        1e-5, rel=1e-4
    )
    assert gaussian_delta(sigma=0.9 * sigma, epsilon=5.0, sensitivity=2.0) > 1e-5
    # Balle & Wang's analytic mechanism is tighter than the classical bound (valid for eps < 1).
    classical = math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    assert analytic_gaussian_sigma(epsilon=0.5, delta=1e-5, sensitivity=1.0) < classical
    with pytest.raises(ValueError, match=r"algo.dp.epsilon must be > 0, got 0"):
        analytic_gaussian_sigma(epsilon=0, delta=1e-5, sensitivity=1.0)
    with pytest.raises(ValueError, match=r"algo.dp.delta must be in \(0, 1\), got 1.0"):
        analytic_gaussian_sigma(epsilon=1, delta=1.0, sensitivity=1.0)


def test_privatized_embedding_is_clipped_plus_gaussian_noise():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4000, 8, generator=gen) * 3
    assert torch.all(clip_rows(h, 1.0).norm(dim=1) <= 1.0 + 1e-6)
    noisy = privatize_embedding(h, clip=1.0, sigma=0.5, generator=gen)
    residual = noisy - clip_rows(h, 1.0)
    assert abs(residual.std().item() - 0.5) < 0.01
    assert abs(residual.mean().item()) < 0.01
