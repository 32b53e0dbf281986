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
  SETTING="Reduced to fit a 2-core CPU (OMP_NUM_THREADS=1); \`bash docs/results/papers.sh\` \
repeats it."
  GPU=()
fi

# ----------------------------------------------------------------------------- FedVS
if part fedvs; then
  VAL=(test=false)
  if [[ $FULL == 1 ]]; then
    # Fig. 2 on all six datasets (docs/papers.md), with VAFL; Figs. 3a, 3b, 4; Table 1; Fig. 1.
    for data in mfeat fashion_mnist emnist parkinson credit caltech7; do
      sweep "fedvs/fig2_$data" experiment="fedvs_$data" \
        algo=fedvs,fedvs_wait,fedvs_ignore,fedvs_wait_dp,vafl seed=0,1,2,3,4 "${VAL[@]}"
      NOTE="$SETTING FedVS Figure 2, $data panel."
      page "papers_fedvs_$data" "$SWEEPS/fedvs/fig2_$data" --recipe fedvs --x simulated_s
    done
    K_T=(experiment=fedvs_fashion_mnist seed=0,1,2 "${VAL[@]}")
    sweep fedvs/fig3a "${K_T[@]}" fedvs.K=1,2,4,8
    sweep fedvs/fig3b "${K_T[@]}" fedvs.K=1,2,4,8 network.fast_mean=0.001 \
      network.straggler_base=0.02 network.straggler_slope=0.04 network.macs_per_second=1e7
    sweep fedvs/fig4 "${K_T[@]}" fedvs.T=1,2,3,4
    NOTE="$SETTING FedVS Figures 3 and 4 on Fashion-MNIST."
    page papers_fedvs_k_t "$SWEEPS/fedvs/fig3a" "$SWEEPS/fedvs/fig3b" "$SWEEPS/fedvs/fig4" \
      --recipe fedvs --x simulated_s
    sweep fedvs/table1 experiment=fedvs_table1 party=mlp,cnn,pn party.num_layers=1,2,3 "${GPU[@]}"
    page papers_fedvs_table1 "$SWEEPS/fedvs/table1"
    sweep fedvs/fig1 experiment=fedvs_motivation algo=npq,vafl mechanism.fusion=concat,mean,max
    page papers_fedvs_fig1 "$SWEEPS/fedvs/fig1"
  else
    # Fig. 2, Handwritten (UCI mfeat, 6 views): FedVS and the Wait / Ignore / Wait-DP baselines.
    sweep fedvs/fig2_handwritten experiment=fedvs_mfeat \
      algo=fedvs,fedvs_ignore,fedvs_wait,fedvs_wait_dp seed=0,1,2,3,4 algo.max_simulated_s=1500 \
      trainer.val_check_interval=4 "${VAL[@]}"
    NOTE="$SETTING FedVS Figure 2, Handwritten panel: the paper's setting with the experiment \
file's stated differences; validation accuracy, 5 seeds, to 1500 simulated s."
    page papers_fedvs_handwritten "$SWEEPS/fedvs/fig2_handwritten" --recipe fedvs \
      --x simulated_s --times 30 60 120 300 600 1500 --rounds 25 50 100 200 400
    # Fig. 2, Fashion-MNIST (28 clients of one image row each, 1-layer PN), at K = 4: the data
    # shares of K = 1 (the file's choice) hold 28 x 28 x 54,000 x 29 int64, about 10 GB.
    FASHION=(experiment=fedvs_fashion_mnist fedvs.K=4 seed=0,1,2 algo.max_simulated_s=1200
      trainer.val_check_interval=10 "${VAL[@]}")
    sweep fedvs/fig2_fashion "${FASHION[@]}" algo=fedvs,fedvs_ignore
    sweep fedvs/fig2_fashion_wait "${FASHION[@]}" algo=fedvs_wait,fedvs_wait_dp
    NOTE="$SETTING FedVS Figure 2, Fashion-MNIST panel, reduced to K = 4, 3 seeds and 1200 \
simulated s."
    page papers_fedvs_fashion "$SWEEPS/fedvs/fig2_fashion" "$SWEEPS/fedvs/fig2_fashion_wait" \
      --recipe fedvs --x simulated_s --times 60 120 300 600 1200 --rounds 20 40 80 160 300
  fi
  # The "Ignore leads early" finding (papers_findings.md), on Handwritten: FedVS without its
  # one-time data sharing on the clock; the clock with the paper's delays and 300 Mbps only
  # (compute free); Ignore as §6.2 words it (it waits for the non-stragglers only).
  sweep fedvs/finding_noshare experiment=fedvs_mfeat algo=fedvs algo.data_sharing_on_clock=false \
    seed=0,1 algo.max_simulated_s=1500 trainer.val_check_interval=4 "${VAL[@]}"
  sweep fedvs/finding_delays_only experiment=fedvs_mfeat algo=fedvs,fedvs_ignore \
    network.macs_per_second=1e15 seed=0,1 algo.max_simulated_s=600 \
    trainer.val_check_interval=4 "${VAL[@]}"
  sweep fedvs/finding_ignore_non_stragglers experiment=fedvs_mfeat algo=fedvs_ignore \
    algo.ignore_waits_for=non_stragglers seed=0,1,2,3,4 algo.max_simulated_s=600 \
    trainer.val_check_interval=16 "${VAL[@]}"
  NOTE="$SETTING The Handwritten runs of Figure 2 beside the runs that test the finding: \
algo.data_sharing_on_clock=false, network.macs_per_second=1e15 (the paper's delays and 300 Mbps \
only) and algo.ignore_waits_for=non_stragglers (§6.2's Ignore)."
  page papers_fedvs_finding "$SWEEPS/fedvs/fig2_$(pick mfeat handwritten)" "$SWEEPS"/fedvs/finding_* \
    --recipe fedvs --x rounds --times 30 60 120 300 600 --rounds 25 50 100 200 400
