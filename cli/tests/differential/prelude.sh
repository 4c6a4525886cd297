# Helpers every scenario starts with (tests/differential.rs puts this file before the scenario's body). They
# print only what a user would see, in a form both systems can be compared on.

# run CMD ARGS...: the command line, its stdout, its stderr (each line after "! ") and its exit code.
run() {
  local o e rc
  o=$(mktemp) e=$(mktemp)
  "$@" >"$o" 2>"$e"
  rc=$?
  echo "\$ $*"
  cat "$o"
  sed 's/^/! /' "$e"
  echo "[rc=$rc]"
  rm -f "$o" "$e"
  return 0
}

# salloc_run ARGS...: as `run salloc ARGS...`, less one line. Slurm's salloc sometimes adds `salloc: Job allocation N
# has been revoked.` after a command that ends at once, by whether the controller's job-complete message overtakes
# salloc's own release (CI saw it in one run of a few): a race inside Slurm, not behaviour a script can rely on.
salloc_run() {
  local o e rc
  o=$(mktemp) e=$(mktemp)
  salloc "$@" >"$o" 2>"$e"
  rc=$?
  echo "\$ salloc $*"
  cat "$o"
  grep -v '^salloc: Job allocation [0-9]* has been revoked\.$' "$e" | sed 's/^/! /'
  echo "[rc=$rc]"
  rm -f "$o" "$e"
  return 0
}

# quiet CMD ARGS...: runs it, showing only the exit code (for commands whose output is not the point).
quiet() {
  "$@" >/dev/null 2>&1
  echo "[$1 rc=$?]"
}

# submit ARGS...: sbatch --parsable; prints nothing, sets $id to the new job's id.
submit() {
  id=$(sbatch --parsable "$@" 2>/dev/null | cut -d';' -f1)
}

# state ID: the job's state as scontrol shows it (empty once Slurm has forgotten the job).
state() {
  scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -1 | cut -d= -f2
}

# wait_state ID "STATE..." [TENTHS]: waits until the job is in one of the states; prints the state reached.
wait_state() {
  local s i
  for i in $(seq 1 "${3:-300}"); do
    s=$(state "$1")
    case " $2 " in *" $s "*) echo "state: $s"; return 0 ;; esac
    sleep 0.1
  done
  echo "state: still $s (waited for $2)"
  return 1
}

ENDED="COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY PREEMPTED BOOT_FAIL DEADLINE"

# wait_end ID: waits until the job has ended; prints its final state.
wait_end() { wait_state "$1" "$ENDED" "${2:-300}"; }

# wait_reason ID REASON [TENTHS]: waits until the job's Reason is REASON (Slurm judges some in its periodic pass).
wait_reason() {
  local i
  for i in $(seq 1 "${3:-600}"); do
    scontrol show job -o "$1" 2>/dev/null | grep -q " Reason=$2 " && return 0
    sleep 0.1
  done
  echo "reason never became $2"
}

# keys ID KEY...: the named fields of `scontrol show job -o ID`, one per line.
keys() {
  local line k
  line=$(scontrol show job -o "$1" 2>&1)
  shift
  for k in "$@"; do
    echo "$line" | tr ' ' '\n' | grep "^$k=" || echo "$k: (absent)"
  done
}

# wait_file FILE [TENTHS]: waits until the file exists and has stopped growing for a moment.
wait_file() {
  local i
  for i in $(seq 1 "${2:-100}"); do
    [ -s "$1" ] && { sleep 0.3; return 0; }
    sleep 0.1
  done
  echo "no file $1"
}

# slurm_env: the SLURM_* variables of the calling task, one per line, sorted; values that are the same on
# both systems by construction are kept, the rest by name only (see the list).
slurm_env() {
  env | grep '^SLURM_' | grep -v '^SLURM_CONF=' | sort | while IFS='=' read -r k v; do
    case "$k" in
      SLURM_TASK_PID|SLURM_WORKING_CLUSTER|SLURM_JOB_UID|SLURM_JOB_GID|SLURM_SRUN_COMM_PORT|SLURM_STEP_LAUNCHER_PORT|SLURM_LAUNCH_NODE_IPADDR|SLURM_SRUN_COMM_HOST|SLURM_UMASK)
        echo "$k=..." ;;
      *) echo "$k=$v" ;;
    esac
  done
}
