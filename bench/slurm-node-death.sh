#!/usr/bin/env bash
# The peer side of `drover-bench requeue`: on real Slurm (../shared/peers/slurm/setup.sh), a running requeue-able
# job's node dies (slurmd and the job's processes SIGKILLed). Measures how long until Slurm has even requeued the
# job (its node declared DOWN after SlurmdTimeout): a lower bound for "running elsewhere", which the peer's single
# node cannot show. The peer is configured with SlurmdTimeout=30; Slurm's default is 300.
#   usage: bench/slurm-node-death.sh   (as root, with the peer up)
set -euo pipefail
id=$(sbatch --parsable --requeue -o /tmp/slurm-out/death-%j.out --gres=gpu:1 --wrap="sleep 3600")
for _ in $(seq 300); do [ "$(squeue -h -j "$id" -o %T)" = RUNNING ] && break; sleep 0.1; done
t0=$(date +%s.%N)
pkill -9 -x slurmd || true
pkill -9 -f slurmstepd || true
pkill -9 -f "sleep 3600" || true
state=""
while true; do
  state=$(squeue -h -j "$id" -o %T 2>/dev/null || true)
  case "$state" in PENDING|REQUEUED|REQUEUE_FED|REQUEUE_HOLD|NODE_FAIL|"") break ;; esac
  sleep 0.2
  if python3 -c "import sys,time; sys.exit(0 if time.time()-$t0 < 900 else 1)"; then :; else break; fi
done
t1=$(date +%s.%N)
python3 -c "print(f'slurm: node killed -> job {\"$id\"} {\"$state\" or \"gone\"} after {$t1-$t0:.1f} s (SlurmdTimeout=30)')"
scancel "$id" 2>/dev/null || true
/usr/sbin/slurmd 2>/dev/null || true
