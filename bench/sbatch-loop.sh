#!/usr/bin/env bash
# Sequential `sbatch` invocations from a shell loop: Drover (through its sbatch shim, on a 3-replica local
# cluster) and, when a real Slurm is up on this machine (../shared/peers/slurm/setup.sh), Slurm's own sbatch,
# in the same run. Prints submits/s for each and the ratio.
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

loop() { # $1 = sbatch binary
  local t0 t1
  t0=$(date +%s.%N)
  local failed=0
  for _ in $(seq "$N"); do "$1" --parsable -o "$WORK/out/%j.out" --gres=gpu:1 --wrap=true >/dev/null || failed=$((failed + 1)); done
  [ "$failed" -eq 0 ] || echo "$1: $failed of $N submissions failed" >&2
  t1=$(date +%s.%N)
  python3 -c "print(f'{$N/($t1-$t0):.0f}')"
}

drover_rate=$(loop "$WORK/bin/sbatch")
echo "drover: $N sequential sbatch: $drover_rate submits/s (through the host's drover-relayd, as \`local up\` runs it)"
direct_rate=$(DROVER_RELAY_SOCKET= loop "$WORK/bin/sbatch")
echo "drover: $N sequential sbatch: $direct_rate submits/s (no relay: each sbatch connects to the leader itself)"
if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
  (cd "$WORK/out" && slurm_rate=$(loop /usr/bin/sbatch) && echo "slurm:  $N sequential sbatch: $slurm_rate submits/s" &&
    python3 -c "print(f'ratio drover/slurm: {$drover_rate/$slurm_rate:.1f}x')")
  scancel -u "$(id -un)" >/dev/null 2>&1 || true
else
  echo "slurm: not running here (start it with ../shared/peers/slurm/setup.sh for the side-by-side figure)"
fi
