#!/usr/bin/env bash
# Regenerates docs/results/audit.md and its figures: the accountant's ε against the canary audit's
# empirical lower bound (feature and sample privacy, from the server's view) for PBM over a
# (b, β) grid after one release per canary, PBM / LDP / npq after 10 epochs, and PBM with each
# defense; then `python -m vfl_lightning.report --recipe audit`.
#   bash docs/results/audit.sh [SWEEPS_DIR]        (default /tmp/vfl_audit; run from the repo root)
# QUICK=1 shrinks every sweep to check the script; REPORT_ONLY=1 only regenerates the page.
set -euo pipefail
SWEEPS=${1:-/tmp/vfl_audit}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
AUDITS=('audit=[canary,canary_sample]' audit.canary.count=150 audit.canary.known=30
  audit.canary_sample.count=150 audit.canary_sample.known=30)
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false "${AUDITS[@]}")
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi
NOTE="Digits, 4 parties, 2 seeds; each run audits feature privacy (party 0) and sample privacy \
with 150 canaries each (30 calibration, 120 audited: no bound can exceed 3.3). One epoch: each \
canary is released once; 10 epochs: ten times. \`bash docs/results/audit.sh\` repeats the runs. \
What the auditor knows and what the bound means: docs/audit.md."

# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"

sweep audit/one_release algo=pbm,ldp mechanism.b=1,4,16 mechanism.beta=0.05,0.15,0.25 seed=0,1 \
  trainer.max_epochs=1
sweep audit/protocols algo=npq,pbm,ldp seed=0,1 trainer.max_epochs=10
sweep audit/gradient_noise algo=pbm defense=gradient_noise defense.scale=0.1 seed=0,1 \
  trainer.max_epochs=10
sweep audit/gradient_sparsification algo=pbm defense=gradient_sparsification \
  defense.keep_fraction=0.01 seed=0,1 trainer.max_epochs=10
sweep audit/label_dp algo=pbm defense=label_dp defense.epsilon=0.5 seed=0,1 trainer.max_epochs=10
page audit "$SWEEPS/audit" --recipe audit
