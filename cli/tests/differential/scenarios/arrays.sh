# Job arrays.

#% array-submit-line
run sbatch --array=0-3 --hold --wrap true

#% array-all-tasks-run
submit --array=1-3 -o 'o-%A-%a.txt' --wrap 'echo task $SLURM_ARRAY_TASK_ID'; for t in 1 2 3; do wait_end ${id}_$t; done; sleep 0.5; cat o-$id-*.txt | sort

#% array-step-list
submit --hold --array=1,5,9 --wrap true; run squeue -h -r -o '%i'

#% array-step-range
submit --hold --array=0-10:5 --wrap true; run squeue -h -r -o '%i'

#% array-throttle
submit --hold --array=0-7%2 --wrap true; keys $id ArrayTaskThrottle ArrayTaskId

#% array-task-show
submit --hold --array=0-2 --wrap true; run bash -c "scontrol show job ${id}_1 -o | tr ' ' '\n' | grep -E '^(ArrayJobId|ArrayTaskId|JobState)='"

#% array-cancel-one-task-state
submit --hold --array=0-2 --wrap true; run scancel ${id}_1; sleep 0.5; run squeue -h -o '%i %t'

#% array-output-default-name
submit --array=0-1 --wrap 'echo hi'; wait_end ${id}_0; wait_end ${id}_1; sleep 0.5; ls slurm-*.out | sed "s/$id/ID/g"

#% array-too-large
run sbatch --array=0-100000 --wrap true

#% array-bad-throttle
run sbatch --array=0-3%x --wrap true
