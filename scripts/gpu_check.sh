#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (issue 27). That machine has
# a CUDA torch, nvcc, a compiler, CMake and Ninja, but no Debian dev packages
# and no network: scripts/gpu_bundle.sh downloads those packages here into
# .gpu_bundle/, which the device run carries. This script then
#   1. unpacks the bundle and builds Pipeforge against that machine's torch
#      (only the targets the check needs, -j<cores>);
#   2. runs the CUDA tests (tests/runtime/cuda_test.cpp);
#   3. runs bench/vs_pytorch against PyTorch's pipelining on the GPU: gpt24
#      and the transformers Llama, fp32 and bf16, 2 ranks sharing GPU 0 and
#      1 rank with 2 stages (scripts/gpu_vs_pytorch.sh);
#   4. trains the demo GPT with NCCL, 2 ranks sharing GPU 0, on 1F1B,
#      ZBVZeroBubble and DualPipeV, and the same on the CPU over Gloo: the
#      losses must agree within float tolerance;
#   5. trains a larger GPT on one GPU in fp32 and in bf16: step time and
#      torch.cuda.max_memory_allocated of each.
# Everything goes to one results file, $OUT/gpu_check.md, with the logs of
# what failed beside it. Each part runs even when an earlier one failed.
#
# Usage: OUT=DIR bash scripts/gpu_check.sh
#   PYTHON=python3     the torch to build against (the device's own)
#   BUNDLE=.gpu_bundle the .deb files; BUILD=build-gpu; JOBS=$(nproc)
#   REHEARSAL=1        stop before the first part that needs a GPU: the CPU
#                      rehearsal with a CUDA venv standing in for the device
#   GPU=cpu            run parts 3 to 5 on the CPU instead of cuda:0 (a dry
#                      run of their configs, launch and comparisons)
#   SKIP_BUILD=1       use BUILD as it is (a dry run over an existing build)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-check}
PYTHON=$(command -v "${PYTHON:-python3}")
BUNDLE=${BUNDLE:-.gpu_bundle}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
GPU=${GPU:-cuda:0}
DEPS=${DEPS:-/tmp/pf-deps}
WORK=$(mktemp -d /tmp/pf-gpu-XXXX)
mkdir -p "$OUT"
R="$OUT/gpu_check.md"
: >"$R"
T0=$(date +%s)
say() { echo "$*" | tee -a "$R"; }
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
keep_log() { cp "$1" "$OUT/" 2>/dev/null; }  # at most 8 files come back: keep only what failed

say "# Pipeforge GPU check ($(date -u +%FT%TZ))"
say "- machine: $(nproc) cores; $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"
say "- torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1)"
say "- nvcc: $(nvcc --version 2>/dev/null | tail -1); c++: $(c++ --version | head -1)"

