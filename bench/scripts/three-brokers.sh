# Sourced by the replication measurements: `run_once MODE CONFIG_LINES`
# starts three brokers on this machine (one disk) with CONFIG_LINES at the
# top of each broker's config, creates topic `hot` at replication factor 3
# once all three are live, runs `malachi bench produce` with many producers
# on that one hot range for DURATION, prints one JSON line (MODE, the config
# lines, the result) and removes everything.
#
# Expects BIN, DURATION, PRODUCERS, BATCH and SIZE to be set.

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

run_once() {
  local mode=$1 settings=$2 root
  root=$(mktemp -d)
  local clients=() pids=()
  for id in 1 2 3; do clients+=("127.0.0.1:$(free_port)"); done
  for id in 1 2 3; do
    cat >"$root/node-$id.toml" <<TOML
$settings

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
  local settings_json
  settings_json=$(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$settings")
  echo "{\"mode\":\"$mode\",\"settings\":$settings_json,\"result\":$line}"
  kill -9 "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$root"
}
