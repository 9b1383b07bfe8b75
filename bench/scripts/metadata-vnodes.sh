#!/usr/bin/env bash
# `malachi bench metadata` against three brokers (one machine, one disk) at
# several vnode counts, side by side in one run (issue 18: creates/s and p99
# at 16 and at 256 vnodes). The brokers bootstrap with --bootstrap-expect 3
# (ADR 0102); the bench starts once every vnode has a leader.
# Usage: bench/scripts/metadata-vnodes.sh [VNODES...]   (default: 16 256)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/malachi}
[ -x "$BIN" ] || cargo build --release --bin malachi
vnodes=("${@:-16 256}")
out=bench/results/metadata-vnodes-$(date -u +%Y-%m-%d).jsonl
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

for v in ${vnodes[@]}; do
  root=$(mktemp -d)
  clients=() pids=()
  for id in 1 2 3; do clients+=("127.0.0.1:$(free_port)"); done
  for id in 1 2 3; do
    cat >"$root/node-$id.toml" <<TOML
[membership]
cluster_cookie = "bench-cookie"

[cluster]
vnodes = $v
TOML
    seeds=()
    for other in 1 2 3; do
      [ "$other" = "$id" ] || seeds+=(--seed "${clients[$((other - 1))]}")
    done
    RUST_LOG=warn "$BIN" broker --node-id "$id" --listen "${clients[$((id - 1))]}" \
      --admin-listen "127.0.0.1:$(free_port)" --config "$root/node-$id.toml" \
      --data-dir "$root/node-$id" --bootstrap-expect 3 "${seeds[@]}" \
      >"$root/node-$id.out" 2>"$root/node-$id.log" &
    pids+=($!)
  done
  # Every vnode led: `vnode list --json` names a leader for each of the V.
  led=0
  for _ in $(seq 1 900); do
    led=$("$BIN" vnode list --json --broker "${clients[0]}" 2>/dev/null \
      | python3 -c 'import json,sys;print(sum(1 for v in json.load(sys.stdin)["vnodes"] if v.get("leader")))' \
      2>/dev/null || echo 0)
    [ "$led" -ge "$v" ] && break
    sleep 0.2
  done
  echo "# vnodes=$v: $led vnodes led" >&2
  broker_list=$(IFS=,; echo "${clients[*]}")
  "$BIN" bench metadata --broker "$broker_list" --json \
    | sed "s/^{/{\"vnodes\":$v,/" | tee -a "$out"
  kill -9 "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$root"
done
