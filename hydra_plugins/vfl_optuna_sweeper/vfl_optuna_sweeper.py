"""The Hydra Sweeper plugin of ``hydra/sweeper=vfl_optuna`` (conf/hydra/sweeper/vfl_optuna.yaml).
Hydra imports this module at every start to find its plugins, so it imports only Hydra; the
sweeper itself (and Optuna) is imported when a multirun selects it."""

from __future__ import annotations

import sys
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class VFLOptunaSweeper(Sweeper):
    """Delegates to :class:`vfl_lightning.sweep.optuna_study.OptunaStudySweeper`."""

    def __init__(self, **settings: Any) -> None:
        try:
            from vfl_lightning.sweep.optuna_study import OptunaStudySweeper
        except ModuleNotFoundError as error:
            if error.name != "optuna":
                raise
            print(
                "error: hydra/sweeper=vfl_optuna needs optuna: pip install -e '.[search]' "
                "(or pip install -c constraints.txt optuna)",
                file=sys.stderr,
            )
            sys.exit(2)
        self.sweeper = OptunaStudySweeper(**settings)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
