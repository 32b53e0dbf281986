#!/usr/bin/env bash
# runtime=grpc on one machine: a development CA, 4 party programs and the server on 127.0.0.1,
# algo=pbm on digits, each party with its own configuration, certificate, data file and state
# directory under RUN_DIR. Waits for the server, stops the parties and exits with the server's
# status; the server's results.json is in RUN_DIR/server/. docs/deploy.md walks through it.
#
#   scripts/deploy_loopback.sh RUN_DIR [train.py overrides...]     (PYTHON=... to choose python)
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "error: usage: scripts/deploy_loopback.sh RUN_DIR [train.py overrides]" >&2
    exit 2
fi
RUN_DIR=$(realpath -m "$1")
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
PARTIES=4
PROTOCOL=(algo=pbm data=digits)
if [ -e "$RUN_DIR" ] && [ -n "$(ls -A "$RUN_DIR")" ]; then
    echo "error: RUN_DIR=$RUN_DIR exists and is not empty; choose a new directory" >&2
    exit 2
fi
mkdir -p "$RUN_DIR"
cd "$ROOT"

# 1. The deployment's CA and every certificate (a real deployment uses its own CA).
"$PYTHON" -m vfl_lightning.party certs --out "$RUN_DIR/ca" --parties "$PARTIES"
# 2. The data, one file per holder (a real deployment: each organization has its own).
"$PYTHON" -m vfl_lightning.data.export "${PROTOCOL[@]}" --out "$RUN_DIR/export"
mkdir -p "$RUN_DIR/server/certs" "$RUN_DIR/server/data"
cp "$RUN_DIR/ca/ca.pem" "$RUN_DIR/ca/server.pem" "$RUN_DIR/ca/server.key" "$RUN_DIR/server/certs/"
cp "$RUN_DIR/export/server.npz" "$RUN_DIR/export/manifest.json" "$RUN_DIR/server/data/"

# 3. Each party: its own folder, files, configuration and program.
PIDS=()
stop_parties() {
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop_parties EXIT
for ((m = 0; m < PARTIES; m++)); do
    party="$RUN_DIR/party_$m"
    mkdir -p "$party/tls" "$party/data"
    cp "$RUN_DIR/ca/ca.pem" "$RUN_DIR/ca/party_$m.pem" "$RUN_DIR/ca/party_$m.key" "$party/tls/"
    cp "$RUN_DIR/export/party_$m.npz" "$party/data/"
    "$PYTHON" -m vfl_lightning.party init --party "$m" --listen 127.0.0.1:0 --certs "$party/tls" \
        --data "$party/data/party_$m.npz" --state-dir "$party/state" --wait-s 600 \
        --out "$party/party.yaml" "${PROTOCOL[@]}" > /dev/null
    "$PYTHON" -m vfl_lightning.party serve --config "$party/party.yaml" \
        --port-file "$party/port" > "$party/log.txt" 2>&1 &
    PIDS+=($!)
done
rm -rf "$RUN_DIR/export"

# 4. Wait (at most 300 s) until every party listens; its port is in its port file.
ADDRESSES=()
for ((m = 0; m < PARTIES; m++)); do
    port_file="$RUN_DIR/party_$m/port"
    for ((second = 0; second < 300; second++)); do
        [ -s "$port_file" ] && break
        if ! kill -0 "${PIDS[$m]}" 2>/dev/null; then
            echo "error: party $m exited: $(tail -n 1 "$RUN_DIR/party_$m/log.txt")" >&2
            exit 1
        fi
        sleep 1
    done
    if [ ! -s "$port_file" ]; then
        echo "error: party $m did not listen within 300 s (see $RUN_DIR/party_$m/log.txt)" >&2
        exit 1
    fi
    ADDRESSES+=("127.0.0.1:$(cat "$port_file")")
done
PARTY_LIST=$(IFS=,; echo "${ADDRESSES[*]}")

# 5. The server: its own data (ids and labels) and certificates; it proposes, the parties check.
status=0
"$PYTHON" train.py "${PROTOCOL[@]}" data=party_files "data.dir=$RUN_DIR/server/data" \
    runtime=grpc "runtime.parties=[$PARTY_LIST]" "runtime.certs=$RUN_DIR/server/certs" \
    logger=csv "hydra.run.dir=$RUN_DIR/server" "$@" || status=$?
exit "$status"
