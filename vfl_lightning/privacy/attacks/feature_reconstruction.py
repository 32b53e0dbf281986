"""Feature reconstruction by the server (training-based back mapping): a decoder fitted on the
auxiliary rows maps what the server received to the target party's raw features. Plain torch."""

from __future__ import annotations

import torch

from vfl_lightning.privacy.attacks.views import ServerView

RIDGE_PENALTIES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)
"""Ridge penalties tried by leave-one-out cross-validation on the auxiliary rows."""


def decoder_inputs(received: torch.Tensor, degree: int) -> torch.Tensor:
    """Decoder features of each received row: a constant, the row (degree 1), and with degree 2
    also every product of two of its entries (a quadratic decoder), float64."""
    rows = received.to(torch.float64)
    columns = [torch.ones(rows.shape[0], 1, dtype=torch.float64), rows]
    if degree == 2:
        first, second = torch.triu_indices(rows.shape[1], rows.shape[1])
        columns.append(rows[:, first] * rows[:, second])
    return torch.cat(columns, dim=1)


def fit_ridge(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Ridge regression of ``targets`` on ``inputs`` (float64; first column the constant, not
    penalized after centring), its penalty chosen among :data:`RIDGE_PENALTIES` by the exact
    leave-one-out error e_i / (1 - H_ii). Returns (weights, leave-one-out MSE)."""
    mean_in, mean_out = inputs[:, 1:].mean(0), targets.mean(0)
    centred, centred_out = inputs[:, 1:] - mean_in, targets - mean_out
    n = centred.shape[0]
    best: tuple[float, torch.Tensor] | None = None
    eye = torch.eye(centred.shape[1], dtype=torch.float64)
    for penalty in RIDGE_PENALTIES:
        system = centred.T @ centred + penalty * eye
        slopes = torch.linalg.solve(system, centred.T @ centred_out)
        hat = (centred @ torch.linalg.solve(system, centred.T)).diagonal() + 1.0 / n
        residuals = (centred_out - centred @ slopes) / (1.0 - hat).clamp_min(1e-9).unsqueeze(1)
        error = float(residuals.pow(2).mean())
        if best is None or error < best[0]:
            best = (error, slopes)
    error, slopes = best
    intercept = mean_out - mean_in @ slopes
    return torch.cat([intercept[None], slopes]), error


def fit_decoder(received: torch.Tensor, features: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The decoder (degree 1 or 2, ridge) with the lower leave-one-out error on the auxiliary
    rows: (degree, weights). A quadratic decoder is tried only while it has fewer inputs than
    there are auxiliary rows."""
    targets = features.reshape(features.shape[0], -1).to(torch.float64)
    degrees = [1]
    width = received.shape[1]
    if width * (width + 3) // 2 < received.shape[0]:
        degrees.append(2)
    fits = [(fit_ridge(decoder_inputs(received, d), targets), d) for d in degrees]
    (weights, _), degree = min(fits, key=lambda fit: fit[0][1])
    return degree, weights


def decode(received: torch.Tensor, degree: int, weights: torch.Tensor) -> torch.Tensor:
    return decoder_inputs(received, degree) @ weights


def class_means(labels: torch.Tensor, features: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean auxiliary features of each class (the auxiliary mean for a class with no row): the
    labels-only baseline a server holding the labels has without any message."""
    flat = features.reshape(features.shape[0], -1).to(torch.float64)
    means = flat.mean(0).expand(num_classes, -1).clone()
    for c in labels.unique().tolist():
        means[c] = flat[labels == c].mean(0)
    return means


def relative_mse(prediction: torch.Tensor, truth: torch.Tensor, aux_mean: torch.Tensor) -> float:
    """MSE of ``prediction`` over the MSE of predicting ``aux_mean`` (1: learns nothing)."""
    truth = truth.reshape(truth.shape[0], -1).to(torch.float64)
    reference = (truth - aux_mean).pow(2).mean()
    return float((prediction - truth).pow(2).mean() / reference.clamp_min(1e-12))


def r2_per_feature(prediction: torch.Tensor, truth: torch.Tensor) -> list[float | None]:
    """Coefficient of determination of each feature on the evaluated rows (None: a constant
    feature, whose R² is undefined)."""
    truth = truth.reshape(truth.shape[0], -1).to(torch.float64)
    variance = truth.var(0, unbiased=False)
    error = (prediction - truth).pow(2).mean(0)
    return [
        None if v <= 1e-12 else float(1.0 - e / v)
        for e, v in zip(error.tolist(), variance.tolist(), strict=True)
    ]


class FeatureReconstructor:
    """The server's adversary: keeps, per training sample, the last value it received that
    carries the target party (:class:`ServerView`), and the sample's label; after training it
    fits a decoder on the auxiliary rows and reconstructs every other observed row."""

    def __init__(self, num_samples: int, num_classes: int) -> None:
        self.num_classes = int(num_classes)
        self.received: torch.Tensor | None = None
        self.labels = torch.zeros(num_samples, dtype=torch.long)
        self.seen = torch.zeros(num_samples, dtype=torch.bool)
        self.separate: bool | None = None

    def observe(self, view: ServerView) -> None:
        idx = view.idx.cpu()
        if self.received is None:
            self.received = torch.zeros(self.seen.shape[0], view.received.shape[1])
        self.received[idx] = view.received.cpu().to(self.received.dtype)
        self.labels[idx] = view.labels.cpu()
        self.seen[idx] = True
        self.separate = view.separate

    def reconstruct(
        self, aux_idx: torch.Tensor, aux_features: torch.Tensor, rest_idx: torch.Tensor
    ) -> dict[str, torch.Tensor | int]:
        """Decoded features and the labels-only baseline for ``rest_idx``, from the auxiliary
        rows ``aux_idx`` whose raw features ``aux_features`` the server knows."""
        degree, weights = fit_decoder(self.received[aux_idx], aux_features)
        means = class_means(self.labels[aux_idx], aux_features, self.num_classes)
        return {
            "decoded": decode(self.received[rest_idx], degree, weights),
            "label_baseline": means[self.labels[rest_idx]],
            "degree": degree,
        }
