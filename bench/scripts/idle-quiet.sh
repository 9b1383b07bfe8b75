#!/usr/bin/env bash
# Idle cost of the control plane with quiet groups (ADR 0101) and without,
# side by side in one run, and the failover time after a leader's SIGKILL.
# Usage: bench/scripts/idle-quiet.sh [VNODES...]   (default: 16 256)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/release/malachi
[ -x "$bin" ] || cargo build --release --bin malachi
vnodes=("${@:-16 256}")
out=bench/results/idle-quiet-$(date -u +%Y-%m-%d).jsonl
for v in ${vnodes[@]}; do
  for quiet in true false; do
    echo "# vnodes=$v quiet_groups=$quiet" >&2
    "$bin" bench idle --brokers 3 --vnodes "$v" --settle 10s --duration 20s --json \
      --kill-leader --cluster-set "quiet_groups=$quiet" --cluster-set "balance_leaders=$quiet" \
      | sed "s/^{/{\"quiet_groups\":$quiet,/" | tee -a "$out"
  done
done
