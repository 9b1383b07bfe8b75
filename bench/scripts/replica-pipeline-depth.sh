#!/usr/bin/env bash
# Measures pipelined replica-appends (`replica_pipeline_depth_max`, ADR
# 0099): depth 1 (one append in flight per segment and follower) against
# DEPTH, with the store settings of `bench compare`'s RF=3 rows: three
# brokers on this machine (one disk), a topic at replication factor 3,
# `malachi bench produce` with many producers on one hot range. Runs ABBA
# pairs so drift of the shared machine falls on both sides; prints one JSON
# line per run, mode first.
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
source bench/scripts/three-brokers.sh

store=$'[store]\nflush_interval_ms = 0\nsync_threads = 16'
for _ in $(seq 1 "$PAIRS"); do
  run_once serial "replica_pipeline_depth_max = 1"$'\n\n'"$store"
  run_once pipelined "replica_pipeline_depth_max = $DEPTH"$'\n\n'"$store"
  run_once pipelined "replica_pipeline_depth_max = $DEPTH"$'\n\n'"$store"
  run_once serial "replica_pipeline_depth_max = 1"$'\n\n'"$store"
done
