#!/usr/bin/env bash
# Every table and figure of the four papers (PBM-VFL, the cascaded hybrid ZOO/FOO paper, FedBCD,
# FedVS) that runs here: the sweeps, then one page per paper part by `python -m vfl_lightning.report`
# (docs/results/papers_*.md). docs/results/papers.md puts the paper's numbers beside ours.
#   bash docs/results/papers.sh [--full] [SWEEPS_DIR]    (default /tmp/vfl_papers; from the repo root)
# Default: what fits a shared 2-core CPU with the offline data (`make data`); every reduction is
# named in the page's note. --full: the papers' own settings (full datasets, seeds, epochs and
# horizons, the GPU rows with trainer=gpu), for a user with the data and a GPU.
# QUICK=1 shrinks every sweep to check the script; REPORT_ONLY=1 only regenerates the pages;
# ONLY="fedvs cascade fedbcd pbm" picks parts.
set -euo pipefail
FULL=0
if [[ "${1:-}" == --full ]]; then
  FULL=1
  shift
fi
SWEEPS=${1:-/tmp/vfl_papers}
PYTHON=${PYTHON:-python}
ONLY=${ONLY:-fedvs cascade fedbcd pbm}
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
COMMON=(logger=none callbacks.checkpoint=null trainer.enable_progress_bar=false)
if [[ "${QUICK:-0}" == 1 ]]; then SCALE=(trainer.limit_train_batches=3); else SCALE=(); fi
# shellcheck source=docs/results/lib.sh
source "$(dirname "$0")/lib.sh"
part() { [[ " $ONLY " == *" $1 "* ]]; }
# full SETTING / this CPU's SETTING
pick() { if [[ $FULL == 1 ]]; then echo "$1"; else echo "$2"; fi; }
if [[ $FULL == 1 ]]; then
  SETTING="The papers' settings (\`bash docs/results/papers.sh --full\`)."
  GPU=(trainer=gpu)
else
  SETTING="Run on a shared 2-core CPU (AMD EPYC) while seven other jobs ran (load average 8-15), \
with \`nice -n 10\` and OMP_NUM_THREADS=1; \`bash docs/results/papers.sh\` repeats it."
  GPU=()
fi

