#!/usr/bin/env bash
# Measures replication-level group commit (`replica_group_commit_ms`) off
# against on: three brokers on this machine (one disk), a topic at
# replication factor 3, `malachi bench produce` with many producers on one
# hot range. Runs ABBA pairs so drift of the shared machine falls on both
# sides; prints one JSON line per run, mode first.
#
#   bench/scripts/replica-group-commit.sh [PAIRS] [LINGER_MS] [DURATION]
#
# Uses target/release/malachi (cargo build --release --bin malachi first).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${MALACHI_BIN:-target/release/malachi}
PAIRS=${1:-2}
LINGER_MS=${2:-5}
DURATION=${3:-15s}
PRODUCERS=${PRODUCERS:-32}
BATCH=${BATCH:-10}
SIZE=${SIZE:-256}
source bench/scripts/three-brokers.sh

for _ in $(seq 1 "$PAIRS"); do
  run_once off "replica_group_commit_ms = 0"
  run_once on "replica_group_commit_ms = $LINGER_MS"
  run_once on "replica_group_commit_ms = $LINGER_MS"
  run_once off "replica_group_commit_ms = 0"
done
