"""bench/gpu_check.py: its device guard flags a tensor moved off the device (shown with the meta
device standing in for an accelerator), and its ``--device cpu`` mode trains every family. The
field's matrix product uses no integer matrix product (which CUDA lacks) and is exact."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vfl_lightning.mechanisms.field import DEFAULT_PRIME, field_matmul

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_check  # noqa: E402


def test_device_guard_flags_a_move_to_the_cpu_and_nothing_else():
    on_device = torch.empty(4, 3, device="meta")
    guard = gpu_check.DeviceGuard("meta")
    with guard:
        (on_device * 2 + 1).sum(0)  # stays on the device
    assert not guard.moves and not guard.host_created and guard.scalar_reads == 0
    with guard:
        torch.empty_like(on_device, device="cpu")  # a (4, 3) tensor off the device
        torch.zeros(5)  # made on the host, from nothing on the device
        torch.empty_like(on_device[0, 0], device="cpu")  # one element: a scalar read
    ((site, count),) = guard.moves.items()
    assert count == 1 and "aten.empty_like" in site and "test_gpu_check" not in site
    assert sum(guard.host_created.values()) == 1
    assert guard.scalar_reads == 1


def test_refuses_a_missing_gpu_and_an_unknown_device(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "tpu"])
    assert "--device must be cuda or cpu, got 'tpu'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            gpu_check.main(["--device", "cuda"])
        assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_mode_trains_every_family(tmp_path, capsys):
    """About a minute on a 2-core machine."""
    code = gpu_check.main(["--device", "cpu", "--steps", "10", "--work", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    for family in gpu_check.FAMILIES:
        # an asynchronous batch holds several server iterations, so a run may pass 10 steps
        steps = re.search(rf"^{family}: (\d+) steps, test acc", out, re.MULTILINE)
        assert steps is not None and int(steps.group(1)) >= 10, out
    assert "steps/s on cpu" in out


INTEGER_PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "mv", "addmv"}


class IntegerProducts(TorchDispatchMode):
    """Records the aten matrix products that run on integer tensors (CUDA has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in INTEGER_PRODUCTS and any(not t.is_floating_point() for t in tensors):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("inner", [1, 2, 3, 700])
def test_field_matmul_is_exact_without_integer_matrix_products(inner):
    """The code path CUDA runs (no int64 matmul on CUDA) is the one the CPU runs: limbs in
    float64 products (or summed elementwise products for inner <= 2), exact against Python
    integers for elements next to p, with broadcast batch dimensions."""
    prime = DEFAULT_PRIME
    gen = torch.Generator().manual_seed(inner)
    a = prime - 1 - torch.randint(0, 50, (2, 3, inner), generator=gen)
    b = prime - 1 - torch.randint(0, 50, (inner, 4), generator=gen)
    with IntegerProducts() as mode:
        got = field_matmul(a, b, prime)
    assert mode.seen == []
    want = [
        [
            [sum(x * b[k, j].item() for k, x in enumerate(row)) % prime for j in range(4)]
            for row in m
        ]
        for m in a.tolist()
    ]
    assert got.tolist() == want
