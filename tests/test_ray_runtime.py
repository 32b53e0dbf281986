"""runtime=ray: party actors give bit-identical results to runtime=local, resume exactly, stop with
one line when an actor dies, run on a two-node cluster; pair seeds come from X25519 agreement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import RAY_TWO_PARTIES as TWO_PARTIES
from conftest import checkpoint_wire as ledger
from conftest import kill_party, ray_party_dir, saved_party_states
from conftest import last_checkpoint as last

from vfl_lightning.algorithms.parties import tensor_digest
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms import PBM, GaussianLDP
from vfl_lightning.mechanisms.keys import (
    fresh_private_key,
    party_pair_seeds,
    public_bytes,
    seeded_pair_seeds,
    seeded_private_key,
)
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking
from vfl_lightning.seeding import derive_seed
from vfl_lightning.train import train


# ----------------------------------------------------------------- key agreement (no Ray needed)
def test_pair_seeds_agree_between_members_and_differ_between_pairs():
    keys = [fresh_private_key() for _ in range(4)]
    publics = [public_bytes(k) for k in keys]
    held = [party_pair_seeds(k, m, publics) for m, k in enumerate(keys)]
    for m in range(4):
        assert sorted(held[m]) == sorted((min(m, o), max(m, o)) for o in range(4) if o != m)
        for pair, seed in held[m].items():
            other = pair[1] if pair[0] == m else pair[0]
            assert held[other][pair] == seed
    assert len({s for h in held for s in h.values()}) == 6
    local = seeded_pair_seeds(4, seed=3)
    assert local == seeded_pair_seeds(4, seed=3) and local != seeded_pair_seeds(4, seed=4)
    me = seeded_private_key(3, 1)
    local_publics = [public_bytes(seeded_private_key(3, m)) for m in range(4)]
    assert party_pair_seeds(me, 1, local_publics) == {p: s for p, s in local.items() if 1 in p}


def test_each_party_masks_alone_exactly_as_the_joint_masking_and_the_server_holds_no_seed():
    keys = [fresh_private_key() for _ in range(3)]
    publics = [public_bytes(k) for k in keys]
    pbm = PBM(num_parties=3, b=8, beta=0.2)
    embeddings = [torch.rand(5, 4) * 2 - 1 for _ in range(3)]
    generators = [
        torch.Generator().manual_seed(derive_seed(0, "party", "train", m)) for m in range(3)
    ]
    joint = PBM(num_parties=3, b=8, beta=0.2)
    joint.masking = PairwiseMasking(
        3,
        joint.bits_per_element,
        pair_seeds={
            p: s for m, k in enumerate(keys) for p, s in party_pair_seeds(k, m, publics).items()
        },
    )
    together = joint.encode(embeddings, generator=generators, round=7)
    alone = []
    for m, key in enumerate(keys):
        party = PBM(num_parties=3, b=8, beta=0.2)
        party.set_pair_seeds(party_pair_seeds(key, m, publics))
        gen = torch.Generator().manual_seed(derive_seed(0, "party", "train", m))
        alone.append(party.encode_party(m, embeddings[m], generator=gen, round=7))
    for a, b in zip(alone, together, strict=True):
        assert torch.equal(a, b)
    pbm.set_pair_seeds({})
    assert pbm.masking.pair_seeds == []
    with pytest.raises(PermissionError, match="party 0 holds no pair seeds of its own"):
        pbm.encode_party(0, embeddings[0], round=7)
    ldp = GaussianLDP(num_parties=3, sigma=0.5)
    gens = [torch.Generator().manual_seed(m) for m in range(3)]
    noisy = ldp.encode(embeddings, generator=gens)
    assert torch.equal(
        noisy[2], ldp.encode_party(2, embeddings[2], generator=torch.Generator().manual_seed(2))
    )


def test_model_digest_changes_with_one_bit_a_name_or_the_order():
    weight, bias = torch.randn(3, 2), torch.tensor(0.5)
    named = [("w", weight), ("b", bias)]
    digest = tensor_digest(named).hexdigest()
    assert digest == tensor_digest([("w", weight.clone()), ("b", bias.clone())]).hexdigest()
    flipped = weight.clone()
    flipped.view(torch.int32)[0, 0] ^= 1
    assert tensor_digest([("w", flipped), ("b", bias)]).hexdigest() != digest
    assert tensor_digest([("b", bias), ("w", weight)]).hexdigest() != digest
    assert tensor_digest([("v", weight), ("b", bias)]).hexdigest() != digest


# ----------------------------------------------------------------- refusals (no Ray needed)
def test_ray_refuses_a_protocol_that_runs_only_locally_in_one_line(make_cfg, monkeypatch):
    """Every built-in algo runs under Ray; a protocol class that declares only ``local`` (e.g. a
    user's own) is refused, naming where it runs and what Ray runs."""
    from vfl_lightning.algorithms.sync import SyncVFL

    monkeypatch.setattr(SyncVFL, "RUNTIMES", ("local",))
    cfg = make_cfg("algo=npq", "runtime=ray", "runtime.party_seeds=derived")
    with pytest.raises(
        ConfigError, match=r"^algo=npq does not run on runtime=ray \(it runs on local\)"
    ) as error:
        train(cfg)
    message = str(error.value)
    assert "\n" not in message
    ray_algos = message.split("runtime=ray runs algo=")[1].split(", ")
    assert ray_algos == sorted(
        ["cascade", "zoo_vfl", "syn_zoo_vfl", "vafl"]
        + ["fedbcd", "fedbcd_s", "fedpbcd", "fedsgd"]
        + ["fedvs", "fedvs_wait", "fedvs_ignore", "fedvs_wait_dp"]
    ), (
        "the list is read from conf/algo and the classes' own RUNTIMES (SyncVFL's patched to "
        "local; FedBCD declares its own)"
    )


def test_unknown_runtime_and_ddp_with_ray_are_refused(make_cfg):
    cfg = make_cfg("runtime=ray", "runtime.party_seeds=derived")
    cfg.runtime._target_ = "vfl_lightning.run.runtimes.MpiRuntime"
    with pytest.raises(
        ConfigError, match=r"^runtime._target_=vfl_lightning.run.runtimes.MpiRuntime cannot be"
    ):
        train(cfg)
    with pytest.raises(ConfigError, match="runtime=ray runs one server process"):
        train(make_cfg("runtime=ray", "runtime.party_seeds=derived", "trainer=ddp"))


def test_bad_party_resources_are_named():
    pytest.importorskip("ray")
    from vfl_lightning.runtime.ray_parties import party_options

    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['gpus'\]"):
        party_options({"gpus": 1}, 2)
    with pytest.raises(ConfigError, match="lists 1 entries, the run has 2 parties"):
        party_options([{"num_cpus": 1}], 2)
    assert party_options([{"resources": {"party0": 1}}, {}], 2)[0] == {
        "num_cpus": 0,
        "resources": {"party0": 1},
    }


# ----------------------------------------------------------------- equivalence
def test_ray_equals_local_bit_for_bit_pbm(make_cfg, ray_session):
    """Same seed: identical model_digest, ledger and metrics; the ray run really serialized."""
    common = ["algo=pbm", *TWO_PARTIES, "trainer.max_epochs=1", "trainer.limit_train_batches=6"]
    local_cfg = make_cfg(*common, "runtime=local")
    ray_cfg = make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived")
    local, remote = train(local_cfg), train(ray_cfg)
    assert (local["runtime"], remote["runtime"]) == ("local", "ray")
    assert len(local["model_digest"]) == 64
    assert remote["model_digest"] == local["model_digest"]
    assert ledger(ray_cfg) == ledger(local_cfg)
    for key in ("comm/uplink_mb", "comm/downlink_mb", "comm/rounds", "val/acc", "test/acc"):
        assert remote[key] == local[key], key
    assert local["comm/serialized_mb"] == 0.0
    # 6 rounds x 2 parties x (32 x 16 masked 7-bit integers as uint8 up, float32 gradients down)
    payload_mb = 6 * 2 * 32 * 16 * (1 + 4) / 1e6
    assert payload_mb < remote["comm/serialized_mb"] < 1.5 * payload_mb
    saved = json.loads((Path(ray_cfg.paths.output_dir) / "results.json").read_text())
    assert saved["model_digest"] == remote["model_digest"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo", ["npq", "splitnn", "ldp", "fedsgd", "fedbcd", "fedbcd_s", "fedpbcd"]
)
def test_ray_equals_local_for_the_sync_family(make_cfg, ray_session, algo):
    steps = ["algo.local_steps=2"] if algo.startswith("fed") and algo != "fedsgd" else []
    common = [f"algo={algo}", *steps, *TWO_PARTIES, "trainer.max_epochs=2"]
    common += ["trainer.limit_train_batches=3"]
    local_cfg, ray_cfg = (
        make_cfg(*common, "runtime=local"),
        make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"),
    )
    local, remote = train(local_cfg), train(ray_cfg)
    assert remote["model_digest"] == local["model_digest"]
    assert ledger(ray_cfg) == ledger(local_cfg)


@pytest.mark.slow
def test_a_sparsified_gradient_crosses_ray_in_its_top_k_form(make_cfg, ray_session):
    """defense=gradient_sparsification: each actor receives the kept entries (a frame of packed
    indices and float32 values) and decodes them itself; the run is the local one."""
    common = ["algo=npq", *TWO_PARTIES, "trainer.max_epochs=1", "trainer.limit_train_batches=6"]
    common += ["defense=gradient_sparsification"]
    local = train(make_cfg(*common))
    remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    assert remote["model_digest"] == local["model_digest"]
    assert remote["comm/downlink_mb"] == local["comm/downlink_mb"]
    # 6 rounds x 2 parties: float32 embeddings up (32 x 16), 52 of 512 gradient entries down
    dense_down = 6 * 2 * 32 * 16 * 4 / 1e6
    assert remote["comm/downlink_mb"] < 0.2 * dense_down
    assert remote["comm/serialized_mb"] < remote["comm/uplink_mb"] + 0.5 * dense_down


# ----------------------------------------------------------------- faults and resume
@pytest.mark.slow
def test_dead_actor_stops_in_one_line_and_the_checkpoint_resumes_to_the_straight_run(
    make_cfg, ray_session
):
    common = [
        "algo=pbm",
        "runtime=ray",
        "runtime.party_seeds=derived",
        *TWO_PARTIES,
        "trainer.limit_train_batches=4",
    ]
    common += ["trainer.max_epochs=2"]
    straight = make_cfg(*common)
    expected = train(straight)
    killed, message = kill_party(make_cfg, common, epoch=1, batch=2, party=1)
    assert message.startswith("party 1's Ray actor died at training round 6")
    assert message.endswith(f"its last checkpoint is intact: resume with ckpt_path={last(killed)}")
    checkpoint = torch.load(last(killed), weights_only=False)
    assert (
        checkpoint["epoch"] == 0
        and len(saved_party_states(ray_party_dir(killed), checkpoint, 2)) == 2
    )
    resumed_cfg = make_cfg(*common, f"ckpt_path={last(killed)}")
    resumed = train(resumed_cfg)
    assert resumed["model_digest"] == expected["model_digest"]
    assert ledger(resumed_cfg) == ledger(straight)


# ----------------------------------------------------------------- a two-node cluster
@pytest.mark.slow
def test_two_node_cluster_on_localhost(make_cfg, tmp_path):
    """``ray start --head`` plus a second ``ray start --address`` (both on 127.0.0.1); the run
    joins with runtime.address=auto, one party pinned to each node by a custom resource."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = 6391
    env = dict(os.environ, RAY_ADDRESS=f"127.0.0.1:{port}")

    def run(*args):
        subprocess.run([ray_cli, *args], check=True, env=env, capture_output=True, timeout=180)

    run(
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        '--resources={"node_a": 1}',
        "--include-dashboard=false",
    )
    try:
        run(
            "start",
            f"--address=127.0.0.1:{port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            '--resources={"node_b": 1}',
        )
        common = ["algo=npq", *TWO_PARTIES, "trainer.max_epochs=1", "trainer.limit_train_batches=3"]
        cluster = make_cfg(
            *common,
            "runtime=ray",
            "runtime.party_seeds=derived",
            "runtime.address=auto",
            "~runtime.party_resources",
            "+runtime.party_resources=[{resources: {node_a: 1}}, {resources: {node_b: 1}}]",
        )
        old = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = env["RAY_ADDRESS"]
        try:
            remote = train(cluster)
        finally:
            if old is None:
                os.environ.pop("RAY_ADDRESS")
            else:
                os.environ["RAY_ADDRESS"] = old
        assert not ray.is_initialized()
        local = train(make_cfg(*common))
        assert remote["model_digest"] == local["model_digest"]
    finally:
        run("stop", "--force")


def test_runtime_ray_without_ray_installed_says_how_to_install_it(make_cfg, monkeypatch):
    import sys

    from vfl_lightning.train import start_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError, match=r"^runtime=ray needs Ray, which is not installed: pip"):
        start_ray(make_cfg("runtime=ray", "runtime.party_seeds=derived"))