# --- 1. bundle and build -------------------------------------------------------
mkdir -p "$DEPS"
n=0
for deb in "$BUNDLE"/*.deb; do
  [ -e "$deb" ] || { say "FAIL: no .deb files in $BUNDLE (run scripts/gpu_bundle.sh here first)"; exit 1; }
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$DEPS"
  else
    (cd "$DEPS" && ar p "$ROOT/$deb" "$(ar t "$ROOT/$deb" | grep '^data.tar')" | tar -xJ)
  fi || { say "FAIL: cannot unpack $deb"; exit 1; }
  n=$((n + 1))
done
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
say "- bundle: $n packages unpacked into $DEPS ($(du -sm "$BUNDLE" | cut -f1) MiB of .deb)"

cuda_root=$(bash scripts/cuda_root.sh)
t=$(date +%s)
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  say "- build: skipped, using $BUILD as it is"
elif ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPEFORGE_TORCH=wheel -DPIPEFORGE_PYTHON="$PYTHON" \
    -DPIPEFORGE_WITH_GRAPHVIZ=OFF -DPIPEFORGE_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$DEPS/usr" \
    -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include" -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" \
    >"$WORK/configure.log" 2>&1; then
  say "FAIL: configure"; grep -B2 -A8 -i "error" "$WORK/configure.log" | head -40 | tee -a "$R"; keep_log "$WORK/configure.log"; exit 1
elif ! ninja -C "$BUILD" -j "$JOBS" -k 0 pipeforge cuda_test >"$WORK/build.log" 2>&1; then
  grep -E "Pipeforge:" "$WORK/configure.log" | sed 's/^-- /- /' | tee -a "$R"
  say "FAIL: build"; grep -A12 "FAILED" "$WORK/build.log" | grep -E "error|FAILED" | head -30 | tee -a "$R"
  keep_log "$WORK/build.log"; exit 1
else
  grep -E "Pipeforge:" "$WORK/configure.log" | sed 's/^-- /- /' | tee -a "$R"
  say "- build: configure and $(grep -c '^\[' "$WORK/build.log") steps in $(( $(date +%s) - t )) s with -j$JOBS"
fi
PF="$ROOT/$BUILD/cli/pipeforge"

# --- 2. the CUDA tests ---------------------------------------------------------
say ""
say "## CUDA tests"
t=$(date +%s)
if [ "${REHEARSAL:-0}" = 1 ]; then
  "$BUILD/tests/runtime/cuda_test" --gtest_brief=1 >"$WORK/cuda_test.log" 2>&1
else
  timeout 180 "$BUILD/tests/runtime/cuda_test" >"$WORK/cuda_test.log" 2>&1
fi
rc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran|host syncs" "$WORK/cuda_test.log" | tee -a "$R"
grep -B3 -A10 "Failure" "$WORK/cuda_test.log" | head -40 | tee -a "$R"
say "- cuda_test: exit $rc in $(( $(date +%s) - t )) s"
[ $rc -ne 0 ] && keep_log "$WORK/cuda_test.log"
if [ "${REHEARSAL:-0}" = 1 ]; then
  say ""
  say "REHEARSAL: stopping before the first part that needs a GPU ($(elapsed) so far)."
  exit 0
fi

# --- 3. against PyTorch's pipelining on the GPU (scripts/gpu_vs_pytorch.sh) -----
PF="$PF" PYTHON="$PYTHON" R="$R" OUT="$OUT" ZOO="$ROOT/$BUILD/zoo" GPU="$GPU" bash scripts/gpu_vs_pytorch.sh
say "- ($(elapsed) so far)"

# --- 4. NCCL training vs the CPU -----------------------------------------------
# The text the GPTs learn: this tree's C++ sources (hundreds of KiB).
TEXT="$WORK/text.txt"
find "$ROOT/runtime" "$ROOT/train" "$ROOT/stage" -name '*.cpp' -exec cat {} + >"$TEXT"
# A training config like the demo's, with the loss logged every step.
write_config() {  # NAME SCHEDULE STAGES_PER_RANK RANKS DEVICE MODEL BLOCK PRECISION STEPS
  local name=$1 schedule=$2 spr=$3 ranks=$4 device=$5 model=$6 block=$7 precision=$8 steps=$9
  cat >"$WORK/$name.yaml" <<YAML
model: {path: $model, num_stages: $((ranks * spr)), policy: parameters}
pipeline: {schedule: $schedule, microbatches: 4, stages_per_rank: $spr}
loss: cross_entropy
optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.01, betas: [0.9, 0.95]}
data: {format: text, path: $TEXT, block_size: $block}
training: {steps: $steps, global_batch_size: 32, precision: $precision}
output: {dir: $WORK/out_$name, log_every: 1}
distributed: {device: '$device', timeout_s: 90}
YAML
}
compare() {  # CPU_METRICS GPU_METRICS: max relative difference of the losses
  "$PYTHON" - "$1" "$2" <<'PY'
import json, sys
def read(p):
    return [json.loads(l)["loss"] for l in open(p) if '"event": "train"' in l or '"event":"train"' in l]
a, b = read(sys.argv[1]), read(sys.argv[2])
if len(a) != len(b) or not a:
    print(f"MISMATCH: {len(a)} CPU steps, {len(b)} GPU steps"); sys.exit(1)
d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{len(a)} steps, first loss {a[0]:.5f} (CPU) {b[0]:.5f} (GPU), last {a[-1]:.5f} / {b[-1]:.5f}, "
      f"max relative difference {d:.2e}")
sys.exit(0 if d < 2e-3 else 1)
PY
}
# Two ranks on one GPU: NCCL refuses two ranks of one host on one device
# ("Duplicate GPU detected"); a host id per rank makes them two hosts to it,
# talking over loopback sockets.
two_ranks_on_gpu0() {  # CONFIG LOG
  local port=$((20000 + RANDOM % 20000)) pids=() r
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID="pf-rank-$r" NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN \
      timeout 150 "$PF" train --config "$1" >"$2.rank$r" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  cat "$2.rank0" "$2.rank1" >"$2"
  return $rc
}
say ""
say "## NCCL training: demo GPT, 2 ranks sharing GPU 0, against 2 CPU ranks over Gloo"
GPT="$ROOT/$BUILD/zoo/gpt_demo.pt"
for sched in "1F1B 1" "ZBVZeroBubble 2" "DualPipeV 2"; do
  set -- $sched
  t=$(date +%s)
  write_config "cpu_$1" "$1" "$2" 2 cpu "$GPT" 64 fp32 20
  write_config "gpu_$1" "$1" "$2" 2 "$GPU" "$GPT" 64 fp32 20
  # The CPU reference starts its ranks the same way (Gloo there).
  two_ranks_on_gpu0 "$WORK/cpu_$1.yaml" "$WORK/cpu_$1.log"
  crc=$?
  two_ranks_on_gpu0 "$WORK/gpu_$1.yaml" "$WORK/gpu_$1.log"
  grc=$?
  say "  GPU losses: $("$PYTHON" -c "import json,sys; print(' '.join('%.6f' % json.loads(l)['loss'] for l in open(sys.argv[1]) if '\"train\"' in l))" "$WORK/out_gpu_$1/metrics.jsonl" 2>&1 | tail -1)"
  if [ $crc -ne 0 ] || [ $grc -ne 0 ]; then
    say "- $1: FAIL (CPU exit $crc, GPU exit $grc)"
    for f in "$WORK/cpu_$1.log" "$WORK/gpu_$1.log"; do
      say "  tail of $(basename "$f"):"; grep -v "^frame #\|^\[W" "$f" | tail -6 | sed 's/^/    /' | tee -a "$R"
    done
    [ $crc -ne 0 ] && keep_log "$WORK/cpu_$1.log"
    [ $grc -ne 0 ] && keep_log "$WORK/gpu_$1.log"
    # Still compare the GPU's numbers: one rank holding every stage, no NCCL messages.
    write_config "gpu1_$1" "$1" 2 1 "$GPU" "$GPT" 64 fp32 20
    if [ $crc -eq 0 ] && timeout 150 "$PF" train --config "$WORK/gpu1_$1.yaml" >"$WORK/gpu1_$1.log" 2>&1; then
      say "  instead, 1 rank with 2 stages on $GPU: $(compare "$WORK/out_cpu_$1/metrics.jsonl" "$WORK/out_gpu1_$1/metrics.jsonl")"
    else
      say "  1 rank with 2 stages on $GPU failed too: $(grep -i -m2 error "$WORK/gpu1_$1.log")"
    fi
    continue
  fi
  say "- $1: $(compare "$WORK/out_cpu_$1/metrics.jsonl" "$WORK/out_gpu_$1/metrics.jsonl") ($(( $(date +%s) - t )) s)"
  say "  GPU step s (last 5): $("$PYTHON" -c "import json,sys; print([round(json.loads(l)['step_s'],4) for l in open(sys.argv[1]) if 'step_s' in l][-5:])" "$WORK/out_gpu_$1/metrics.jsonl")"
done

# The local launcher (--nproc 2) on the CPU run of 1F1B: it crashed here once (exit 139).
timeout 120 "$PF" train --config "$WORK/cpu_1F1B.yaml" --nproc 2 >"$WORK/launcher.log" 2>&1
lrc=$?
say "- \`pipeforge train --nproc 2\` on the CPU: exit $lrc"
if [ $lrc -ne 0 ]; then
  grep -v "^frame #\|^\[W" "$WORK/launcher.log" | tail -8 | sed 's/^/    /' | tee -a "$R"; keep_log "$WORK/launcher.log"
fi
# A crash prints its stack (Note [Fatal signals]): our own frames, as
# "pipeforge(+0xOFFSET)", become functions and lines here.
resolve_stack() {  # LOG
  grep -q "pipeforge: fatal signal" "$1" || return 0
  say "  the crash's stack ($(grep -m1 'pipeforge: fatal signal' "$1" | cut -c1-160)):"
  grep -o "pipeforge(+0x[0-9a-f]*)" "$1" | grep -o "0x[0-9a-f]*" | head -24 |
    xargs -r addr2line -f -C -i -e "$PF" 2>&1 | paste - - | sed 's/^/    /' | tee -a "$R"
  grep "^/.*\[0x" "$1" | grep -v "pipeforge(+" | head -12 | sed 's/^/    /' | tee -a "$R"
}
resolve_stack "$WORK/launcher.log"

# --- 5. bf16 against fp32 on one GPU -------------------------------------------
say ""
BIG_LAYERS=${BIG_LAYERS:-12} BIG_DIM=${BIG_DIM:-1024}
say "## bf16 against fp32: a $BIG_LAYERS-block GPT (d=$BIG_DIM, T=256), 1 rank with 2 stages on $GPU, ZBVZeroBubble"
BIG="$WORK/gpt_big.pt"
"$PYTHON" - "$BIG" "$BIG_LAYERS" "$BIG_DIM" <<'PY' >"$WORK/big_model.log" 2>&1
import sys, torch
sys.path.insert(0, "tests/models")
import generate_zoo
torch.manual_seed(0)
m = generate_zoo.GPT(vocab=256, n_layer=int(sys.argv[2]), n_embd=int(sys.argv[3]), n_head=16, block_size=256)
print(sum(p.numel() for p in m.parameters()) / 1e6, "M parameters")
torch.jit.script(m).save(sys.argv[1])
PY
say "- model: $(grep -m1 'M parameters' "$WORK/big_model.log" || tail -3 "$WORK/big_model.log")"
for precision in fp32 bf16; do
  write_config "big_$precision" ZBVZeroBubble 2 1 "$GPU" "$BIG" 256 "$precision" 30
  t=$(date +%s)
  if timeout 240 "$PF" train --config "$WORK/big_$precision.yaml" >"$WORK/big_$precision.log" 2>&1; then
    say "- $precision: $("$PYTHON" - "$WORK/out_big_$precision/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
steps = [r["step_s"] for r in rows[5:]]
mem = max(r.get("max_memory_allocated_mib", float("nan")) for r in rows)
print(f"median step {1000 * statistics.median(steps):.1f} ms over {len(steps)} steps, "
      f"max_memory_allocated {mem:.0f} MiB, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
PY
) ($(( $(date +%s) - t )) s)"
  else
    say "- $precision: FAIL"; tail -8 "$WORK/big_$precision.log" | tee -a "$R"; keep_log "$WORK/big_$precision.log"
  fi
done
say ""
say "Done in $(elapsed)."
