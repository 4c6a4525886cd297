# srun: steps, outside and inside allocations.

#% srun-hostname
run srun -n1 hostname -s

#% srun-exit-code
run srun -n1 sh -c 'exit 3'

#% srun-two-tasks-label
run bash -c "srun -n2 -l sh -c 'echo task \$SLURM_PROCID' | sort"

#% srun-stdin-file
echo 'from a file' > in.txt; run srun -n1 cat < in.txt

#% srun-stdin-pipe
run bash -c "echo 'echo piped' | srun -n1 sh -s"

#% srun-inside-batch
submit -o out.txt --wrap 'srun -n1 echo step-output; echo rc=$?'; wait_end $id; cat out.txt

#% srun-step-env-inside-batch
submit -n2 -o out.txt --wrap 'srun -n1 sh -c "env | grep -E ^SLURM_STEP_ | sort"'; wait_end $id; cat out.txt

#% srun-unknown-option
run srun --no-such-option true

#% srun-missing-program
# Sorted: the task's error line and srun's line for its exit come from two sources, in either order on both.
srun -n1 /no/such/program 2> err.txt; echo "rc=$?"; sort err.txt

#% srun-too-many-gpus
run srun --gres=gpu:9 true

#% srun-output-file
run srun -n1 -o step.txt echo into-file; cat step.txt

#% srun-signal-forwarded-to-tasks
srun -n1 sh -c 'trap "echo task got USR1" USR1; for i in $(seq 30); do sleep 0.2; done; echo task finished' > out.txt 2>&1 &
# Sorted: the task's line and its shell's note on the killed sleep come in either order on both.
pid=$!; sleep 2.5; kill -USR1 $pid; wait $pid; echo "srun rc=$?"; sort out.txt

#% srun-job-name
run srun -n1 -J stepname sh -c 'echo $SLURM_JOB_NAME'

#% srun-ntasks-env
run bash -c "srun -n2 sh -c 'echo \$SLURM_NTASKS \$SLURM_NPROCS \$SLURM_STEP_NUM_TASKS' | sort"

#% srun-jobid-existing-allocation
submit --wrap 'sleep 30'; wait_state $id RUNNING; run srun --jobid=$id -n1 sh -c 'echo in \$SLURM_JOB_ID' ; echo

#% srun-bad-time
run srun -t abc true