fi

# ----------------------------------------------------------------------------- cascaded hybrid
if part cascade; then
  # Table I: direct label inference, 2 clients, the server sums their outputs, batch 64, one
  # epoch, 5 trials; npq is this threat model's synchronous first-order split training.
  if [[ $FULL == 1 ]]; then
    sweep cascade/table1 experiment=cascade_label_inference \
      algo=splitnn,vafl,cascade,zoo_vfl,syn_zoo_vfl seed=0,1,2,3,4
  else
    sweep cascade/table1 data=mnist_small data.num_parties=2 \
      algo=npq,vafl,syn_zoo_vfl,zoo_vfl,cascade attack=label_inference data.batch_size=64 \
      trainer.max_epochs=1 seed=0,1,2,3,4
  fi
  NOTE="$SETTING Cascaded hybrid paper, Table I: the paper's attack setting (2 clients, the \
server sums their outputs, batch 64, one epoch, 5 trials) $(pick "on MNIST." "on MNIST reduced \
to the 5,000-image subset shipped offline (data=mnist_small).") npq is the synchronous \
first-order split training of this threat model (the paper's split learning)."
  page papers_cascade_table1 "$SWEEPS/cascade/table1" --recipe cascade
  # Table II (MNIST columns) and Figs. 3, 5a: MLP clients, 4/6/8 clients, server widths.
  if [[ $FULL == 1 ]]; then
    MNIST=(experiment=cascade_mnist seed=0,1,2,3,4)
    sweep cascade/table2_clients "${MNIST[@]}" algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade \
      data.num_parties=4,6,8
    sweep cascade/table2_width "${MNIST[@]}" algo=splitnn,vafl,syn_zoo_vfl,zoo_vfl,cascade \
      'head.hidden=[128],[256],[512]'
    sweep cascade/fig4 "${MNIST[@]}" algo=zoo_vfl,cascade \
      algo.server_lr=0.02,0.015,0.01,0.005,0.001 trainer.max_epochs=200
    page papers_cascade_fig4 "$SWEEPS/cascade/fig4" --recipe cascade
    sweep cascade/cifar10 experiment=cascade_cifar10 algo=splitnn,vafl,zoo_vfl,cascade \
      seed=0,1,2,3,4 "${GPU[@]}"
    page papers_cascade_cifar10 "$SWEEPS/cascade/cifar10" --recipe cascade
  else
    sweep cascade/table2_clients experiment=cascade_digits data=mnist_small data.num_parties=4 \
      algo=cascade,vafl,zoo_vfl,syn_zoo_vfl,splitnn seed=0 trainer.max_epochs=10
  fi
  NOTE="$SETTING Cascaded hybrid paper, Table II (MNIST columns) and Figure 3: \
$(pick "the paper's setting." "reduced: the 5,000-image offline MNIST subset, 4 clients only, \
server width 128 only, one seed (the paper: 5), 10 epochs (the paper: 100).")"
  page papers_cascade_table2 "$SWEEPS"/cascade/table2_* --recipe cascade
fi

# ----------------------------------------------------------------------------- FedBCD
if part fedbcd; then
  if [[ $FULL == 1 ]]; then
    # Table I and Fig. 2, MNIST-CNN: rounds to AUC 99.7 %, FedSGD (Q = 1), FedBCD-p and -s.
    sweep fedbcd/table1 experiment=fedbcd_mnist_cnn algo=fedbcd,fedbcd_s \
      algo.local_steps=1,3,5 seed=0,1,2,3,4 "${GPU[@]}"
    NOTE="$SETTING FedBCD Table I, MNIST-CNN."
    page papers_fedbcd_table1 "$SWEEPS/fedbcd/table1" --recipe fedbcd --x rounds --y val/auroc
  else
    echo "FedBCD Table I (two 64-channel CNN parties) does not fit this CPU: use --full" >&2
  fi
fi

# ----------------------------------------------------------------------------- PBM-VFL
if part pbm; then
  # Table 1 and Fig. 2a-b: 4 parties (image quadrants), B = 100, P = 16, lr 0.01, plain SGD,
  # communication to 80 % training accuracy.
  if [[ $FULL == 1 ]]; then
    PBM=(experiment=pbm_cifar10 seed=0,1,2 "${GPU[@]}")
    sweep pbm/npq "${PBM[@]}" algo=npq
    sweep pbm/grid "${PBM[@]}" mechanism.b=2,4,8,16 mechanism.beta=0.05,0.1,0.15
    sweep pbm/ldp "${PBM[@]}" algo=ldp mechanism.b=2,4,8,16 mechanism.beta=0.1,0.15
  else
    PBM=(experiment=pbm_digits data=fashion_mnist data.num_parties=4 data.partition=quadrants
      optimizer.momentum=0 target.value=0.8 seed=0 trainer.max_epochs=5)
    sweep pbm/npq "${PBM[@]}" algo=npq party.output_activation=tanh
    sweep pbm/grid "${PBM[@]}" mechanism.b=16,4 mechanism.beta=0.15,0.05
  fi
  NOTE="$SETTING PBM-VFL Table 1 and Figure 2(a-b): $(pick "CIFAR-10 with ResNet-18 parties, \
the paper's setting." "a stand-in, not a reproduction: Fashion-MNIST quadrants with the default \
MLP parties (64 hidden units, P = 16, tanh) in place of CIFAR-10 with ResNet-18, b in {4, 16} \
and beta in {0.05, 0.15} only, one seed (the paper: 3), 5 epochs (the paper: 600).")"
  page papers_pbm_table1 "$SWEEPS"/pbm/* --recipe pbm
fi
