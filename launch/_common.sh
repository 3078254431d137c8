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
