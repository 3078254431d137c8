#!/usr/bin/env bash
# Join this node to a running Ray cluster:  launch/ray_worker.sh HEAD_IP:6379
# Env: NUM_GPUS, NODE_IP, RAY_BLOCK=1 (stay in the foreground), PRINT_ONLY=1 (print the command), RAY_AUTH_TOKEN
# (the head's `ray get-auth-token`: token authentication is on by default, _common.sh setup_auth).
# Every node needs the same image (Dockerfile) and the model checkpoint at the same path (model.path).
set -euo pipefail
. "$(dirname "$0")/_common.sh"
check_forbidden_env
setup_auth worker

HEAD=${1:?usage: launch/ray_worker.sh HEAD_IP:PORT}
args=(ray start --address="$HEAD" --node-ip-address="$(node_ip)" --num-gpus="$(gpu_count)" --disable-usage-stats)
[ "${RAY_BLOCK:-0}" = "1" ] && args+=(--block)
run "${args[@]}"
