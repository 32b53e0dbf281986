"""Command-line entry point: `python train.py algo=pbm` (see conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from vfl_lightning.cli import hydra_command_line
from vfl_lightning.cli import main as run


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)


if __name__ == "__main__":
    with hydra_command_line():
        main()
