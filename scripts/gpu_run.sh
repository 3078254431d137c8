#!/usr/bin/env bash
# The one entry point on the lent GPU machine (device `run` tool, carry=[".gpu_bundle/core", ...]):
#   bash scripts/gpu_run.sh [all|tests|bench|bench-trainer|bench-rollout|bench-compare|e2e|e2e-wait|none]   (none: only the install)
# installs the wheels of .gpu_bundle/ (made here by scripts/gpu_bundle.sh) into a private target dir,
# runs `pytest tests/gpu` and bench/*.py, and writes logs plus summary.md to $OUT (at most 8 files come
# back). Each stage has its own timeout so the summary is written even when one stage hangs; the whole
# script stays under the tool's 10-minute limit. Extra pytest args: PYTEST_ARGS="-k invariance"; test files:
# PYTEST_PATHS="tests/gpu/test_a.py tests/gpu/test_b.py" (default tests/gpu).
# `bench-trainer` (its own call: ~5-8 minutes) runs bench/trainer_step.py, TOP trainer vs stock Megatron-core
# (TOP_RL_BENCH_QUICK=1 or TOP_RL_BENCH_MODELS=qwen3-0.6b: one model; TOP_RL_BENCH_ARGS: more flags of
# bench/trainer_step.py; TOP_RL_BENCH_BUDGET_S: when it stops
# starting workers, default 420). `bench-rollout` (its own call: ~3-6 minutes) runs bench/rollout.py, the native
# engine's generated tok/s and ms per decode step at the 0.6B and 4B shapes (TOP_RL_BENCH_ROLLOUT_ARGS: more flags,
# e.g. "--models qwen3-0.6b --modes graph" or "--sglang-python PY" for the live-server rows).
set -uo pipefail
cd "$(dirname "$0")/.."

WHAT="${1:-all}"
OUT="${OUT:-/tmp/top_rl_gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TOP_RL_ATTENTION_BACKEND="${TOP_RL_ATTENTION_BACKEND:-triton}"
export TOP_RL_GPU_REPORT="$OUT/report.jsonl"  # measured numbers GPU tests report (JSON lines), added to summary.md
PY=python3
T0=$(date +%s)

