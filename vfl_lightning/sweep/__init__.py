"""Searches over runs: ``hydra/sweeper=vfl_optuna`` (an Optuna study asked and told by a Hydra
sweeper, ``optuna_study``) and its search space written as Hydra overrides (``space``)."""
