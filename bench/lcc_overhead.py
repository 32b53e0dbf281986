"""FedVS coding overhead per round: model-share encoding + coded embeddings + decoding, divided by
the plain sum-of-embeddings forward of the same PN parties; data sharing (once) timed separately.

    python bench/lcc_overhead.py [--device cpu|cuda] [--clients 8 16 28] [--repeats 20]

Setting (FedVS Appendix C, Fashion-MNIST shaped): 784 features split evenly over N clients, 1-layer
PN, embedding width 64, 256 samples per round, T = 1, K = (N-1)//2 (the largest K that N allows).
"""

from __future__ import annotations

import argparse
import time

import torch

from vfl_lightning.mechanisms.fedvs import FedVSCodec
from vfl_lightning.models.pn import PolynomialNetwork


def timed(fn, repeats: int, device: torch.device) -> float:
    """Fastest of ``repeats`` runs of ``fn()`` after two warm-ups (robust to other load)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(N: int, *, samples: int, features: int, width: int, batch: int, repeats: int, device):
    K, T = (N - 1) // 2, 1
    gen = torch.Generator(device=device).manual_seed(N)
    sizes = [features // N + (1 if n < features % N else 0) for n in range(N)]
    parties = [PolynomialNetwork((d,), embedding_dim=width, degree=1).to(device) for d in sizes]
    xs = [torch.rand(samples, d, generator=gen, device=device) for d in sizes]
    codec = FedVSCodec(N, K, T, l_x=8, l_w=8, weight_bound=1.0)
    codec.check(xs, [1] * N)
    power = [p.power_features(x) for p, x in zip(parties, xs, strict=True)]
    per_segment = batch // K
    positions = torch.randperm(samples // K, generator=gen, device=device)[:per_segment]
    rows = torch.cat([positions + k * (samples // K) for k in range(K)])
    batch_xs = [x[rows] for x in xs]
    responders = list(range(codec.threshold))
    weights = [p.weight.detach() for p in parties]

    def share_data():
        codec.share_data(power, generator=gen)

    def plain_forward():
        with torch.no_grad():
            torch.stack([p(x) for p, x in zip(parties, batch_xs, strict=True)]).sum(0)

    def encode():
        codec.share_models(weights, generator=gen)

    def coded_all():
        return codec.coded_embeddings(positions, clients=responders)

    def coded_one():
        return codec.coded_embeddings(positions, clients=[0])

    share_data()
    encode()
    coded = coded_all()

    def decode():
        codec.decode_average(coded, responders)

    t = {
        "data_sharing": timed(share_data, max(3, repeats // 5), device),
        "plain": timed(plain_forward, repeats, device),
        "encode": timed(encode, repeats, device),
        "coded_R": timed(coded_all, repeats, device),
        "coded_1": timed(coded_one, repeats, device),
        "decode": timed(decode, repeats, device),
    }
    one_client_encode = t["encode"] / N
    t["ratio_simulated"] = (t["encode"] + t["coded_R"] + t["decode"]) / t["plain"]
    t["ratio_per_client"] = (one_client_encode + t["coded_1"] + t["decode"]) / t["plain"]
    return K, codec.threshold, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 16, 28])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device={device} threads={args.threads} samples={args.samples} batch=256 width=64 T=1")
    header = (
        f"{'N':>3} {'K':>3} {'R':>3} {'plain ms':>9} {'encode ms':>10} {'coded(R) ms':>12} "
        f"{'decode ms':>10} {'ratio sim':>10} {'ratio/client':>13} {'data share s':>13}"
    )
    print(header)
    for N in args.clients:
        K, R, t = measure(
            N,
            samples=args.samples,
            features=784,
            width=64,
            batch=256,
            repeats=args.repeats,
            device=device,
        )
        print(
            f"{N:>3} {K:>3} {R:>3} {1e3 * t['plain']:>9.3f} {1e3 * t['encode']:>10.3f} "
            f"{1e3 * t['coded_R']:>12.3f} {1e3 * t['decode']:>10.3f} {t['ratio_simulated']:>10.2f} "
            f"{t['ratio_per_client']:>13.2f} {t['data_sharing']:>13.3f}"
        )
    print(
        "ratio sim = (encode all N models + R coded embeddings + decode) / plain forward of all N"
        " parties + sum, as one process simulates a round;\nratio/client = (one client's encode +"
        " one coded embedding + decode) / the same plain forward: the protocol's critical path."
    )


if __name__ == "__main__":
    main()
