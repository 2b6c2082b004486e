#!/usr/bin/env bash
# Load on the tower layer over loopback with wrk: the example API server's unlimited route
# (`/open`, the baseline), the same handler behind the layer with every request allowed
# (`/hello`, limits far above the load), and behind the layer with almost every request refused
# (`/hello` under examples/settings/plans.toml: 5 per second).
#
# Not part of .ci/run (it measures, it does not check). Needs wrk (`apt-get install wrk`).
# The server is pinned to CPU 0 and wrk to CPU 1, so that they do not take turns on one core.
# wrk is closed-loop: its latencies understate what an open-loop load would see.
#
#   bash .ci/load-tower.sh            # DURATION=10s CONNECTIONS=64 PORT=3197 by default
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${DURATION:-10s}
connections=${CONNECTIONS:-64}
port=${PORT:-3197}

command -v wrk >/dev/null || { echo "wrk is not installed: apt-get install wrk" >&2; exit 1; }
cargo build --quiet --release --features tower --example api_server
# Where cargo put it: CARGO_TARGET_DIR (or the target directory of a cargo configuration) when
# set, else ./target.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

roomy=$(mktemp --suffix=.toml)
cat >"$roomy" <<'TOML'
algorithm = "token_bucket"
[plans.free]
limit = 100000000
window = "1s"
[plans.pro]
limit = 100000000
window = "1s"
TOML

server=""
stop_server() {
    if [[ -n "$server" ]]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=""
    fi
}
trap 'stop_server; rm -f "$roomy"' EXIT

start_server() {
    taskset -c 0 "$target_dir/release/examples/api_server" --listen "127.0.0.1:$port" --settings "$1" >/dev/null &
    server=$!
    for _ in $(seq 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "the server did not start on port $port" >&2
    exit 1
}

load() {
    echo "== $1"
    taskset -c 1 wrk -t1 -c"$connections" -d"$duration" --latency "http://127.0.0.1:$port$2" |
        grep -E "Requests/sec|Latency  |50%|99%|Non-2xx"
}

start_server "$roomy"
load "baseline: /open, no layer" /open
load "layer, every request allowed: /hello" /hello
stop_server

start_server examples/settings/plans.toml
load "layer, almost every request refused (429): /hello" /hello
stop_server
