# The environment a batch script and its steps see.

#% env-batch-slurm-variables
submit -o out.txt --wrap 'env | grep ^SLURM_ | grep -v -e ^SLURM_CONF= -e ^SLURM_TASK_PID= -e ^SLURM_WORKING_CLUSTER= -e ^SLURM_JOB_UID= -e ^SLURM_JOB_GID= | sort'; wait_end $id; cat out.txt

#% env-batch-with-gpus
submit --gres=gpu:2 -c 4 -o out.txt --wrap 'env | grep -E "^(SLURM_(CPUS|GPUS|JOB_GPUS|JOB_CPUS|TASKS|NTASKS|NPROCS)|CUDA_VISIBLE_DEVICES)" | sort'; wait_end $id; cat out.txt

#% env-batch-ntasks-asked
submit -n 4 -o out.txt --wrap 'env | grep -E "^SLURM_(NTASKS|NPROCS|TASKS_PER_NODE|CPUS_ON_NODE|JOB_CPUS_PER_NODE)=" | sort'; wait_end $id; cat out.txt

#% env-batch-job-name-asked
submit -J asked -o out.txt --wrap 'echo $SLURM_JOB_NAME'; wait_end $id; cat out.txt

#% env-export-none
FOO=bar sbatch --parsable --export=NONE -o out.txt --wrap 'echo "FOO=$FOO HOME=$HOME USER=$USER EXPORT=$SLURM_EXPORT_ENV"' > id.txt; id=$(cat id.txt); wait_end $id; cat out.txt

#% env-export-all-default
FOO=bar sbatch --parsable -o out.txt --wrap 'echo "FOO=$FOO EXPORT=${SLURM_EXPORT_ENV-unset}"' > id.txt; id=$(cat id.txt); wait_end $id; cat out.txt

#% env-export-list
FOO=bar BAZ=qux sbatch --parsable --export=FOO,X=1 -o out.txt --wrap 'echo "FOO=$FOO BAZ=$BAZ X=$X EXPORT=$SLURM_EXPORT_ENV"' > id.txt; id=$(cat id.txt); wait_end $id; cat out.txt

#% env-export-all-plus-list
FOO=bar sbatch --parsable --export=ALL,X=1 -o out.txt --wrap 'echo "FOO=$FOO X=$X EXPORT=$SLURM_EXPORT_ENV"' > id.txt; id=$(cat id.txt); wait_end $id; cat out.txt

#% env-submit-dir-and-host
submit -o out.txt --wrap 'echo "$SLURM_SUBMIT_DIR" "$SLURM_SUBMIT_HOST"; pwd'; wait_end $id; cat out.txt

#% env-restart-count-absent-first
submit -o out.txt --wrap 'echo "restarts=${SLURM_RESTART_COUNT-unset}"'; wait_end $id; cat out.txt

#% env-step-variables
submit -n 2 -o out.txt --wrap 'srun -n2 sh -c "echo \$SLURM_PROCID \$SLURM_LOCALID \$SLURM_STEP_ID \$SLURM_STEPID \$SLURM_STEP_NUM_TASKS \$SLURM_STEP_NODELIST" | sort'; wait_end $id; cat out.txt

#% env-step-names
submit -n 1 -o out.txt --wrap 'srun -n1 sh -c "env | grep ^SLURM_ | cut -d= -f1 | sort"'; wait_end $id; cat out.txt

#% env-array-variables
submit --array=2-4:2 -o 'out-%a.txt' --wrap 'env | grep ^SLURM_ARRAY | sort'; wait_end $id; sleep 1; for i in 2 4; do wait_file out-$i.txt; echo "-- $i"; sed "s/=$id\$/=ID/" out-$i.txt; done

#% env-batch-names-only
submit -o out.txt --wrap 'env | grep ^SLURM_ | cut -d= -f1 | sort'; wait_end $id; cat out.txt
