"""The types and ranges of the keys every protocol shares: ``RANGES[key] = (accepts(value),
what the key takes)``, checked by :mod:`vfl_lightning.run.schema` before anything is built."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from vfl_lightning.run.key_index import choices


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int, *, null: bool = False, also: Iterable = ()) -> tuple[Callable, str]:
    allowed = set(also)
    text = f"an integer >= {low}" + "".join(f" or {a}" for a in sorted(allowed))
    return (
        lambda v: (null and v is None) or (is_int(v) and (v >= low or v in allowed)),
        text + (" or null" if null else ""),
    )


def number(low: float, high: float, *, low_open=False, high_open=False, null=False):
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    if math.isfinite(high):
        text = f"a number in {left}{low:g}, {high:g}{right}"
    elif math.isfinite(low):
        text = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        text = "a finite number"

    def accept(value) -> bool:
        if null and value is None:
            return True
        if not is_number(value):
            return False
        return (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high
        )

    return accept, text + (" or null" if null else "")


def batch_limit(open_zero: bool) -> tuple[Callable, str]:
    low = "(0" if open_zero else "[0"

    def accept(value) -> bool:
        if value is None or (is_int(value) and value >= (1 if open_zero else 0)):
            return True
        return isinstance(value, float) and (0 < value <= 1 if open_zero else 0 <= value <= 1)

    count = ">= 1" if open_zero else ">= 0"
    return accept, f"null, an integer {count} (batches) or a float in {low}, 1] (a fraction)"


def choice(*options) -> tuple[Callable, str]:
    return (lambda v: v in options), f"one of {options}"


def choice_or_dotted(*options) -> tuple[Callable, str]:
    """One of ``options``, or the dotted path ``package.module.function`` of one outside the
    library (imported when used)."""

    def accept(value) -> bool:
        return value in options or (isinstance(value, str) and "." in value.strip("."))

    return accept, f"one of {options} or a dotted path package.module.function"


def boolean_or(*options) -> tuple[Callable, str]:
    return (lambda v: isinstance(v, bool) or v in options), f"true, false or one of {options}"


def number_list(low: float, *, null: bool = True) -> tuple[Callable, str]:
    def accept(value) -> bool:
        if value is None:
            return null
        return (
            isinstance(value, list) and bool(value) and all(is_number(v) and v > low for v in value)
        )

    return accept, f"a list of numbers > {low:g}" + (" or null" if null else "")


def index_list(value) -> bool:
    return value is None or (isinstance(value, list) and all(is_int(v) and v >= 0 for v in value))


def column_lists(value) -> bool:
    """``data.columns``: null, or one list of flat column indices per party."""
    if value is None:
        return True
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(c, list) and all(is_int(i) and i >= 0 for i in c) for c in value)
    )


def devices(value) -> bool:
    """Lightning's ``devices``: a count, -1 (all), "auto", indices as a list or a string."""
    if is_int(value):
        return value >= 1 or value == -1
    if isinstance(value, list):
        return bool(value) and all(is_int(v) and v >= 0 for v in value)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        return (
            value == "auto"
            or value.strip() == "-1"
            or (bool(parts) and all(p.isdigit() for p in parts))
        )
    return False


def metric_name(value) -> bool:
    return isinstance(value, str) and "/" in value


WANDB_PROJECT_FORBIDS = "/\\#?%:"
"""Characters W&B refuses in a project name (its settings' project check)."""


def wandb_project(value) -> bool:
    """A name W&B takes as a project: at most 128 characters, none of :data:`WANDB_PROJECT_FORBIDS`
    (W&B's own check runs only when the logger starts its run, after the data is built)."""
    return value is None or (
        isinstance(value, str)
        and len(value) <= 128
        and not any(c in value for c in WANDB_PROJECT_FORBIDS)
    )


def wandb_tags(value) -> bool:
    """W&B run tags: each a string of 1 to 64 characters."""
    return value is None or (
        isinstance(value, list) and all(isinstance(t, str) and 1 <= len(t) <= 64 for t in value)
    )


