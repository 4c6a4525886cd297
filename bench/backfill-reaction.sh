#!/bin/bash
# Backfill reaction time, through Slurm's own commands, so the same script measures Drover and real Slurm.
# One node with 8 GPUs: J1 holds 6 GPUs for 2 min; J2 wants all 8 (it waits, with a reservation at J1's end);
# J3 wants 2 GPUs for 30 s (it fits before J2's reserved start: backfill may start it now); J4 wants 2 GPUs for
# 10 min (it would delay J2: it must wait). Prints how long J3 took to start after its submission, and J4's state.
# Usage: PATH=<dir with sbatch/squeue/scancel>:$PATH bench/backfill-reaction.sh [LABEL]
set -u
label=${1:-cluster}
s() { sbatch --parsable -o /dev/null "$@" | cut -d';' -f1; }
state() { squeue -h -j "$1" -o %T 2>/dev/null; }
j1=$(s --gres=gpu:6 -t 2:00 --wrap='sleep 100')
for _ in $(seq 100); do [ "$(state "$j1")" = RUNNING ] && break; sleep 0.1; done
j2=$(s --gres=gpu:8 -t 5:00 --wrap='sleep 1')
t0=$(date +%s.%N)
j3=$(s --gres=gpu:2 -t 0:30 --wrap='sleep 20')
j4=$(s --gres=gpu:2 -t 10:00 --wrap='sleep 20')
started=""
for _ in $(seq 800); do  # at most 40 s, every 50 ms
  if [ "$(state "$j3")" = RUNNING ]; then started=$(date +%s.%N); break; fi
  sleep 0.05
done
j4_state=$(state "$j4")
scancel "$j1" "$j2" "$j3" "$j4"
if [ -n "$started" ]; then
  python3 -c "print(f'$label: backfilled J3 RUNNING {($started - $t0) * 1000:.0f} ms after its submission; J4 (would delay J2): $j4_state')"
else
  echo "$label: J3 not started within 40 s; J4: $j4_state"
fi
