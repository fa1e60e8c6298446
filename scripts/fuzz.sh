#!/usr/bin/env bash
# Fuzzes Pipeforge's text readers with libFuzzer (issue 12): pipe.json, split
# specs, training configs, schedule CSV, actions, safetensors files, zip
# directories (the .pt2 records a split copies), and the
# .pt2 JSON reader and importer (fuzz/, README there).
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]     default 60; 0 builds and replays only
#
# Installs clang with libFuzzer when missing (quiet, idempotent), builds the
# targets with clang into build-fuzz/ (never part of the main g++ build),
# replays fuzz/regressions/<target>/* and the seed corpora, then runs each
# target for SECONDS_PER_TARGET seconds, one per core at a time
# (PIPEFORGE_FUZZ_PARALLEL sets how many). The corpus a run grows
# is kept in build-fuzz/corpus/<target>/ for the next run.
# Prints executions, exec/s and coverage per target; exits 1 on any crash, hang,
# memory blow-up or undocumented exception and names the reproducer, which
# replays with: build-fuzz/fuzz_<target> <reproducer>
#
# pt2_json links LibTorch from .venv's torch wheel; without one it is skipped
# with a message (it is built once .venv has torch and build-fuzz/ is removed).
#
# Environment: PIPEFORGE_FUZZ_TARGETS="manifest action" runs only those targets;
# PIPEFORGE_FUZZ_JOBS sets the build's parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]]; then
  echo "usage: bash scripts/fuzz.sh [SECONDS_PER_TARGET]  (a whole number of seconds, default 60)" >&2
  exit 2
fi
read -r -a TARGETS <<< "${PIPEFORGE_FUZZ_TARGETS:-manifest split_spec train_config schedule_csv action safetensors zip_directory pt2_json}"
BUILD=build-fuzz
JOBS=${PIPEFORGE_FUZZ_JOBS:-$(nproc)}
started=$SECONDS

# --- clang with libFuzzer, and the readers' libraries ---------------------------
fuzzer_works() {
  command -v clang++ >/dev/null 2>&1 || return 1
  local probe
  probe=$(mktemp -d)
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
    > "$probe/probe.cpp"
  clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" >/dev/null 2>&1
  local rc=$?
  rm -rf "$probe"
  return $rc
}

