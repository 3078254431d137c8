#!/usr/bin/env bash
# Start the Ray head on this node (once per cluster), then join other nodes with launch/ray_worker.sh.
#   launch/ray_head.sh                       GPUs from nvidia-smi, GCS port 6379, dashboard/jobs on 127.0.0.1:8265
# Env: RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_DASHBOARD_HOST (127.0.0.1: jobs are submitted from this node;
# set it to this node's IP to submit from elsewhere), NUM_GPUS, NODE_IP, RAY_BLOCK=1 (stay in the foreground:
# containers, SLURM), PRINT_ONLY=1 (print the commands), RAY_AUTH_MODE / RAY_AUTH_TOKEN (token authentication, on
# by default: _common.sh setup_auth).
set -euo pipefail
. "$(dirname "$0")/_common.sh"
check_forbidden_env
setup_auth head

PORT=${RAY_PORT:-6379}
DASH=${RAY_DASHBOARD_PORT:-8265}
DASH_HOST=${RAY_DASHBOARD_HOST:-127.0.0.1}
IP=$(node_ip)
args=(ray start --head --node-ip-address="$IP" --port="$PORT" --dashboard-host="$DASH_HOST"
      --dashboard-port="$DASH" --num-gpus="$(gpu_count)" --disable-usage-stats)
[ "${RAY_BLOCK:-0}" = "1" ] && args+=(--block)
if [ "$DASH_HOST" != "127.0.0.1" ] && [ "$RAY_AUTH_MODE" != "token" ]; then
  echo "warning: the dashboard and its Jobs API listen on $DASH_HOST without authentication: anyone who reaches" \
       "port $DASH can run code on this cluster" >&2
fi
echo "join workers with:  RAY_AUTH_TOKEN=<token> launch/ray_worker.sh $IP:$PORT"
SUBMIT_HOST=$([ "$DASH_HOST" = "0.0.0.0" ] && echo "$IP" || echo "$DASH_HOST")
echo "submit jobs with:   RAY_ADDRESS=http://$SUBMIT_HOST:$DASH launch/submit.sh +experiment=gsm8k_qwen3_0.6b"
run "${args[@]}"
