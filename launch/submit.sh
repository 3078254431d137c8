#!/usr/bin/env bash
# Submit a TOP-RL run to a running Ray cluster:  launch/submit.sh +experiment=dapo_qwen3_4b [more overrides]
# The overrides are composed and checked here first (`top-rl ... dry_run=true`: config errors and TOP refusals
# fail before the cluster is used), then the same command runs as a Ray job on the cluster.
# Env: RAY_ADDRESS (http://127.0.0.1:8265, the head's dashboard), SUBMIT_NO_WAIT=1 (return after submitting),
# SKIP_DRY_RUN=1, PRINT_ONLY=1 (print the submit command), RAY_AUTH_TOKEN (the head's `ray get-auth-token`, unless
# this is the head: token authentication is on by default, _common.sh setup_auth). WANDB_MODE, WANDB_ENTITY, HF_HOME
# are forwarded; secrets (WANDB_API_KEY, HF_TOKEN) never go on a command line: export them on each node before
# `ray start`.
set -euo pipefail
. "$(dirname "$0")/_common.sh"
check_forbidden_env
setup_auth submit

[ $# -ge 1 ] || { echo "usage: launch/submit.sh +experiment=NAME [hydra overrides...]" >&2; exit 2; }
ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
TOP_RL=${TOP_RL:-top-rl}

if [ "${SKIP_DRY_RUN:-0}" != "1" ]; then
  "$TOP_RL" "$@" dry_run=true >/dev/null || { echo "error: the run config is refused (see above)" >&2; exit 2; }
fi

# Forward run-level env to the job's driver and actors (no secrets, never the forbidden variables).
RUNTIME_ENV=$(python3 - <<'PY'
import json, os
keep = ("WANDB_MODE", "WANDB_ENTITY", "WANDB_PROJECT", "HF_HOME", "TOP_RL_ATTENTION_BACKEND")
print(json.dumps({"env_vars": {k: os.environ[k] for k in keep if os.environ.get(k)}}))
PY
)
args=(ray job submit --address="$ADDRESS" --runtime-env-json="$RUNTIME_ENV")
[ "${SUBMIT_NO_WAIT:-0}" = "1" ] && args+=(--no-wait)
run "${args[@]}" -- "$TOP_RL" "$@"
