#!/usr/bin/env bash
# Regenerates the results pages docs/results/{pbm,fedbcd,cascade,fedvs}.md and their figures:
# reduced sweeps (sized for a shared 2-core CPU), then `python -m vfl_lightning.report` on each.
#   bash docs/results/generate.sh [SWEEPS_DIR]        (default /tmp/vfl_sweeps; run from the repo root)
# QUICK=1 shrinks every sweep further, to check the script itself in a few minutes;
# REPORT_ONLY=1 regenerates the pages from the sweeps already there.
set -euo pipefail
SWEEPS=${1:-/tmp/vfl_sweeps}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false)
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi
NOTE="Reduced sweep, sized for this shared 2-core CPU (other jobs were running): fewer seeds and \
epochs than the paper; every number below is from these runs. All commands ran with \
OMP_NUM_THREADS=1; \`bash docs/results/generate.sh\` repeats them and regenerates this page."

# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"

# PBM-VFL (digits, 4 parties): PBM and its LDP baseline over (b, beta), NPQ with the same parties.
sweep pbm/pbm experiment=pbm_digits mechanism.b=2,16 mechanism.beta=0.05,0.15 seed=0,1,2 trainer.max_epochs=40
sweep pbm/ldp experiment=pbm_digits algo=ldp mechanism.b=2,16 mechanism.beta=0.05,0.15 seed=0,1,2 trainer.max_epochs=40
sweep pbm/npq experiment=pbm_digits algo=npq party.output_activation=tanh seed=0,1,2 trainer.max_epochs=40
page pbm "$SWEEPS/pbm" --recipe pbm

# FedBCD (breast cancer, label holder + 1 party): rounds to val AUC 0.97 against Q per schedule.
sweep fedbcd/q experiment=fedbcd_breast_cancer algo=fedbcd,fedbcd_s algo.local_steps=1,3,5,10,25 \
  seed=0,1,2 target.value=0.97 trainer.max_epochs=20 test=false
sweep fedbcd/prox experiment=fedbcd_breast_cancer algo=fedpbcd algo.local_steps=10,25 \
  seed=0,1,2 target.value=0.97 trainer.max_epochs=20 test=false
page fedbcd "$SWEEPS/fedbcd" --recipe fedbcd --x rounds --y val/auroc

# Cascaded hybrid (digits, 4 clients): accuracy per epoch and MB; label inference by client 0.
sweep cascade/acc experiment=cascade_digits algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade seed=0,1,2 \
  trainer.max_epochs=10
sweep cascade/attack algo=npq,vafl,syn_zoo_vfl,zoo_vfl,cascade attack=label_inference seed=0,1,2 \
  trainer.max_epochs=1 data.batch_size=64
page cascade "$SWEEPS/cascade" --recipe cascade

# FedVS (digits, 8 clients): validation accuracy over simulated seconds per algo, and per K
# (batch 96 so that K = 3 divides it).
sweep fedvs/algos experiment=fedvs_digits algo=fedvs,fedvs_wait,fedvs_ignore,fedvs_wait_dp \
  seed=0,1,2 algo.max_simulated_s=300 trainer.val_check_interval=2 test=false
sweep fedvs/K experiment=fedvs_digits algo.K=1,2,3 data.batch_size=96 seed=0,1 \
  algo.max_simulated_s=300 trainer.val_check_interval=2 test=false
page fedvs "$SWEEPS/fedvs" --recipe fedvs --x simulated_s --times 30 60 120 200 300