# Every carried group installs into one site dir outside the tree: it outlives the call while the machine stays
# warm, so a live server's carries (scripts/gpu_bundle.sh sglang_live prints them: two for 0.5.11, three for 0.5.17
# with ray) are calls back to back, each adding to what the earlier ones installed. TOP_RL_SITE_FRESH=1 starts it
# empty; TOP_RL_SITE moves it (tests).
SITE=${TOP_RL_SITE:-/tmp/top_rl_site}
[ "${TOP_RL_SITE_FRESH:-0}" = 1 ] && rm -rf "$SITE"
# The SGLang release the carried groups hold (scripts/gpu_bundle.sh --release writes it into every group folder, so
# each carry brings it; a folder bundled before that holds 0.5.11's). The site dir holds one release: a carry of
# another one starts it anew, and groups of two releases in one call are not installed.
CARRIED_RELEASE=""
if compgen -G ".gpu_bundle/*/" >/dev/null; then
  CARRIED_RELEASE=$(for d in .gpu_bundle/*/; do cat "$d/RELEASE" 2>/dev/null || echo 0.5.11; done | sort -u | paste -sd' ' -)
fi
SITE_NOTE=""
if [[ "$CARRIED_RELEASE" == *" "* ]]; then
  SITE_NOTE="gpu_run: the carried groups hold SGLang releases $CARRIED_RELEASE: nothing installed (carry one release's groups)"
elif [ -n "$CARRIED_RELEASE" ] && [ -f "$SITE/RELEASE" ] && [ "$(cat "$SITE/RELEASE")" != "$CARRIED_RELEASE" ]; then
  SITE_NOTE="gpu_run: $SITE held SGLang $(cat "$SITE/RELEASE")'s wheels, this carry is $CARRIED_RELEASE's: started anew"
  rm -rf "$SITE"
fi
if [[ "$CARRIED_RELEASE" == *" "* ]]; then
  echo "$SITE_NOTE" | tee "$OUT/install.log"
elif compgen -G ".gpu_bundle/*/*.whl" >/dev/null; then  # every group carried (scripts/gpu_bundle.sh)
  # one file per wheel name: groups may share a dependency (ray and sglang_server both need jsonschema)
  mapfile -t WHEELS < <(for w in .gpu_bundle/*/*.whl; do echo "$(basename "$w") $w"; done | sort -u -k1,1 | cut -d' ' -f2)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "${WHEELS[@]}" >"$OUT/install.log" 2>&1 || echo "gpu_run: wheel install failed (see install.log)"
  echo "$CARRIED_RELEASE" >"$SITE/RELEASE"
  echo "gpu_run: installed ${#WHEELS[@]} wheels into $SITE ($(ls .gpu_bundle | xargs)), SGLang $CARRIED_RELEASE's" \
    >>"$OUT/install.log"
  [ -z "$SITE_NOTE" ] || echo "$SITE_NOTE" >>"$OUT/install.log"
elif [ -d "$SITE" ]; then
  echo "gpu_run: nothing carried; using what an earlier call installed in $SITE" | tee "$OUT/install.log"
else
  echo "gpu_run: no .gpu_bundle/*/*.whl (run scripts/gpu_bundle.sh here and carry .gpu_bundle/core)" | tee "$OUT/install.log"
fi
# sgl_kernel's FA3 build (carry .gpu_bundle/fa3, scripts/gpu_bundle.sh fa3: ~51 MiB of xz, a carry of its own), unpacked
# into the site dir beside the wheels with its digest checked (scripts/flash_ops_xz.py), then linked into sgl_kernel/ at
# every call: a later carry's `pip install --upgrade --target` replaces that folder, and the order of carries is free.
if [ -f .gpu_bundle/fa3/flash_ops.so.xz ] && [[ "$CARRIED_RELEASE" != *" "* ]]; then
  mkdir -p "$SITE"
  [ -f "$SITE/RELEASE" ] || echo "$CARRIED_RELEASE" >"$SITE/RELEASE"
  "$PY" scripts/flash_ops_xz.py unpack .gpu_bundle/fa3/flash_ops.so.xz "$SITE/.fa3/flash_ops.abi3.so" \
    >>"$OUT/install.log" 2>&1 || echo "gpu_run: the FA3 build did not unpack (see install.log)" | tee -a "$OUT/install.log"
fi
# A pack larger than a carry (0.5.17's: 126 MiB) comes as parts in groups fa3, fa3_2, ... over several calls: gathered
# in the site dir, joined and unpacked once the last has come.
if compgen -G ".gpu_bundle/fa3*/flash_ops.so.xz.part*" >/dev/null && [[ "$CARRIED_RELEASE" != *" "* ]]; then
  PARTS="$SITE/.fa3/parts"
  mkdir -p "$PARTS"
  [ -f "$SITE/RELEASE" ] || echo "$CARRIED_RELEASE" >"$SITE/RELEASE"
  cp .gpu_bundle/fa3*/flash_ops.so.xz.part* "$PARTS/"
  cp "$(compgen -G ".gpu_bundle/fa3*/flash_ops.so.xz.sha256" | head -n 1)" "$PARTS/flash_ops.so.xz.sha256"
  first=$(compgen -G "$PARTS/flash_ops.so.xz.part*" | head -n 1)
  n=${first##*-of-}
  have=$(compgen -G "$PARTS/flash_ops.so.xz.part*-of-$n" | wc -l)
  if [ "$have" -eq "$n" ]; then
    for ((i = 1; i <= n; i++)); do cat "$PARTS/flash_ops.so.xz.part$i-of-$n"; done >"$PARTS/flash_ops.so.xz"
    if "$PY" scripts/flash_ops_xz.py unpack "$PARTS/flash_ops.so.xz" "$SITE/.fa3/flash_ops.abi3.so" >>"$OUT/install.log" 2>&1
    then rm -rf "$PARTS"
    else echo "gpu_run: the FA3 build did not unpack from its $n parts (see install.log)" | tee -a "$OUT/install.log"; fi
  else
    echo "gpu_run: the FA3 build: $have of its $n parts carried so far (carry the other fa3_* groups)" >>"$OUT/install.log"
  fi
fi
if [ -f "$SITE/.fa3/flash_ops.abi3.so" ] && [ -d "$SITE/sgl_kernel" ]; then
  ln -sfn "$SITE/.fa3/flash_ops.abi3.so" "$SITE/sgl_kernel/flash_ops.abi3.so"
fi
SITE_RELEASE=$(cat "$SITE/RELEASE" 2>/dev/null || true)
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The engine's DeepGEMM (carry .gpu_bundle/deep_gemm; scripts/build_deep_gemm.py): its host extension comes back in
# $OUT (deep_gemm_C.so, whatever the module's name); copied into .gpu_bundle/deep_gemm/ and carried, it skips the build.
DG_SRC=$(compgen -G ".gpu_bundle/deep_gemm/deep_gemm_src-*.tar.gz" | head -n 1)
if [[ -n "$DG_SRC" ]]; then
  timeout "${DEEPGEMM_BUILD_TIMEOUT:-300}" "$PY" scripts/build_deep_gemm.py "$DG_SRC" "$SITE" \
    --prebuilt .gpu_bundle/deep_gemm/deep_gemm_C.so --keep "$OUT" >"$OUT/deep_gemm_build.log" 2>&1 ||
    echo "gpu_run: DeepGEMM build failed (see deep_gemm_build.log)"
fi

{
  echo "# TOP-RL GPU run ($(date -u +%FT%TZ), attention backend $TOP_RL_ATTENTION_BACKEND)"
  echo
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  # the release scripts/gpu_bundle.sh packed (its GROUP/RELEASE markers): sglang's version below must be the same
  echo "bundle: SGLang ${SITE_RELEASE:-?} in $SITE (carried now: ${CARRIED_RELEASE:-nothing})${SITE_NOTE:+; $SITE_NOTE}"
  "$PY" -W ignore - <<'PYEOF' 2>/dev/null
import importlib
for m in ("torch", "triton", "sglang", "megatron.core", "deep_gemm", "sgl_kernel.flash_ops"):
    try:
        mod = importlib.import_module(m)
        version = getattr(mod, "__version__", None)
        if m == "deep_gemm":  # the engine's package carries no version: name it by the digest the contract pins
            try:
                from top_rl import contract
                from top_rl.kernels.sglang import deep_gemm_source

                same = deep_gemm_source.package_digest(mod.__file__.rsplit("/", 1)[0]) == \
                    contract.DEEPGEMM_SOURCE["sources_sha256"]
                version = f"{version or ''} sources {'=' if same else '!='} {contract.DEEPGEMM_SOURCE['package']}".strip()
            except Exception as e:  # noqa: BLE001
                version = f"{version or '?'} (digest not computed: {type(e).__name__})"
        print(f"{m}: {version or '?'}")
    except Exception as e:  # report, don't stop: the tests say what is missing
        print(f"{m}: NOT IMPORTABLE ({type(e).__name__}: {e})")
PYEOF
} >"$OUT/summary.md"

# Where the e2e jobs write their run dirs, logs and bookkeeping (checkpoints are GBs: not in the tree)
export E2E_ROOT=${E2E_ROOT:-/tmp}
# One e2e job (started below, maybe by an earlier call): copy its rows and log tail to $OUT every E2E_POLL_S seconds
# (what a call cut off by the tool's limit still brings back) until it ends, or, for a detached job (started with
# E2E_DETACH=1: its .detached marker), until this call has run E2E_CALL_BUDGET seconds (default 560): then it returns
# 1, leaving the job running, and the next call, `e2e-wait`, follows it on.
copy_run_outputs() {  # its rows, step lines and log tail (a cut-off call still shows where its time went)
  local run=$1 j="$E2E_ROOT/e2e_$1"
  [ -f "$j/metrics.jsonl" ] && cp "$j/metrics.jsonl" "$OUT/metrics_$run.jsonl"
  grep -E '^step [0-9]+ \|' "$j.log" 2>/dev/null | tail -n 40 >"$OUT/steps_$run.log"
  grep -v -i "warn" "$j.log" 2>/dev/null | tail -n 150 >"$OUT/log_$run.tail"
}
follow_run() {
  local run=$1 pid j="$E2E_ROOT/e2e_$1"
  pid=$(cat "$j.pid")
  while kill -0 "$pid" 2>/dev/null && [ ! -f "$j.rc" ]; do  # the status file: a zombie or a reused pid still answers
    sleep "${E2E_POLL_S:-10}"
    copy_run_outputs "$run"
    if [ -f "$j.detached" ] && [ $(( $(date +%s) - T0 )) -ge "${E2E_CALL_BUDGET:-560}" ] && [ ! -f "$j.rc" ]; then
      echo "e2e $run: still running after $(( $(date +%s) - $(cat "$j.start") )) s (pid $pid, its own session):" \
           "follow it with \`E2E_RUNS=\"$run\" bash scripts/gpu_run.sh e2e-wait\` in the next call" >>"$OUT/summary.md"
      return 1
    fi
  done
  local rc
  rc=$(cat "$j.rc" 2>/dev/null || echo "?")
  echo "e2e $run: exit $rc in $(( $(date +%s) - $(cat "$j.start") )) s: $(cat "$j.args")" >>"$OUT/summary.md"
  { echo "===== e2e $run (exit $rc) ====="; grep -v -i "warn" "$j.log" | tail -n 60; } >>"$OUT/e2e.log"
  copy_run_outputs "$run"
  rm -f "$j.pid" "$j.detached"
  return 0
}

# A detached job of `run` that an earlier call started and that has not ended (it would share the GPU with a new one)
still_running() {
  local j="$E2E_ROOT/e2e_$1"
  [ -f "$j.pid" ] && [ ! -f "$j.rc" ] && kill -0 "$(cat "$j.pid")" 2>/dev/null
}

if [[ "$WHAT" == all || "$WHAT" == tests ]]; then
  # The default limit is what is left of 560 s since the script started (the install's time counted). On the limit
  # pytest gets SIGINT, not SIGTERM: it stops like a Ctrl-C and still prints the failures so far (-rfEsxX) and writes
  # junit.xml (a SIGTERM left a 0.5.17 failure without its traceback); SIGKILL 20 s later if it does not stop.
  # shellcheck disable=SC2086
  timeout -s INT -k 20 "${PYTEST_TIMEOUT:-$(( 560 - ($(date +%s) - T0) ))}" "$PY" -m pytest ${PYTEST_PATHS:-tests/gpu} -q -rfEsxX -p no:cacheprovider \
    --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-} >"$OUT/pytest.log" 2>&1
  echo "pytest exit code: $? ($(( $(date +%s) - T0 )) s since start): $(tail -n 1 "$OUT/pytest.log")" >>"$OUT/summary.md"
fi

if [[ "$WHAT" == e2e ]]; then
  # The GPU job through Ray on two GPUs (conf/experiment/one_node_qwen3_0.6b_arith.yaml; carry .gpu_bundle/core
  # and .gpu_bundle/ray): (a) engine GPU + trainer GPU, (b) trainer DP=2 over both GPUs with the engine sharing
  # the last rank's GPU, (c) the engine killed mid-run (TOP_RL_FAULT, the loop's test hook) and restarted.
  # Runs write under /tmp (checkpoints are GBs); metrics and log tails come back in $OUT.
  # On live SGLang servers (carry scripts/gpu_bundle.sh sglang_live + ray), ONE GPU shared by server and trainer:
  # (s) conf/experiment/one_gpu_qwen3_0.6b_sglang.yaml (s2: the same with E2E_S2_ARGS, e.g. rollout.policy_lag=1
  # beside a policy_lag=0 run in one call); (g) GSM8K on a random Qwen3-0.6B shape with the shipped
  # data and Qwen3 tokenizer, 64 prompts x 8 samples x 1024 new tokens (resumable: E2E_G_STEPS more steps per call,
  # checkpointed every E2E_G_EVERY, continued by the next call while the machine is warm); (g4b) the same GSM8K job on a
  # random Qwen3-4B shape (conf/model/qwen3_4b.yaml) with trainer.offload_during_rollout: the trainer's optimizer
  # state and gradients wait in host memory while the server generates (E2E_G4B_STEPS, default 3; E2E_G4B_ARGS;
  # its own limit E2E_G4B_TIMEOUT, default 540 s). It writes no checkpoint (checkpoint.enabled=false: ~56 GB at 4B on
  # a 64 GiB disk). Its start-up and 3 steps take longer than one call: E2E_DETACH=1 E2E_G4B_TIMEOUT=1000 starts it in
  # one call and `e2e-wait` follows it in the next.
  JOB=("$PY" -m top_rl.cli tracking.wandb_mode=disabled tracking.console=true)
  NATIVE=(+experiment=one_node_qwen3_0.6b_arith)
  B=(trainer.dp=2 cluster.colocate=true cluster.engine_gpus=0.5 cluster.trainer_gpus=0.5)
  # (g) the shipped one-GPU GSM8K recipe as README gives it (conf/experiment/gsm8k_qwen3_0.6b_one_gpu.yaml): the GPU
  # handed between server and trainer (cluster.gpu_handoff), CUDA graphs and running requests up to the whole batch,
  # the server's share sized for the card at start (rollout.sglang.mem_fraction_static=auto)
  G=(+experiment=gsm8k_qwen3_0.6b_one_gpu model.path=null "checkpoint.every=${E2E_G_EVERY:-0}")
  # (g4b) G on the Qwen3-4B shape, the optimizer state offloaded during the rollout (the server at 0.7 of the GPU beside
  # the trainer's weights only; the estimate: top_rl/rollout/sglang/memory.py, OFFLOADED_RESIDENT_BYTES_PER_PARAM)
  G4B=(+experiment=gsm8k_qwen3_0.6b model=qwen3_4b model.path=null rollout.num_engines=1 cluster.colocate=true
       cluster.engine_gpus=0.5 cluster.trainer_gpus=0.5 cluster.gpu_handoff=true trainer.offload_during_rollout=true
       rollout.sglang.mem_fraction_static=0.7 rollout.sglang.cuda_graph_max_bs=512
       rollout.sglang.max_running_requests=512 checkpoint.enabled=false)
  # (dapo) the DAPO task at a small shape on ONE GPU with DAPO's dynamic sampling and overlong shaping on
  # (conf/experiment/dapo_qwen3_4b.yaml on a random Qwen3-0.6B shape, 16 prompts x 8 samples x 512 new tokens, the
  # overlong buffer 128): the device has no network for DAPO-Math-17k, so its rows are written in DAPO's published
  # format (the instruction, reward_model.ground_truth) from the shipped GSM8K questions and their final numbers
  DAPO=(+experiment=dapo_qwen3_4b model=qwen3_0.6b model.path=null "task.path=$E2E_ROOT/dapo_rows.jsonl"
        task.tokenizer=qwen3 model.max_position_embeddings=1024 trainer.tp=1 trainer.cp=1 rollout.num_engines=1
        rollout.prompts_per_step=16 rollout.n_samples=8 rollout.max_new_tokens=512 algo.overlong.buffer=128
        rollout.sglang.mem_fraction_static=auto rollout.sglang.startup_timeout_s=900 cluster.colocate=true
        cluster.engine_gpus=0.5 cluster.trainer_gpus=0.5 cluster.gpu_handoff=true cluster.engine_cpus=4
        cluster.trainer_cpus=4 checkpoint.enabled=false)
  : >"$OUT/e2e.log"
  for run in ${E2E_RUNS:-a b c}; do
    keep=""
    case $run in
      a) args=("${NATIVE[@]}" steps="${E2E_A_STEPS:-55}") ;;
      a2) args=("${NATIVE[@]}" steps="${E2E_A_STEPS:-55}" ${E2E_A2_ARGS:-}) ;;  # (a) again with other settings
      b) args=("${NATIVE[@]}" steps="${E2E_B_STEPS:-22}" "${B[@]}") ;;
      c) args=("${NATIVE[@]}" steps="${E2E_C_STEPS:-8}") ;;
      s) args=(+experiment=one_gpu_qwen3_0.6b_sglang steps="${E2E_S_STEPS:-55}" ${E2E_S_ARGS:-}) ;;
      s2) args=(+experiment=one_gpu_qwen3_0.6b_sglang steps="${E2E_S_STEPS:-55}" ${E2E_S2_ARGS:-}) ;;  # (s) again, other settings
      g) keep=1  # resumed across calls: the run dir stays; each call adds E2E_G_STEPS steps
         done_steps=$( [ -f "$E2E_ROOT/e2e_g/metrics.jsonl" ] && wc -l <"$E2E_ROOT/e2e_g/metrics.jsonl" || echo 0)
         args=("${G[@]}" steps=$((done_steps + ${E2E_G_STEPS:-10})) ${E2E_G_ARGS:-})
         [ -d "$E2E_ROOT/e2e_g/checkpoints" ] && args+=(resume=true) ;;
      g2) args=("${G[@]}" steps="${E2E_G2_STEPS:-5}" ${E2E_G2_ARGS:-}) ;;  # (g) again from step 0 with other settings,
                                                                      # e.g. the triton + prefill baseline beside auto
      g4b) args=("${G4B[@]}" steps="${E2E_G4B_STEPS:-3}" ${E2E_G4B_ARGS:-}) ;;
      dapo) "$PY" - "$E2E_ROOT/dapo_rows.jsonl" <<'PYEOF'
