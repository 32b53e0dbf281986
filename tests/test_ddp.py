"""Data-parallel training (trainer=ddp): batch shares, the gather and gradient reductions across
ranks, a federation trained by 2 ranks equal to the same federation trained by 1, and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from vfl_lightning.parallel import FederationDDPStrategy, RowShares, share_bounds

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(world_size: int, work):
    """Run ``work(rows)`` on ``world_size`` threads, each a gloo rank of one in-process group."""
    store = dist.HashStore()
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, world_size)
            results[rank] = work(RowShares(world_size, rank, group))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return [results[r] for r in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("rows", [0, 1, 2, 7, 32])
def test_shares_cover_the_batch_in_order(rows, world_size):
    bounds = [share_bounds(rows, world_size, r) for r in range(world_size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [len(s) for s in torch.arange(rows).tensor_split(world_size)]


def test_rows_out_of_range_are_refused():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        RowShares(2, 2)


@pytest.mark.parametrize(("world_size", "rows"), [(2, 8), (3, 7), (3, 2)])
def test_gather_and_gradient_sum_equal_the_one_process_step(world_size, rows):
    """Two parties of different widths: every rank gathers the global embeddings, and after the
    cut-layer backward of its own rows plus the all-reduce each rank holds the global party
    gradient; the server's gradient is rank 0's. All ranks agree bit for bit; against one process
    only float32 rounding differs (matmuls over a share, a sum of partial gradient sums). Includes
    an empty share (3 ranks, 2 rows)."""
    torch.manual_seed(0)
    xs = [torch.randn(rows, 5), torch.randn(rows, 3, 2)]
    target = torch.randn(rows, 7)
    parties = [
        torch.nn.Linear(5, 4),
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)),
    ]
    head = torch.nn.Linear(7, 7)

    def step(rows_view: RowShares, models, server):
        local = [m(x) for m, x in zip(models, rows_view.take(xs), strict=True)]
        embeddings = rows_view.gather(local, rows)
        fused = torch.cat([h.detach() for h in embeddings], 1).requires_grad_()
        loss = (server(fused) - target).pow(2).mean()
        loss.backward()
        gradients = fused.grad.split([4, 3], dim=1)
        torch.autograd.backward(
            torch.stack([(h * g).sum() for h, g in zip(embeddings, gradients, strict=True)]).sum()
        )
        params = [p for m in models for p in m.parameters()]
        rows_view.sum_gradients(params)
        server_params = list(server.parameters())
        if rows_view.rank != 0:  # a replica whose server gradient differs takes rank 0's
            for p in server_params:
                p.grad.add_(1.0)
        rows_view.broadcast_gradients(server_params)
        return (
            [h.detach().clone() for h in embeddings],
            [p.grad.clone() for p in params],
            [p.grad.clone() for p in server_params],
        )

    def copies():
        import copy

        return [copy.deepcopy(p) for p in parties], copy.deepcopy(head)

    reference = step(RowShares(), *copies())
    ranks = run_ranks(world_size, lambda view: step(view, *copies()))
    for got, want in zip(ranks[0], reference, strict=True):  # a share's matmul may round apart
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    for other in ranks[1:]:  # every rank holds the same global values, bit for bit
        for got, want in zip(other, ranks[0], strict=True):
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _fit_in_threads(make_cfg, world_size: int, *overrides: str):
    """Fit the configured protocol once per rank, ranks as threads over an in-process gloo group;
    returns each rank's (module, final metrics and callback results). Configs and models are built before the threads start (Hydra's
    compose and the global seed are process-wide)."""
    import lightning as L
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import Checkpoint

    from vfl_lightning.run.assemble import make_callbacks
    from vfl_lightning.train import build

    cfg = make_cfg(*overrides)
    built = []
    for _ in range(world_size):
        L.seed_everything(cfg.seed, verbose=False)
        built.append(build(cfg))
    trainers = []
    for _ in range(world_size):
        callbacks = [  # as train() builds them (no progress bar when it is disabled)
            c for c in make_callbacks(cfg) if not isinstance(c, Checkpoint)
        ]
        trainers.append(
            instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=callbacks)
        )

    def work(rows: RowShares):
        datamodule, module = built[rows.rank]
        module.data_parallel_rows = lambda: rows
        trainer = trainers[rows.rank]
        trainer.fit(module, datamodule=datamodule)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        for callback in trainer.callbacks:
            metrics |= callback.results() if hasattr(callback, "results") else {}
        return module, metrics

    return run_ranks(world_size, work)


@pytest.mark.parametrize(
    "protocol",
    [
        ["algo=npq", "attack=label_inference"],
        ["algo=pbm"],
        ["algo=ldp"],
        ["algo=splitnn", "data.active_party=true"],
        ["algo=fedpbcd", "algo.local_steps=3"],
        ["algo=fedbcd_s", "algo.local_steps=2"],
    ],
    ids=lambda p: "-".join(o.split("=")[1] for o in p),
)
def test_two_ranks_train_the_one_process_model(make_cfg, protocol):
    """The module's own step code (embed, cut-layer backward, party optimizers, server step) on 2
    ranks equals one process on the same global batches: parameters to float32 summation order
    (each rank sums its rows' part of a party gradient, the all-reduce adds the parts), and the
    ledger, clock and mechanism state (PBM masks and noise included) exactly; validation (shares
    of every eval batch, metrics of the whole batch on every rank), the privacy accountant and the
    label-inference attack to the same rounding. 45 rows: uneven shares."""
    overrides = (
        *protocol,
        "trainer.max_steps=6",
        "data.batch_size=45",
        "trainer.val_check_interval=2",
    )
    ((single, single_metrics),) = _fit_in_threads(make_cfg, 1, *overrides)
    assert "val/acc" in single_metrics
    assert "privacy/sample_eps" in single_metrics or "pbm" not in protocol[0]
    assert single_metrics.get("attack/label_inference/observed_samples", 270) == 270
    for module, metrics in _fit_in_threads(make_cfg, 2, *overrides):
        assert metrics.keys() == single_metrics.keys()
        for key, value in single_metrics.items():
            numeric = isinstance(value, float)
            assert metrics[key] == (pytest.approx(value, rel=1e-5) if numeric else value), key
        assert module.rows.world_size == 2
        assert module.wire.state_dict() == single.wire.state_dict()
        assert module.wire.ledger.rounds == single.wire.ledger.rounds > 0
        assert str(module.mechanism.state_dict()) == str(single.mechanism.state_dict())
        for (name, got), want in zip(
            module.state_dict().items(), single.state_dict().values(), strict=True
        ):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def _fake_trainer(strategy, world_size: int):
    return SimpleNamespace(strategy=strategy, world_size=world_size, global_rank=world_size - 1)


@pytest.mark.parametrize(
    ("algo", "world_size"),
    [("cascade", 1), ("cascade", 2), ("zoo_vfl", 2), ("syn_zoo_vfl", 2), ("vafl", 2), ("fedvs", 2)],
)
def test_protocols_that_cannot_split_batches_refuse_ddp(make_cfg, algo, world_size):
    """Refused on several ranks, and under the DDP strategy even on one."""
    from vfl_lightning.train import build

    overrides = ["experiment=fedvs_digits"] if algo == "fedvs" else [f"algo={algo}"]
    _, module = build(make_cfg(*overrides))
    module.trainer = _fake_trainer(FederationDDPStrategy(), world_size)
    with pytest.raises(ValueError, match=rf"^algo={algo} cannot run data-parallel .*trainer=ddp"):
        module.data_parallel_rows()


def test_other_multi_process_strategies_are_refused(make_cfg):
    from lightning.pytorch.strategies import DDPStrategy

    from vfl_lightning.train import build

    _, module = build(make_cfg("algo=npq"))
    module.trainer = _fake_trainer(DDPStrategy(), 2)
    with pytest.raises(
        ValueError, match=r"^strategy DDPStrategy with 2 process\(es\).*trainer=ddp"
    ):
        module.data_parallel_rows()
    module.trainer = _fake_trainer(FederationDDPStrategy(), 2)
    rows = module.data_parallel_rows()
    assert (rows.world_size, rows.rank) == (2, 1)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_workers_that_do_not_run_the_script_are_refused(start_method):
    with pytest.raises(ValueError, match=f"got start_method='{start_method}'"):
        FederationDDPStrategy(start_method=start_method)


def test_distributed_sampler_is_refused():
    from torch.utils.data import DataLoader, DistributedSampler

    loader = DataLoader(range(8), sampler=DistributedSampler(range(8), num_replicas=2, rank=0))
    with pytest.raises(ValueError, match="trainer.use_distributed_sampler=false"):
        FederationDDPStrategy().process_dataloader(loader)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["npq", "pbm"])
def test_cli_ddp_on_two_gloo_processes_equals_one_process(make_cfg, tmp_path, algo):
    """`python train.py trainer=ddp` (2 CPU processes, gloo, Lightning's launcher, the default
    logger: W&B offline) against the in-process 1-process run of the same config: parameters to
    summation order, results.json (accuracy, loss to float32 rounding, ledger, clock, privacy)
    equal, written, logged to W&B and summarized by rank 0 only."""
    from vfl_lightning.train import train

    common = [f"algo={algo}", "trainer.max_epochs=2", "data.batch_size=64"]
    single = make_cfg(*common)
    expected = train(single)
    run_dir = tmp_path / "ddp"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    env.pop("WANDB_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "train.py", "trainer=ddp", "trainer.accelerator=cpu"]
        + ["trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0", *common]
        + [f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    got = json.loads((run_dir / "results.json").read_text())
    assert got["status"] == "finished"
    for key, value in expected.items():
        # model_digest hashes the exact bits; DDP equals one process to summation order (the
        # parameters are compared with a tolerance below)
        if key in ("checkpoint", "time/wall_s", "model_digest"):
            continue
        if key.endswith("loss") or key.endswith("loss_epoch"):
            assert got[key] == pytest.approx(value, rel=1e-5), key
        else:
            assert got[key] == value, key
    # the default logger (W&B offline) on rank 0 only; the summary printed once, by rank 0
    assert len(list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))) == 1
    logged = json.loads((run_dir / "wandb_run.json").read_text())
    assert logged["mode"] == "offline"
    assert (run_dir / "wandb_id").read_text().strip() == logged["id"]  # rank 1 wrote none
    assert done.stdout.count("results: ") == 1 and done.stdout.count("model_digest") == 1
    assert (run_dir / "train_ddp_process_1.log").read_text() == ""
    a = torch.load(Path(single.paths.output_dir) / "checkpoints/last.ckpt", weights_only=False)
    b = torch.load(run_dir / "checkpoints/last.ckpt", weights_only=False)
    assert a["vfl"]["wire"] == b["vfl"]["wire"]
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][name], value, rtol=1e-5, atol=1e-6, msg=name)
