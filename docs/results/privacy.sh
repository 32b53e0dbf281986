#!/usr/bin/env bash
# Regenerates docs/results/privacy*.md and their figures: every algo against its natural attacks,
# PBM / LDP over (b, beta), and each defense at two strengths, on digits, breast_cancer and
# mnist_small; then `python -m vfl_lightning.report --recipe privacy` on each dataset.
#   bash docs/results/privacy.sh [SWEEPS_DIR]        (default /tmp/vfl_privacy; run from the repo root)
# QUICK=1 shrinks every sweep to check the script; REPORT_ONLY=1 only regenerates the pages.
set -euo pipefail
SWEEPS=${1:-/tmp/vfl_privacy}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false)
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi
NOTE="Reduced sweep, sized for a shared 2-core CPU: short training (10 epochs, 5 on \
mnist_small), 2 seeds (1 on mnist_small); every number below is from these runs. \
\`bash docs/results/privacy.sh\` repeats them. Metrics and assumptions: docs/attacks.md."
DEFENSES=(
  "defense=gradient_noise defense.scale=0.01,0.1"
  "defense=gradient_sparsification defense.keep_fraction=0.1,0.01"
  "defense=label_dp defense.epsilon=0.5,2"
  "defense=dcor defense.weight=0.1,1"
)

# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"

# digits (4 parties): feature reconstruction and model completion on every synchronous algo, PBM
# and LDP over (b, beta), each defense on splitnn; label inference (its own threat model).
FEATURES='attack=[feature_reconstruction,model_completion]'
sweep digits/protocols algo=splitnn,npq,pbm,ldp "$FEATURES" seed=0,1 trainer.max_epochs=10
sweep digits/pbm_grid algo=pbm,ldp mechanism.beta=0.05,0.25 mechanism.b=4,16,64 "$FEATURES" \
  seed=0,1 trainer.max_epochs=10
for defense in "${DEFENSES[@]}"; do
  name=${defense%% *}
  # shellcheck disable=SC2086
  sweep "digits/${name#defense=}" algo=splitnn "$FEATURES" $defense seed=0,1 trainer.max_epochs=10
done
sweep digits/label_inference algo=npq,vafl,cascade attack=label_inference seed=0,1 \
  trainer.max_epochs=3
page privacy "$SWEEPS/digits" --recipe privacy

# breast_cancer (2 parties, binary): every attack on the synchronous, FedBCD and VAFL algos, and
# each defense on npq.
ALL='attack=[feature_reconstruction,norm_scoring,direction_scoring,model_completion]'
sweep breast_cancer/protocols data=breast_cancer algo=splitnn,npq,pbm,ldp,fedbcd,vafl "$ALL" \
  seed=0,1 trainer.max_epochs=10
for defense in "${DEFENSES[@]}"; do
  name=${defense%% *}
  # shellcheck disable=SC2086
  sweep "breast_cancer/${name#defense=}" data=breast_cancer algo=npq "$ALL" $defense seed=0,1 \
    trainer.max_epochs=10
done
page privacy_breast_cancer "$SWEEPS/breast_cancer" --recipe privacy

# mnist_small (4 parties of 196 pixels): feature reconstruction and model completion, one seed.
sweep mnist_small/protocols data=mnist_small algo=splitnn,npq,pbm,ldp "$FEATURES" seed=0 \
  trainer.max_epochs=5
page privacy_mnist_small "$SWEEPS/mnist_small" --recipe privacy
