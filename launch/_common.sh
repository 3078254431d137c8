# Shared by the launch scripts (sourced, not run). PRINT_ONLY=1 prints commands instead of running them.
run() {
  if [ "${PRINT_ONLY:-0}" = "1" ]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

# Variables the TOP contract forbids change the returned log-probs or the GEMM kernel (contract.forbidden_env);
# a node that exports one would start every Ray worker with it.
check_forbidden_env() {
  local v
  for v in SGLANG_RETURN_ORIGINAL_LOGPROB SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_FALLBACK_VARIANT; do
    if [ -n "${!v:-}" ]; then
      echo "error: $v is set in this shell; the TOP contract forbids it: unset $v" >&2
      exit 2
    fi
  done
}

gpu_count() {
  if [ -n "${NUM_GPUS:-}" ]; then echo "$NUM_GPUS"; return; fi
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L | wc -l; else echo 0; fi
}

node_ip() {
  if [ -n "${NODE_IP:-}" ]; then echo "$NODE_IP"; return; fi
  hostname -I 2>/dev/null | awk '{print $1}'
}

# Ray's token authentication (RAY_AUTH_MODE=token, the default here): the GCS, the dashboard and its Jobs API, and
# the Ray Client server accept only callers holding the cluster's shared token, from RAY_AUTH_TOKEN,
# RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, the same on every node and wherever jobs are submitted from.
# RAY_AUTH_MODE=disabled opts out (a trusted private network only: anyone who reaches the ports can run code).
# $1: head (generates a token when none is found) | worker | submit (need the head's).
setup_auth() {
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
  [ "$RAY_AUTH_MODE" = "token" ] || return 0
  if [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then
    return 0
  fi
  if [ "$1" = "head" ]; then
    if [ "${PRINT_ONLY:-0}" = "1" ]; then run ray get-auth-token --generate; else ray get-auth-token --generate >/dev/null; fi
    echo "generated this cluster's Ray token in ~/.ray/auth_token: give it to every node and submitter as" \
         "RAY_AUTH_TOKEN=\$(ray get-auth-token)" >&2
  else
    echo "error: Ray token authentication is on and no token was found: export RAY_AUTH_TOKEN=<the head's" \
         "\`ray get-auth-token\`> (or RAY_AUTH_MODE=disabled on a trusted network)" >&2
    exit 2
  fi
}
