#!/usr/bin/env bash
# One-command latency: the p50 of N separate `sbatch --wrap true` and `squeue -h -j 1` processes, against a
# 3-replica local Drover cluster (mutual TLS and credentials included, as every real invocation pays them) and,
# when a real Slurm is up on this machine (../shared/peers/slurm/setup.sh), against Slurm in the same run.
# DROVER=path compares another build (e.g. an older one) the same way.
#   usage: bench/command-latency.sh [N]     (needs: cargo build --release)
set -euo pipefail
N=${1:-40}
cd "$(dirname "$0")/.."
DROVER=${DROVER:-$PWD/target/release/drover}
[ -x "$DROVER" ] || { echo "build first: cargo build --release" >&2; exit 1; }
WORK=$(mktemp -d /tmp/drover-latency.XXXXXX)
trap '"$DROVER" local down --dir "$WORK/cluster" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

eval "$("$DROVER" local up --dir "$WORK/cluster" --controllers 3 --agents 1 2>/dev/null)"
export DROVER_CONTROLLERS
"$DROVER" install-shims "$WORK/bin" >/dev/null
sleep 2

p50() { # $1 = label, $2 = sbatch, $3 = squeue
  python3 - "$N" "$@" <<'PY'
import statistics, subprocess, sys, time
n, label, sbatch, squeue = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def median_ms(args):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(args, stdout=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)
job = subprocess.run([sbatch, "--parsable", "--wrap", "true", "-o", "/dev/null"], capture_output=True, text=True,
                     check=True).stdout.strip().split(";")[0]
submit = median_ms([sbatch, "--wrap", "true", "-o", "/dev/null"])
query = median_ms([squeue, "-h", "-j", job])
print(f"{label}: sbatch p50 {submit:.1f} ms, squeue p50 {query:.1f} ms ({n} runs each)")
PY
}

p50 drover "$WORK/bin/sbatch" "$WORK/bin/squeue"
if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
  p50 slurm "$(command -v sbatch)" "$(command -v squeue)"
fi