PACKAGES=(clang libclang-rt-dev cmake ninja-build libyaml-cpp-dev libfmt-dev nlohmann-json3-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "pipeforge fuzz: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! fuzzer_works; then
  echo "pipeforge fuzz: clang++ cannot link -fsanitize=fuzzer,address,undefined; install clang and its" \
       "runtime (Debian: apt-get install clang libclang-rt-dev)" >&2
  exit 1
fi

# --- build ------------------------------------------------------------------------
# Cache hits across clones, as scripts/build.sh (CI builds a fresh clone on the same machine).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
if [ ! -f "$BUILD/build.ninja" ]; then
  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE= "${launcher[@]}" \
    > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log" >&2; exit 1; }
  mv "$BUILD.configure.log" "$BUILD/configure.log"
fi
if ! ninja -C "$BUILD" -j "$JOBS" > "$BUILD/build.log" 2>&1; then
  tail -n 40 "$BUILD/build.log" >&2
  echo "pipeforge fuzz: the build failed; the full log is $BUILD/build.log" >&2
  exit 1
fi
# fuzz/CMakeLists.txt leaves a target out, saying why in fuzz_<target>.skipped,
# when what it links is missing (pt2_json without torch).
built=()
for t in "${TARGETS[@]}"; do
  if [ ! -x "$BUILD/fuzz_$t" ] && [ -f "$BUILD/fuzz_$t.skipped" ]; then
    echo "pipeforge fuzz: skipping $t: $(cat "$BUILD/fuzz_$t.skipped")" >&2
    continue
  fi
  built+=("$t")
done
TARGETS=("${built[@]}")
[ ${#TARGETS[@]} -gt 0 ] || { echo "pipeforge fuzz: every target asked for was skipped; nothing to run"; exit 0; }
echo "pipeforge fuzz: built ${#TARGETS[@]} targets in $BUILD/ ($((SECONDS - started)) s)"

# --- seed corpora: fuzz/corpus plus the repository's real files -----------------------
refresh_seeds() {
  local t=$1 dir="$BUILD/seeds/$1"
  rm -rf "$dir"
  mkdir -p "$dir" "$BUILD/corpus/$t" "$BUILD/artifacts/$t" "$BUILD/logs"
  cp fuzz/corpus/"$t"/* "$dir"/
  case "$t" in
    split_spec)
      for f in configs/split_*.yaml; do cp "$f" "$dir/repo_$(basename "$f")"; done ;;
    train_config)
      # The repository's configs, pointed at the files the target's scratch folder holds.
      for f in configs/*.yaml; do
        grep -q '^model:' "$f" || continue
        sed -e 's#^\(  *path:\) build/zoo/[^ ]*#\1 model.pt#' -e 's#^\(  *path:\) /[^ ]*#\1 data.bin#' \
          "$f" > "$dir/repo_$(basename "$f")"
      done ;;
    schedule_csv)
      for f in tests/schedules/golden/*.csv; do cp "$f" "$dir/repo_$(basename "$f")"; done ;;
  esac
}

# libFuzzer writes the crashing input to $BUILD/artifacts/<target>/; abort on the first UBSan finding.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
COMMON_FLAGS=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
# Longest input libFuzzer makes: the seeds of pt2_json (whole exported programs) run to 16 KB.
max_len_of() { case "$1" in pt2_json) echo 65536 ;; *) echo 8192 ;; esac; }
failures=()

report_crash() {
  local t=$1 log=$2 what=$3
  local reproducer
  reproducer=$(grep -o 'Test unit written to [^ ]*' "$log" | tail -n 1 | sed 's/Test unit written to //' || true)
  echo "pipeforge fuzz: $t: $what FAILED; log $log" >&2
  grep -E '==pipeforge-fuzz==|^SUMMARY|ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:' \
    "$log" | head -n 8 >&2 || true
  if [ -n "$reproducer" ]; then
    echo "pipeforge fuzz: $t: reproducer $reproducer (replay: $BUILD/fuzz_$t $reproducer)" >&2
    failures+=("$t: $reproducer")
  else
    failures+=("$t: $what failed, see $log")
  fi
}

# --- replay: regressions and seeds must pass before fuzzing -------------------------------
for t in "${TARGETS[@]}"; do
  [ -x "$BUILD/fuzz_$t" ] || { echo "pipeforge fuzz: no target '$t' (see fuzz/CMakeLists.txt)" >&2; exit 2; }
  refresh_seeds "$t"
  log="$BUILD/logs/$t.replay.log"
  inputs=("$BUILD/seeds/$t")
  if [ -d "fuzz/regressions/$t" ] && [ -n "$(ls -A "fuzz/regressions/$t")" ]; then
    inputs+=("fuzz/regressions/$t")
  fi
  if ! "$BUILD/fuzz_$t" -runs=0 "${COMMON_FLAGS[@]}" -max_len="$(max_len_of "$t")" -artifact_prefix="$BUILD/artifacts/$t/" "${inputs[@]}" \
      < /dev/null > "$log" 2>&1; then
    report_crash "$t" "$log" "replay of ${inputs[*]}"
  fi
done
if [ ${#failures[@]} -gt 0 ]; then
  printf 'pipeforge fuzz: replay failed:\n' >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "pipeforge fuzz: replayed the seeds and fuzz/regressions/ of ${#TARGETS[@]} targets"
[ "$SECONDS_PER_TARGET" -eq 0 ] && exit 0

# --- fuzz, one target per core at a time ------------------------------------------------
# Each fuzzer is one process on one core: the targets run PARALLEL at a time
# (default: the cores), each for SECONDS_PER_TARGET, so a 2-core CI spends half
# the wall time on the same fuzzing.
stat_of() { grep -o "^stat::$1: *[0-9]*" "$2" | tail -n 1 | grep -o '[0-9]*$' || echo "?"; }
PARALLEL=${PIPEFORGE_FUZZ_PARALLEL:-$(nproc)}
fuzz_one() {  # TARGET; its exit status goes to logs/TARGET.rc
  local t=$1 rc=0
  "$BUILD/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" "${COMMON_FLAGS[@]}" -max_len="$(max_len_of "$t")" \
    -dict="fuzz/dict/$t.dict" \
    -artifact_prefix="$BUILD/artifacts/$t/" "$BUILD/corpus/$t" "$BUILD/seeds/$t" < /dev/null \
    > "$BUILD/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" > "$BUILD/logs/$t.rc"
}
summary=()
batches=()
for ((i = 0; i < ${#TARGETS[@]}; i += PARALLEL)); do batches+=("${TARGETS[*]:i:PARALLEL}"); done
for batch in "${batches[@]}"; do
  read -r -a running <<< "$batch"
  echo "pipeforge fuzz: ${running[*]} for ${SECONDS_PER_TARGET} s ..."
  for t in "${running[@]}"; do
    rm -f "$BUILD/logs/$t.rc"
    fuzz_one "$t" &
  done
  wait
  for t in "${running[@]}"; do
    log="$BUILD/logs/$t.log"
    rc=$(cat "$BUILD/logs/$t.rc" 2>/dev/null || echo 1)
    execs=$(stat_of number_of_executed_units "$log")
    rate=$(stat_of average_exec_per_sec "$log")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 || true)
    corpus=$(find "$BUILD/corpus/$t" -type f | wc -l)
    line=$(printf '%-13s %10s execs %7s exec/s  %-22s corpus %s' "$t" "$execs" "$rate" "${cov:-cov: ?}" "$corpus")
    if [ "$rc" -ne 0 ]; then
      line+="  CRASH"
      report_crash "$t" "$log" "fuzzing"
    fi
    echo "  $line"
    summary+=("$line")
  done
done

echo "pipeforge fuzz: ${SECONDS_PER_TARGET} s per target, $((SECONDS - started)) s in all"
printf '  %s\n' "${summary[@]}"
if [ ${#failures[@]} -gt 0 ]; then
  printf 'pipeforge fuzz: %d target(s) failed:\n' "${#failures[@]}" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
