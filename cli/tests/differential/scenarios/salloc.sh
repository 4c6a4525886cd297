# salloc.

#% salloc-runs-command
salloc_run -n1 sh -c 'echo in allocation $SLURM_JOB_NUM_NODES'

#% salloc-exit-code
salloc_run -n1 sh -c 'exit 4'

#% salloc-srun-inside
run bash -c "salloc -n2 srun -l sh -c 'echo hello' 2>/dev/null | sort"

#% salloc-batchflag
salloc -n1 sh -c 'scontrol show job -o $SLURM_JOB_ID | tr " " "\n" | grep -E "^BatchFlag="' 2>/dev/null

#% salloc-impossible
run salloc --gres=gpu:9 true
