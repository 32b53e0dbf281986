"""FedVS collusion, empirically: T colluding clients learn nothing of a victim's data from their
shares, K + T of them (T + 1 when K = 1) reconstruct it exactly."""

import pytest
import torch

from vfl_lightning.mechanisms.lcc import LagrangeCode
from vfl_lightning.privacy.attacks.collusion import (
    collude,
    collusion_experiment,
    digits_segments,
    main,
)


@pytest.mark.parametrize(("K", "T"), [(1, 1), (1, 2), (2, 1)])
def test_the_threshold_is_exactly_k_plus_t_colluders(K, T):
    rows = collusion_experiment(digits_segments(K, 16), num_clients=6, K=K, T=T, trials=10)
    assert [row["colluders"] for row in rows] == list(range(1, K + T + 1))
    for row in rows[:-1]:
        assert row["all_exact"] == 0.0
        assert row["exact_fraction"] < 1e-3
    assert rows[-1]["all_exact"] == 1.0


def test_t_colluders_estimate_is_independent_of_the_secret():
    code = LagrangeCode(5, 1, 2)
    generator = torch.Generator().manual_seed(3)
    parities = {}
    for secret in (0, 1):
        segments = torch.full((1, 400, 8), secret, dtype=torch.long)
        estimates = [
            collude(code, code.encode_data(segments, generator=generator), [0, 3])
            for _ in range(10)
        ]
        parities[secret] = float(torch.stack(estimates).remainder(2).double().mean())
    # 32,000 uniform field elements per secret: their parity mean is 1/2 within 5 sigma (0.014)
    for value in parities.values():
        assert abs(value - 0.5) < 0.014


def test_the_command_prints_one_row_per_coalition_size(capsys):
    assert main(["--clients", "5", "--K", "1", "--T", "1", "--samples", "4", "--trials", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and '"colluders": 2' in lines[1] and '"all_exact": 1.0' in lines[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--clients", "0"], "--clients must be an integer in [1, 10000], got 0"),
        (["--clients", "100000000"], "--clients must be an integer in [1, 10000], got 100000000"),
        (["--K", "0"], "--K must be an integer >= 1, got 0"),
        (["--T", "-1"], "--T must be an integer >= 0, got -1"),
        (["--trials", "0"], "--trials must be an integer >= 1, got 0"),
        (["--samples", "0"], "--samples must be an integer >= 1, got 0"),
        (["--seed", "-1"], "--seed must be an integer in [0, 4294967295], got -1"),
        (
            ["--samples", "5000"],
            "--K 1 segments of --samples 5000 images need 5000, and digits has 1797: lower "
            "--samples to at most 1797",
        ),
        (
            ["--clients", "3", "--K", "2", "--T", "2"],
            "FedVS needs N >= 2(K+T-1)+1 = 7 clients for K=2, T=2, got N=3; use at least 5 "
            "clients for K=2, T=1 (--clients, --K, --T)",
        ),
        (["--clients", "abc"], "argument --clients: invalid int value: 'abc' (see --help)"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(capsys, argv, message):
    """Before: a ValueError, ZeroDivisionError or reshape traceback (status 1), an allocation of
    400 GB for --clients 100000000, NaN rows for --samples 0."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {message}\n" and captured.out == ""