import gzip, json, sys
from top_rl.tasks import sources
instr = ("Solve the following math problem step by step. The last line of your response should be of the form "
         "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
         "Remember to put your answer on its own line after \"Answer:\".")
with gzip.open(sources.gsm8k_split("train"), "rt") as f, open(sys.argv[1], "w") as out:
    for line in list(f)[:512]:
        row = json.loads(line)
        out.write(json.dumps({"data_source": "math_dapo", "prompt": [{"role": "user", "content": instr.format(
            q=row["question"])}], "reward_model": {"ground_truth": row["answer"].split("####")[-1].strip()}}) + "\n")
PYEOF
         args=("${DAPO[@]}" steps="${E2E_DAPO_STEPS:-4}" ${E2E_DAPO_ARGS:-}) ;;
    esac
    if still_running "$run"; then
      echo "e2e $run: a job an earlier call started is still running (pid $(cat "$E2E_ROOT/e2e_$run.pid")): nothing" \
           "started; follow it with \`E2E_RUNS=\"$run\" bash scripts/gpu_run.sh e2e-wait\`" >>"$OUT/summary.md"
      break
    fi
    [ -n "$keep" ] || rm -rf "$E2E_ROOT/e2e_$run"
    rm -f "$E2E_ROOT/e2e_$run.rc" "$E2E_ROOT/e2e_$run.pid" "$E2E_ROOT/e2e_$run.detached"
    if [[ $run == c ]]; then fault="kill_engine:${E2E_C_KILL_AT:-4}"; else fault=""; fi
    limit=${E2E_TIMEOUT:-240}
    [[ $run == g4b ]] && limit=${E2E_G4B_TIMEOUT:-540}
    date +%s >"$E2E_ROOT/e2e_$run.start"
    echo "${args[*]} ${fault:+TOP_RL_FAULT=$fault}" >"$E2E_ROOT/e2e_$run.args"
    # In its own process session (setsid), a job outlives the call that started it: the tool ends what a call leaves
    # running, except a new session, which runs until the machine goes back. So with E2E_DETACH=1 a job longer than
    # one call (the 4B shape's start-up and 3 steps) is started by one call and followed by the next (`e2e-wait`),
    # back to back while the machine is warm. Its exit status goes to a file: no later call is its parent.
    # A detached job runs from a copy of the tree outside it: the device lays the carried tree anew at each call, and
    # a GSM8K job started inside it died at the next call in ray.init (os.path.abspath(os.curdir): FileNotFoundError).
    DETACH=()
    JOB_TREE=$PWD
    if [ "${E2E_DETACH:-0}" = 1 ]; then
      DETACH=(setsid); : >"$E2E_ROOT/e2e_$run.detached"
      JOB_TREE="$E2E_ROOT/e2e_tree_$run"
      rm -rf "$JOB_TREE" && mkdir -p "$JOB_TREE"
      tar -C "$PWD" --exclude=./.gpu_bundle --exclude=./.git -cf - . | tar -C "$JOB_TREE" -xf -
    fi
    PYTHONPATH="${PYTHONPATH//$PWD/$JOB_TREE}" TOP_RL_FAULT="$fault" "${DETACH[@]}" bash -c \
      'cd "$3" && timeout "$1" "${@:4}" >"$E2E_ROOT/e2e_$2.log" 2>&1; echo $? >"$E2E_ROOT/e2e_$2.rc"' \
      e2e "$limit" "$run" "$JOB_TREE" "${JOB[@]}" run_dir="$E2E_ROOT/e2e_$run" "${args[@]}" </dev/null >/dev/null 2>&1 &
    echo $! >"$E2E_ROOT/e2e_$run.pid"
    if ! follow_run "$run"; then  # left running: a second job would share the GPU with it
      later=$(echo "${E2E_RUNS:-a b c}" | tr ' ' '\n' | sed -n "/^$run\$/,\$p" | tail -n +2 | xargs)
      [ -z "$later" ] || echo "e2e: not started while $run runs: $later" >>"$OUT/summary.md"
      break
    fi
  done
