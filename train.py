"""Command-line entry point: `python train.py algo=pbm` (see conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from vfl_lightning.train import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    results = train(cfg)
    print(f"results: {cfg.paths.output_dir}/results.json")
    value = results.get(cfg.get("optimized_metric"))
    return None if value is None else float(value)


if __name__ == "__main__":
    main()
