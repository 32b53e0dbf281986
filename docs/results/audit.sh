#!/usr/bin/env bash
# Regenerates the privacy-audit pages and their figures, then `python -m vfl_lightning.report
# --recipe audit` for each:
# - docs/results/audit.md, the frontier: message canaries (audit=canary_message, where the
#   accountant's guarantee starts) for LDP and PBM over a grid whose accountant's epsilon runs from
#   2 to 10, 3 seeds each, the f-DP one-run bound against the accountant's epsilon;
# - docs/results/audit_inputs.md: input canaries (feature and sample privacy, from the server's
#   view) for PBM over a (b, beta) grid after one release per canary, PBM / LDP / npq after 10
#   epochs, and PBM with each defense;
# - docs/results/audit_labels.md: label canaries (audit=canary_label) for defense=label_dp.
#   bash docs/results/audit.sh [SWEEPS_DIR]        (default /tmp/vfl_audit; run from the repo root)
# QUICK=1 shrinks every sweep to check the script; REPORT_ONLY=1 only regenerates the pages.
# Run it at `nice -n 10` on a shared machine.
set -euo pipefail
SWEEPS=${1:-/tmp/vfl_audit}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi

# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"

# --- the frontier: message canaries -----------------------------------------------------------
# 14,000 synthetic samples (9,800 training rows), 9,000 of them message canaries of party 0.
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false test=false
  data=synthetic data.options.n_samples=14000 data.batch_size=128 audit=canary_message
  audit.canary_message.count=9000)
NOTE="The frontier of the message-canary audit (audit=canary_message, docs/audit.md): 14,000 \
synthetic samples, 4 parties, 9,000 of the 9,800 training rows are canaries of party 0, whose \
releases carry +C or -C in every element by a fair coin; 3 seeds per point. LDP: sigma = 16, \
1 to 13 epochs (each canary's releases are mu-GDP, mu = sqrt(epochs)/2). PBM: (b, beta) and \
epochs chosen so the accountant's epsilon runs from 2.5 to 8.7. \`bash docs/results/audit.sh\` \
repeats the runs."
sweep audit/ldp algo=ldp mechanism.sigma=16 trainer.max_epochs=1,2,4,9,13 seed=0,1,2
sweep audit/pbm_b1 algo=pbm mechanism.b=1 mechanism.beta=0.05 trainer.max_epochs=2,4,8 \
  seed=0,1,2
sweep audit/pbm_beta algo=pbm mechanism.b=1 mechanism.beta=0.1 trainer.max_epochs=1,2 seed=0,1,2
sweep audit/pbm_b4 algo=pbm mechanism.b=4 mechanism.beta=0.05 trainer.max_epochs=1,2 seed=0,1,2
sweep audit/pbm_b1_beta015 algo=pbm mechanism.b=1 mechanism.beta=0.15 trainer.max_epochs=1 \
  seed=0,1,2
sweep audit/pbm_b4_beta01 algo=pbm mechanism.b=4 mechanism.beta=0.1 trainer.max_epochs=1 seed=0,1,2
sweep audit/pbm_b16 algo=pbm mechanism.b=16 mechanism.beta=0.05 trainer.max_epochs=1 seed=0,1,2
page audit "$SWEEPS"/audit/{ldp,pbm_b1,pbm_beta,pbm_b4,pbm_b1_beta015,pbm_b4_beta01,pbm_b16} \
  --recipe audit

# --- input canaries ------------------------------------------------------------------------------
AUDITS=('audit=[canary,canary_sample]' audit.canary.count=150 audit.canary.known=30
  audit.canary_sample.count=150 audit.canary_sample.known=30)
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false "${AUDITS[@]}")
NOTE="Digits, 4 parties, 2 seeds; each run audits feature privacy (party 0) and sample privacy \
with 150 input canaries each (30 calibration, 120 audited: no bound can exceed 3.29). One epoch: \
each canary is released once; 10 epochs: ten times. \`bash docs/results/audit.sh\` repeats the \
runs. What the auditor knows and what the bound means: docs/audit.md."
sweep audit/one_release algo=pbm,ldp mechanism.b=1,4,16 mechanism.beta=0.05,0.15,0.25 seed=0,1 \
  trainer.max_epochs=1
sweep audit/protocols algo=npq,pbm,ldp seed=0,1 trainer.max_epochs=10
sweep audit/gradient_noise algo=pbm defense=gradient_noise defense.scale=0.1 seed=0,1 \
  trainer.max_epochs=10
sweep audit/gradient_sparsification algo=pbm defense=gradient_sparsification \
  defense.keep_fraction=0.01 seed=0,1 trainer.max_epochs=10
sweep audit/label_dp algo=pbm defense=label_dp defense.epsilon=0.5 seed=0,1 trainer.max_epochs=10
page audit_inputs "$SWEEPS/audit/one_release" "$SWEEPS/audit/protocols" \
  "$SWEEPS/audit/gradient_noise" "$SWEEPS/audit/gradient_sparsification" \
  "$SWEEPS/audit/label_dp" --recipe audit

# --- label canaries -------------------------------------------------------------------------------
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false audit=canary_label
  audit.canary_label.count=500 audit.canary_label.known=100 data.binary=true)
NOTE="Label DP audited from a passive party's view (audit=canary_label, docs/audit.md): digits as \
a binary task, 4 parties, npq, 5 epochs, 500 label canaries (100 known to the auditor, party 0, \
who guesses the others from the gradients it receives); defense=label_dp at three epsilons, 2 \
seeds. \`bash docs/results/audit.sh\` repeats the runs."
sweep audit/labels algo=npq defense=label_dp defense.epsilon=0.3,1,2 seed=0,1 trainer.max_epochs=5
page audit_labels "$SWEEPS/audit/labels" --recipe audit
