#!/usr/bin/env bash
# Measures pipelined replica-appends (`replica_pipeline_depth_max`, ADR
# 0099): depth 1 (one append in flight per segment and follower) against
# DEPTH, with the store settings of `bench compare`'s RF=3 rows: three
# brokers on this machine (one disk), a topic at the default replication
# factor (3), `malachi bench produce` with many producers on one hot range.
# Runs ABBA pairs so drift of the shared machine falls on both sides;
# prints one JSON line per run, mode first.
#
#   bench/scripts/replica-pipeline-depth.sh [PAIRS] [DEPTH] [DURATION]
#
# Uses target/release/malachi (cargo build --release --bin malachi first).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${MALACHI_BIN:-target/release/malachi}
PAIRS=${1:-2}
DEPTH=${2:-8}
DURATION=${3:-15s}
PRODUCERS=${PRODUCERS:-64}
BATCH=${BATCH:-100}
SIZE=${SIZE:-1024}

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

run_once() {
  local mode=$1 depth=$2 root
  root=$(mktemp -d)
  local clients=() pids=()
  for id in 1 2 3; do clients+=("127.0.0.1:$(free_port)"); done
  for id in 1 2 3; do
    cat >"$root/node-$id.toml" <<TOML
replica_pipeline_depth_max = $depth

[store]
flush_interval_ms = 0
sync_threads = 16

[membership]
probe_period_ms = 200
probe_rtt_ms = 100
suspect_timeout_ms = 2000
seed_retry_ms = 200
cluster_cookie = "bench-cookie"

[cluster]
nodes = [1, 2, 3]
coordinator_poll_ms = 200
TOML
    local seeds=()
    for other in 1 2 3; do
      [ "$other" = "$id" ] || seeds+=(--seed "${clients[$((other - 1))]}")
    done
    RUST_LOG=warn "$BIN" broker --node-id "$id" --listen "${clients[$((id - 1))]}" \
      --admin-listen "127.0.0.1:$(free_port)" --config "$root/node-$id.toml" \
      --data-dir "$root/node-$id" "${seeds[@]}" >"$root/node-$id.out" 2>"$root/node-$id.log" &
    pids+=($!)
  done
  local broker=${clients[0]}
  for _ in $(seq 1 600); do
    if "$BIN" topic create hot --replication-factor 3 --broker "$broker" >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
  local line
  line=$("$BIN" bench produce --broker "$broker" --topic hot --producers "$PRODUCERS" \
    --batch-records "$BATCH" --record-size "$SIZE" --duration "$DURATION" --json | tail -1)
  echo "{\"mode\":\"$mode\",\"replica_pipeline_depth_max\":$depth,\"result\":$line}"
  kill -9 "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$root"
}

for _ in $(seq 1 "$PAIRS"); do
  run_once serial 1
  run_once pipelined "$DEPTH"
  run_once pipelined "$DEPTH"
  run_once serial 1
done
