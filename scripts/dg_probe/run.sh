#!/usr/bin/env bash
# Where a DeepGEMM call crashes, on a device without gdb: one bf16_gemm_nt in a fresh process with a SIGSEGV handler
# (segv_trace.c) that prints module + offset per frame, resolved with addr2line, plus ldd / nm of _C. It found the
# static libstdc++ linked into _C (docs/numerics.md §11, scripts/build_deep_gemm.py). On the device:
#   export OUT; bash scripts/gpu_run.sh none; bash scripts/dg_probe/run.sh   (DG_PROBE_ENV="DG_JIT_DEBUG=1": more)
OUT="${OUT:-/tmp/top_rl_gpu_out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
gcc -shared -fPIC -O0 -o /tmp/segv.so segv_trace.c -ldl 2>&1 | tail -3
which addr2line gdb nm 2>&1 | head
export PYTHONPATH=/tmp/top_rl_site:$PWD/../..
export DG_JIT_CACHE_DIR=/tmp/dgcache ${DG_PROBE_ENV:-}
timeout 300 python3 probe.py /tmp/segv.so > "$OUT/dg_probe.log" 2>&1; echo "probe rc $?" >> "$OUT/dg_probe.log"
SO=$(python3 -c "import glob;print((glob.glob('/tmp/top_rl_site/deep_gemm/_C*.so') or [''])[0])")
echo "SO=$SO" >> "$OUT/dg_probe.log"
grep "SEGV_TRACE #" "$OUT/dg_probe.log" | while read -r _ idx file off sym; do
  case "$file" in *deep_gemm*|*libtorch*|*libc10*|*libstdc*) echo "$idx $file $off $sym => $(addr2line -f -C -i -e "$file" "$off" 2>&1 | tr '\n' ' ')";; esac
done >> "$OUT/dg_probe.log" 2>&1
tail -c 6000 "$OUT/dg_probe.log"
{ echo "--- ldd"; ldd "$SO"; echo "--- defined std:: stream symbols in _C"; nm -D --defined-only -C "$SO" | grep -c "std::"; nm -D --defined-only -C "$SO" | grep -E "_M_insert|ios_base|locale::" | head; gcc --version | head -1; python3 -c "import torch;print(torch._C._GLIBCXX_USE_CXX11_ABI, torch.__config__.show()[:600])"; } >> "$OUT/dg_probe.log" 2>&1
tail -c 4000 "$OUT/dg_probe.log"