fi

if [[ "$WHAT" == e2e-wait ]]; then
  # The next call after `E2E_DETACH=1 ... e2e` (same E2E_RUNS, machine still warm): follow the jobs it left running.
  for run in ${E2E_RUNS:-a b c}; do
    if [ -f "$E2E_ROOT/e2e_$run.pid" ]; then follow_run "$run" || break  # still running at the budget: next call
    else echo "e2e-wait $run: no job was started on this machine (it went back, or E2E_RUNS differs)" >>"$OUT/summary.md"; fi
  done
fi

if [[ "$WHAT" == e2e || "$WHAT" == e2e-wait ]]; then
  ls "$OUT"/metrics_*.jsonl >/dev/null 2>&1 && "$PY" bench/rl_step.py "$OUT"/metrics_*.jsonl >>"$OUT/summary.md" 2>&1
fi

if [[ "$WHAT" == bench-compare ]]; then
  # bench/rl_step_compare.py: the GSM8K step on a live server, TOP against SGLang's default mode with two stock
  # trainers (carry the sglang_live carries + ray + fa3). At 1024 new tokens each job is a call of its own on one warm
  # machine, into a folder that outlives the call (TOP_RL_COMPARE_DIR): TOP_RL_COMPARE_ARGS="--only TOP ...", then
  # "--only non-TOP --only megatron_gpt ...", whose call prints the whole table; "--report" prints it again.
  CMP="${TOP_RL_COMPARE_DIR:-/tmp/top_rl_compare}"
  # shellcheck disable=SC2086
  timeout "${BENCH_COMPARE_TIMEOUT:-560}" "$PY" bench/rl_step_compare.py --out "$CMP" ${TOP_RL_COMPARE_ARGS:-} \
    >"$OUT/bench_rl_step_compare.log" 2>&1
  echo "bench rl_step_compare exit code: $? ($(( $(date +%s) - T0 )) s since start)" >>"$OUT/summary.md"
  cp "$CMP"/rl_step_compare*.md "$CMP"/megatron_gpt.json "$OUT"/ 2>/dev/null
  if [[ -f "$CMP/rl_step_compare.md" ]]; then cat "$CMP/rl_step_compare.md" >>"$OUT/summary.md"
  else  # no whole table yet: the jobs' logs (each ends with its server's last lines) come back too
    tail -n 30 "$OUT/bench_rl_step_compare.log" >>"$OUT/summary.md"
    cp "$CMP"/compare_*.log "$OUT"/ 2>/dev/null
  fi