# ----------------------------------------------------------------------------- FedVS
if part fedvs; then
  SEEDS=0,1,2,3,4
  FASHION_SEEDS=$(pick 0,1,2,3,4 0,1,2)
  FASHION_S=$(pick 3600 1200)
  FIG34_SEEDS=$(pick 0,1,2,3,4 0)
  FIG34_S=$(pick 1200 300)
  VAL=(test=false)

  # Fig. 2, Handwritten (UCI mfeat, 6 views): FedVS and the Wait / Ignore / Wait-DP baselines.
  sweep fedvs/fig2_handwritten experiment=fedvs_mfeat \
    algo=fedvs,fedvs_ignore,fedvs_wait,fedvs_wait_dp seed=$SEEDS algo.max_simulated_s=1500 \
    trainer.val_check_interval=4 "${VAL[@]}"
  # The "Ignore leads early" finding: FedVS without its one-time data sharing on the clock; the
  # clock with the paper's delays and 300 Mbps only (compute free); all clients' steps scaled by
  # N / E|used| = 6 / 4, Ignore's effective client step (a diagnostic, not a result).
  sweep fedvs/finding_noshare experiment=fedvs_mfeat algo=fedvs algo.data_sharing_on_clock=false \
    seed=$SEEDS algo.max_simulated_s=1500 trainer.val_check_interval=4 "${VAL[@]}"
  sweep fedvs/finding_delays_only experiment=fedvs_mfeat algo=fedvs,fedvs_ignore \
    network.macs_per_second=1e15 seed=$SEEDS algo.max_simulated_s=600 \
    trainer.val_check_interval=4 "${VAL[@]}"
  sweep fedvs/finding_lr experiment=fedvs_mfeat algo=fedvs,fedvs_wait optimizer.lr=0.03 \
    seed=$SEEDS algo.max_simulated_s=600 trainer.val_check_interval=4 "${VAL[@]}"
  NOTE="$SETTING FedVS Figure 2, Handwritten panel: the paper's setting (Appendix C: 6 views, \
2-layer PN clients, lr 0.02, batch 32, 60/40 split) with the experiment file's stated \
differences (SGD momentum 0.9, l_x = l_w = 7, weight bound 2, validation rows from the training \
part); validation accuracy, 5 seeds, to 1500 simulated s. VAFL is not run (see papers.md)."
  page papers_fedvs_handwritten "$SWEEPS/fedvs/fig2_handwritten" --recipe fedvs \
    --x simulated_s --times 30 60 120 300 600 1500
  NOTE="$SETTING The Handwritten runs of Figure 2 beside the runs that test the clock: \
data_sharing_on_clock=false, macs_per_second=1e15 (the paper's delays and 300 Mbps only), and \
optimizer.lr=0.03 (a diagnostic). Accuracy over simulated seconds and, in the Runs section, over \
rounds."
  page papers_fedvs_finding "$SWEEPS/fedvs/fig2_handwritten" "$SWEEPS"/fedvs/finding_* \
    --recipe fedvs --x rounds --times 30 60 120 300 600

  # Fig. 2, Fashion-MNIST (28 clients of one image row each, 1-layer PN, K = 4).
  sweep fedvs/fig2_fashion experiment=fedvs_fashion_mnist seed="$FASHION_SEEDS" \
    algo=fedvs,fedvs_ignore algo.max_simulated_s="$FASHION_S" trainer.val_check_interval=10 \
    "${VAL[@]}"
  sweep fedvs/fig2_fashion_wait experiment=fedvs_fashion_mnist seed="$FASHION_SEEDS" \
    algo=fedvs_wait,fedvs_wait_dp algo.max_simulated_s="$FASHION_S" \
    trainer.val_check_interval=10 "${VAL[@]}"
  NOTE="$SETTING FedVS Figure 2, Fashion-MNIST panel: the paper's setting (28 clients, 1-layer \
PN, lr 0.05, batch 256, T = 1, K = 4) with the experiment file's stated differences; \
$(pick "5 seeds to 3600 simulated s." "reduced to 3 seeds (the paper: 5) and 1200 simulated s.")"
  page papers_fedvs_fashion "$SWEEPS/fedvs/fig2_fashion" "$SWEEPS/fedvs/fig2_fashion_wait" \
    --recipe fedvs --x simulated_s --times 60 120 300 600 1200

  # Fig. 3a (delays dominate: network=fedvs), Fig. 3b (compute dominates: a 10^6 multiply-add/s
  # client, so one coded embedding takes 10-40 s against straggler means of 2-6 s), Fig. 4 (T).
  sweep fedvs/fig3a experiment=fedvs_fashion_mnist algo.K=4,2,1 seed="$FIG34_SEEDS" \
    algo.max_simulated_s="$FIG34_S" trainer.val_check_interval=10 "${VAL[@]}"
  sweep fedvs/fig4 experiment=fedvs_fashion_mnist algo.T=2,3 seed="$FIG34_SEEDS" \
    algo.max_simulated_s="$FIG34_S" trainer.val_check_interval=10 "${VAL[@]}"
  sweep fedvs/fig3b experiment=fedvs_fashion_mnist algo.K=4,2,1 network.macs_per_second=1e6 \
    seed="$FIG34_SEEDS" algo.max_simulated_s=$((FIG34_S * 10)) trainer.val_check_interval=10 \
    "${VAL[@]}"
  NOTE="$SETTING FedVS Figures 3 and 4 on Fashion-MNIST: K in {1, 2, 4} (divisors of the batch \
of 256), T in {1, 2, 3} at K = 4; $(pick "5 seeds." "reduced to seed 0 and 300 simulated s \
(3000 s for the compute-dominated clock).")"
  page papers_fedvs_k_t "$SWEEPS/fedvs/fig3a" "$SWEEPS/fedvs/fig4" "$SWEEPS/fedvs/fig3b" \
    --recipe fedvs --x simulated_s

  if [[ $FULL == 1 ]]; then
    # The other panels of Fig. 2, Table 1 and Fig. 1 need the issue-28 experiment files and
    # downloads (EMNIST, Parkinson, Credit card, Caltech-7).
    for data in emnist parkinson credit caltech7; do
      sweep "fedvs/fig2_$data" experiment="fedvs_$data" \
        algo=fedvs,fedvs_ignore,fedvs_wait,fedvs_wait_dp seed=$SEEDS "${VAL[@]}"
    done
    sweep fedvs/table1 experiment=fedvs_table1 seed=$SEEDS "${GPU[@]}"
    sweep fedvs/fig1 experiment=fedvs_motivation seed=$SEEDS "${GPU[@]}"
  fi
fi

# ----------------------------------------------------------------------------- cascaded hybrid
if part cascade; then
  # Table I: direct label inference, 2 clients, sum server, batch 64, one epoch, 5 trials.
  sweep cascade/table1 experiment=cascade_label_inference \
    data="$(pick mnist mnist_small)" algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade \
    seed=0,1,2,3,4
  NOTE="$SETTING Cascaded hybrid paper, Table I: $(pick "MNIST." "MNIST reduced to the \
