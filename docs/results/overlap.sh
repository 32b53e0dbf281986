#!/usr/bin/env bash
# Regenerates docs/results/overlap.md and its figure: accuracy against data.overlap (the share of
# the label holder's rows that every party also holds, aligned by the ECDH-PSI before training)
# for pbm and splitnn on digits (4 parties), then `python -m vfl_lightning.report --recipe
# alignment`.
#   bash docs/results/overlap.sh [SWEEPS_DIR]        (default /tmp/vfl_overlap; run from the repo root)
# QUICK=1 shrinks the sweep to check the script; REPORT_ONLY=1 only regenerates the page.
set -euo pipefail
SWEEPS=${1:-/tmp/vfl_overlap}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false)
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi
NOTE="Reduced sweep, sized for this shared 2-core CPU (other jobs were running: load average 7 to 9 \
during the sweep): 10 epochs, \
3 seeds; every number below is from these runs. Every run trains 10 epochs of its aligned \
training rows, so a lower overlap also means fewer training steps (rounds column). At \
data.overlap=1 every party holds every row and no PSI runs (data.psi=auto). \
\`bash docs/results/overlap.sh\` repeats them."

# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"

sweep overlap/digits algo=pbm,splitnn data.overlap=0.1,0.25,0.5,0.75,1.0 seed=0,1,2 \
  trainer.max_epochs=10
page overlap "$SWEEPS/overlap" --recipe alignment
