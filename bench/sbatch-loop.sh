#!/usr/bin/env bash
# Sequential `sbatch` invocations from a shell loop: Drover (through its sbatch shim, on a 3-replica local
# cluster) and, when a real Slurm is up on this machine (../shared/peers/slurm/setup.sh), Slurm's own sbatch,
# in the same run. Prints submits/s for each and the ratio, and the floor a sequential loop cannot beat at quorum
# durability on this machine: one start of the sbatch process (measured as `sbatch --version` in the same loop)
# plus one quorum commit (`drover-bench submit --clients 1`, p50, its own 3-replica cluster on the same machine).
#   usage: bench/sbatch-loop.sh [N]     (needs: cargo build --release)
set -euo pipefail
N=${1:-300}
cd "$(dirname "$0")/.."
DROVER=${DROVER:-$PWD/target/release/drover}
[ -x "$DROVER" ] || { echo "build first: cargo build --release" >&2; exit 1; }
WORK=$(mktemp -d /tmp/drover-sbatch-loop.XXXXXX)
trap '"$DROVER" local down --dir "$WORK/cluster" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

eval "$("$DROVER" local up --dir "$WORK/cluster" --controllers 3 2>/dev/null)"
export DROVER_CONTROLLERS
echo "drover: cluster at $DROVER_CONTROLLERS" >&2
"$DROVER" install-shims "$WORK/bin" >/dev/null
mkdir -p "$WORK/out"

loop() { # $1 = sbatch binary; the rest: its arguments (default: one trivial job)
  local t0 t1 bin=$1
  shift
  [ $# -gt 0 ] || set -- --parsable -o "$WORK/out/%j.out" --gres=gpu:1 --wrap=true
  t0=$(date +%s.%N)
  local failed=0
  for _ in $(seq "$N"); do "$bin" "$@" >/dev/null || failed=$((failed + 1)); done
  [ "$failed" -eq 0 ] || echo "$bin: $failed of $N calls failed" >&2
  t1=$(date +%s.%N)
  python3 -c "print(f'{$N/($t1-$t0):.0f}')"
}

# The floor's two parts, measured first so the loops below are not disturbed.
start_rate=$(loop "$WORK/bin/sbatch" --version)
BENCH=${BENCH:-$PWD/target/release/drover-bench}
commit_ms=$("$BENCH" submit --clients 1 --duration-s 4 --dir "$WORK/commit" 2>/dev/null | sed -n 's/.*clients= *1 .*p50= *\([0-9.]*\) ms.*/\1/p')
floor_rate=$(python3 -c "print(f'{1000/(1000/$start_rate + $commit_ms):.0f}')")
echo "floor:  $(python3 -c "print(f'{1000/$start_rate:.2f}')") ms to start sbatch + $commit_ms ms for one quorum commit (p50) = $floor_rate submits/s at most"

drover_rate=$(loop "$WORK/bin/sbatch")
echo "drover: $N sequential sbatch: $drover_rate submits/s (through the host's drover-relayd, as \`local up\` runs it)"
direct_rate=$(DROVER_RELAY_SOCKET= loop "$WORK/bin/sbatch")
echo "drover: $N sequential sbatch: $direct_rate submits/s (no relay: each sbatch connects to the leader itself)"
if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
  (cd "$WORK/out" && slurm_start=$(loop /usr/bin/sbatch --version) && slurm_rate=$(loop /usr/bin/sbatch) &&
    echo "slurm:  $N sequential sbatch: $slurm_rate submits/s ($slurm_start/s for /usr/bin/sbatch --version alone)" &&
    python3 -c "print(f'ratio drover/slurm: {$drover_rate/$slurm_rate:.2f}x; drover/floor: {$drover_rate/$floor_rate:.2f}, slurm/floor: {$slurm_rate/$floor_rate:.2f}')")
  scancel -u "$(id -un)" >/dev/null 2>&1 || true
else
  echo "slurm: not running here (start it with ../shared/peers/slurm/setup.sh for the side-by-side figure)"
fi