5,000-image subset shipped offline (data=mnist_small: 4,000 train / 1,000 test).")"
  page papers_cascade_table1 "$SWEEPS/cascade/table1" --recipe cascade
  # Table II and Figs. 3-4: MNIST MLP, 4/6/8 clients, server widths 128/256/512, 5 runs.
  CASCADE_DATA=$(pick mnist mnist_small)
  CASCADE_EPOCHS=$(pick 100 "${CASCADE_EPOCHS:-10}")
  CASCADE_SEEDS=$(pick 0,1,2,3,4 0,1)
  sweep cascade/table2_clients experiment=cascade_mnist data="$CASCADE_DATA" \
    algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade data.num_parties=4,6,8 \
    seed="$CASCADE_SEEDS" trainer.max_epochs="$CASCADE_EPOCHS"
  sweep cascade/table2_width experiment=cascade_mnist data="$CASCADE_DATA" \
    algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade 'head.hidden=[256],[512]' \
    seed="$CASCADE_SEEDS" trainer.max_epochs="$CASCADE_EPOCHS"
  NOTE="$SETTING Cascaded hybrid paper, Table II (MNIST columns) and Figure 3: \
$(pick "the paper's setting." "MNIST reduced to the 5,000-image offline subset, 2 seeds (the \
paper: 5), ${CASCADE_EPOCHS} epochs (the paper: 100).")"
  page papers_cascade_table2 "$SWEEPS/cascade/table2_clients" "$SWEEPS/cascade/table2_width" \
    --recipe cascade
  # Fig. 4: test accuracy against the server's learning rate, ZOO-VFL and cascade, 200 epochs.
  sweep cascade/fig4 experiment=cascade_mnist data="$CASCADE_DATA" algo=zoo_vfl,cascade \
    algo.server_lr=0.02,0.015,0.01,0.005,0.001 seed="$CASCADE_SEEDS" \
    trainer.max_epochs="$(pick 200 "$CASCADE_EPOCHS")"
  page papers_cascade_fig4 "$SWEEPS/cascade/fig4" --recipe cascade
  if [[ $FULL == 1 ]]; then
    # Table II's CIFAR-10 column and Fig. 5b: split ResNet-18, 2 clients, 40 epochs (a GPU).
    sweep cascade/cifar10 experiment=cascade_cifar10 algo=splitnn,vafl,zoo_vfl,cascade \
      seed=0,1,2,3,4 "${GPU[@]}"
    page papers_cascade_cifar10 "$SWEEPS/cascade/cifar10" --recipe cascade
  fi
fi

# ----------------------------------------------------------------------------- FedBCD
if part fedbcd; then
  # Table I, MNIST-CNN: rounds to test AUC 99.7 % for FedSGD (Q = 1), FedBCD-p and FedBCD-s.
  sweep fedbcd/table1 experiment=fedbcd_mnist_cnn data="$(pick mnist mnist_small)" \
    algo=fedbcd,fedbcd_s algo.local_steps=1,3,5 seed="$(pick 0,1,2,3,4 0,1,2)" "${GPU[@]}"
  NOTE="$SETTING FedBCD Table I, MNIST-CNN: $(pick "MNIST." "MNIST reduced to the \
5,000-image offline subset (data=mnist_small), 3 seeds.")"
  page papers_fedbcd_table1 "$SWEEPS/fedbcd/table1" --recipe fedbcd --x rounds --y val/auroc
fi

# ----------------------------------------------------------------------------- PBM-VFL
if part pbm; then
  # Table 1 and Fig. 2a-b: 4 parties (image quadrants), B = 100, P = 16, lr 0.01, 80 % train acc.
  PBM_DATA=$(pick cifar10 fashion_mnist)
  PBM_EPOCHS=$(pick 600 "${PBM_EPOCHS:-5}")
  PBM_SEEDS=$(pick 0,1,2 0)
  sweep pbm/table1 experiment=pbm_cifar10 data="$PBM_DATA" algo=pbm mechanism.b=4,8,16 \
    mechanism.beta=0.05,0.1,0.15 seed="$PBM_SEEDS" trainer.max_epochs="$PBM_EPOCHS" "${GPU[@]}"
  sweep pbm/table1_npq experiment=pbm_cifar10 data="$PBM_DATA" algo=npq \
    seed="$PBM_SEEDS" trainer.max_epochs="$PBM_EPOCHS" "${GPU[@]}"
  NOTE="$SETTING PBM-VFL Table 1 and Figure 2(a-b): $(pick "CIFAR-10 with ResNet-18 parties, \
the paper's setting." "a stand-in: Fashion-MNIST quadrants in place of CIFAR-10, ${PBM_EPOCHS} \
epochs (the paper: 600), one seed; not a reproduction.")"
  page papers_pbm_table1 "$SWEEPS/pbm/table1" "$SWEEPS/pbm/table1_npq" --recipe pbm
fi
