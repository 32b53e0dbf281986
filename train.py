"""Command-line entry point: `python train.py algo=pbm` (see conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from vfl_lightning.search import objective
from vfl_lightning.train import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    results = train(cfg)
    print(f"results: {cfg.paths.output_dir}/results.json")
    return objective(cfg, results)


if __name__ == "__main__":
    main()