fi

if [[ "$WHAT" == all || "$WHAT" == bench ]]; then
  for b in gemm attn_memory step_time; do
    timeout "${BENCH_TIMEOUT:-75}" "$PY" "bench/$b.py" >"$OUT/bench_$b.log" 2>&1
    echo "bench $b exit code: $? ($(( $(date +%s) - T0 )) s since start)" >>"$OUT/summary.md"
  done
fi

if [[ "$WHAT" == bench-trainer ]]; then
  # shellcheck disable=SC2086  # TOP_RL_BENCH_ARGS: extra flags, e.g. "--no-before --profile none"
  timeout "${BENCH_TRAINER_TIMEOUT:-540}" "$PY" bench/trainer_step.py --out "$OUT" ${TOP_RL_BENCH_ARGS:-} >"$OUT/bench_trainer_step.log" 2>&1
  rc=$?
  echo "bench trainer_step exit code: $rc ($(( $(date +%s) - T0 )) s since start)" >>"$OUT/summary.md"
  if [[ -f "$OUT/trainer_step.md" ]]; then
    sed -n '/^# Final/,$p' "$OUT/bench_trainer_step.log" >>"$OUT/summary.md"
  else  # killed before its final table: keep what it printed as it went
    tail -c 9000 "$OUT/bench_trainer_step.log" >>"$OUT/summary.md"
  fi
