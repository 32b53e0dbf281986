"""Hydra's plugin package of ``hydra/sweeper=vfl_optuna`` (vfl_lightning.sweep.optuna_study)."""
