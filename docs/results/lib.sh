# Shared by generate.sh and privacy.sh (sourced after they set SWEEPS, PYTHON, COMMON, SCALE and
# NOTE): `sweep DIR OVERRIDES...` runs one multirun into $SWEEPS/DIR (nothing under
# REPORT_ONLY=1, which keeps the sweeps already there); `page NAME DIR... [REPORT ARGS]` writes
# docs/results/NAME.md and its figures.
sweep() {
  local dir=$1
  shift
  rm -rf "$SWEEPS/$dir"
  "$PYTHON" train.py -m "$@" "${COMMON[@]}" "${SCALE[@]}" hydra.sweep.dir="$SWEEPS/$dir"
}
if [[ "${REPORT_ONLY:-0}" == 1 ]]; then sweep() { :; }; fi
page() {
  local name=$1
  shift
  "$PYTHON" -m vfl_lightning.report "$@" --out docs/results --name "$name" --note "$NOTE" --no-progress
}