fi

if [[ "$WHAT" == bench-rollout ]]; then
  # shellcheck disable=SC2086  # TOP_RL_BENCH_ROLLOUT_ARGS: extra flags of bench/rollout.py
  timeout "${BENCH_ROLLOUT_TIMEOUT:-540}" "$PY" bench/rollout.py --out "$OUT" ${TOP_RL_BENCH_ROLLOUT_ARGS:-} \
    >"$OUT/bench_rollout.log" 2>&1
  rc=$?
  echo "bench rollout exit code: $rc ($(( $(date +%s) - T0 )) s since start)" >>"$OUT/summary.md"
  if [[ -f "$OUT/rollout.md" ]]; then
    { echo; cat "$OUT/rollout.md"; } >>"$OUT/summary.md"
  else  # killed before its table: keep the rows it printed as it went
    grep "^\[bench\]" "$OUT/bench_rollout.log" | tail -n 40 >>"$OUT/summary.md"
    tail -n 15 "$OUT/bench_rollout.log" >>"$OUT/summary.md"
  fi
fi

"$PY" - "$OUT" <<'PYEOF' >>"$OUT/summary.md" 2>&1
import collections, pathlib, sys, xml.etree.ElementTree as ET
out = pathlib.Path(sys.argv[1])
junit = out / "junit.xml"
if junit.exists():
    counts, failures = collections.defaultdict(collections.Counter), []
    for case in ET.parse(junit).iter("testcase"):
        mod = case.get("classname", "?").rsplit(".", 1)[-1]
        kids = {c.tag: c for c in case}
        if "failure" in kids or "error" in kids:
            state = "failed"
            node = kids.get("failure", kids.get("error"))
            failures.append(f"- {mod}::{case.get('name')}: {(node.get('message') or '').splitlines()[0][:300] if node.get('message') else ''}")
        elif "skipped" in kids:
            state = "xfailed" if "xfail" in (kids["skipped"].get("type", "") + kids["skipped"].get("message", "")) else "skipped"
        else:
            state = "passed"
        counts[mod][state] += 1
    print("\n## tests/gpu\n\n| module | passed | failed | xfailed | skipped |\n|---|---|---|---|---|")
    total = collections.Counter()
    for mod, c in sorted(counts.items()):
        total.update(c)
        print(f"| {mod} | {c['passed']} | {c['failed']} | {c['xfailed']} | {c['skipped']} |")
    print(f"| **total** | {total['passed']} | {total['failed']} | {total['xfailed']} | {total['skipped']} |")
    if failures:
        print("\nfailures:\n" + "\n".join(failures))
report = out / "report.jsonl"
if report.exists() and report.read_text().strip():
    print("\n## measured by the GPU tests (report.jsonl)\n\n```\n" + report.read_text().strip() + "\n```")
for b in ("gemm", "attn_memory", "step_time"):
    log = out / f"bench_{b}.log"
    if log.exists():
        text = log.read_text()
        start = text.find("### ")
        print("\n" + (text[start:] if start >= 0 else f"bench {b}: no table; last lines:\n" + "\n".join(text.splitlines()[-15:])))
PYEOF
cat "$OUT/summary.md"