INF = math.inf
RANGES: dict[str, tuple[Callable, str]] = {
    "data.num_parties": integer(1),
    "data.batch_size": integer(1),
    "data.eval_batch_size": integer(1),
    "data.val_fraction": number(0, 1, high_open=True),
    "data.test_fraction": number(0, 1, high_open=True),
    "data.scaling": choice("standard", "clipped", "none"),
    "data.overlap": number(0, 1, low_open=True),
    "data.psi": choice("auto", "always"),
    "data.loader": (
        lambda v: v is None or choice_or_dotted(*choices("datasets"))[0](v),
        f"null (the built-in dataset data.name), one of {choices('datasets')} or a loader's "
        "dotted path package.module.function",
    ),
    "data.partition": choice_or_dotted(*choices("partitions")),
    "data.columns": (
        column_lists,
        "null or one list of column indices >= 0 per party, e.g. [[0,1],[2,3]]",
    ),
    "party.embedding_dim": integer(1),
    "party.activation": choice(*choices("activations")),
    "party.output_activation": choice(*choices("activations")),
    "trainer.devices": (
        devices,
        "an integer >= 1, -1 (every device), 'auto', or device indices ([0, 1] or '0,1')",
    ),
    "trainer.fast_dev_run": (
        lambda v: isinstance(v, bool) or (is_int(v) and v >= 0),
        "true, false or an integer >= 0 (batches)",
    ),
    "trainer.max_steps": integer(1, also=(-1,)),
    "trainer.check_val_every_n_epoch": integer(1, null=True),
    "trainer.log_every_n_steps": integer(1),
    "trainer.num_sanity_val_steps": integer(0, also=(-1,)),
    "trainer.limit_train_batches": batch_limit(open_zero=False),
    "trainer.limit_val_batches": batch_limit(open_zero=False),
    "trainer.limit_test_batches": batch_limit(open_zero=False),
    "trainer.val_check_interval": batch_limit(open_zero=True),
    "trainer.deterministic": boolean_or("warn"),
    "trainer.num_nodes": integer(1),
    "optimizer.lr": number(0, INF),
    "optimizer.weight_decay": number(0, INF),
    "optimizer.eps": number(0, INF),
    "optimizer.momentum": number(0, 1, high_open=True),
    "optimizer.dampening": number(0, 1, high_open=True),
    "target.value": number(-INF, INF, null=True),
    "target.mode": choice("max", "min"),
    "target.metric": (metric_name, "a logged metric's name, e.g. val/acc or train/acc"),
    "algo.transcript_size": integer(0),
    "algo.l_x": integer(1),
    "algo.l_w": integer(1),
    "algo.client_speeds": number_list(0),
    "algo.activation_order": (index_list, "null or a list of client indices >= 0"),
    "attack.party": integer(0),
    "callbacks.privacy.orders": number_list(1),
    "mechanism.b": integer(1),
    "mechanism.beta": (is_number, "a number in (0, 0.25] for PBM"),
    "mechanism.C": number(0, INF, low_open=True),
    "mechanism.sigma": number(0, INF, low_open=True, null=True),
    "network.mbps": number(0, INF, low_open=True),
    "network.latency_s": number(0, INF),
    "network.macs_per_second": number(0, INF, low_open=True),
    "network.field_op_cost": number(0, INF),
    "network.fast_mean": number(0, INF),
    "network.straggler_base": number(0, INF),
    "network.straggler_slope": number(0, INF),
    "network.straggler_fraction": number(0, 1),
    "network.group_ops_per_second": number(0, INF, low_open=True),
    "runtime.num_cpus": integer(1, null=True),
    "runtime.exchange": choice("tasks", "compiled"),
    "runtime.time_scale": (
        number(0, INF, low_open=True)[0],
        "a finite number > 0 (real seconds slept per modelled second of delay)",
    ),
    "callbacks.progress_bar.updates_per_second": number(0, INF, low_open=True),
    "logger.wandb.project": (
        wandb_project,
        f"a W&B project name: at most 128 characters, none of {' '.join(WANDB_PROJECT_FORBIDS)}",
    ),
    "logger.wandb.tags": (wandb_tags, "null or a list of tags of 1 to 64 characters each"),
    "callbacks.privacy.delta": number(0, 1, low_open=True, high_open=True),
}
"""``key: (accepts(value), what it takes)`` for keys every protocol shares (PBM's β: its type;
the mechanism refuses its range with the reason)."""
