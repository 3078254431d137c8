#!/usr/bin/env bash
# Start the Ray head on this node (once per cluster), then join other nodes with launch/ray_worker.sh.
#   launch/ray_head.sh                       GPUs from nvidia-smi, GCS port 6379, dashboard/jobs on 8265
# Env: RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), NUM_GPUS, NODE_IP, RAY_BLOCK=1 (stay in the foreground:
# containers, SLURM), PRINT_ONLY=1 (print the command).
set -euo pipefail
. "$(dirname "$0")/_common.sh"
check_forbidden_env

PORT=${RAY_PORT:-6379}
DASH=${RAY_DASHBOARD_PORT:-8265}
IP=$(node_ip)
args=(ray start --head --node-ip-address="$IP" --port="$PORT" --dashboard-host=0.0.0.0
      --dashboard-port="$DASH" --num-gpus="$(gpu_count)" --disable-usage-stats)
[ "${RAY_BLOCK:-0}" = "1" ] && args+=(--block)
run "${args[@]}"
echo "join workers with:  launch/ray_worker.sh $IP:$PORT"
echo "submit jobs with:   RAY_ADDRESS=http://$IP:$DASH launch/submit.sh +experiment=gsm8k_qwen3_0.6b"
