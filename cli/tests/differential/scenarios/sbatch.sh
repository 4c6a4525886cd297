# sbatch: submission, scripts, #SBATCH lines, output files.

#% sbatch-submit-says-the-id
run sbatch --wrap true

#% sbatch-parsable
run sbatch --parsable --wrap true

#% sbatch-script-file-output
printf '#!/bin/bash\necho hello from the script\n' > job.sh
submit job.sh; wait_end $id; cat slurm-$id.out

#% sbatch-script-on-stdin
submit <<'S'
#!/bin/bash
echo from stdin
S
wait_end $id; cat slurm-$id.out

#% sbatch-job-name-from-sbatch-line
printf '#!/bin/bash\n#SBATCH -J fromscript\necho $SLURM_JOB_NAME\n' > job.sh
submit job.sh; wait_end $id; cat slurm-$id.out; keys $id JobName

#% sbatch-command-line-beats-sbatch-line
printf '#!/bin/bash\n#SBATCH -J fromscript\necho $SLURM_JOB_NAME\n' > job.sh
submit -J fromcli job.sh; wait_end $id; cat slurm-$id.out

#% sbatch-lines-after-first-command-are-ignored
printf '#!/bin/bash\necho first\n#SBATCH -J late\n' > job.sh
submit job.sh; wait_end $id; keys $id JobName

#% sbatch-default-job-name-is-script-name
printf '#!/bin/bash\ntrue\n' > myjob.sh
submit myjob.sh; keys $id JobName

#% sbatch-wrap-job-name
submit --wrap true; keys $id JobName

#% sbatch-output-pattern-x-j
submit -J named -o '%x-%j.log' --wrap 'echo out'; wait_end $id; ls *.log | sed "s/$id/ID/"; cat named-$id.log

#% sbatch-error-file-separate
submit -o out.txt -e err.txt --wrap 'echo to-out; echo to-err >&2'; wait_end $id; cat out.txt; cat err.txt

#% sbatch-output-and-error-same-file
submit -o both.txt --wrap 'echo to-out; echo to-err >&2'; wait_end $id; sort both.txt

#% sbatch-output-pattern-padded
submit -o 'o-%8j.txt' --wrap true; wait_end $id; ls o-*.txt

#% sbatch-output-pattern-node-and-user
submit -o 'o-%N-%u.txt' --wrap true; wait_end $id; ls o-*.txt

#% sbatch-output-percent-escape
submit -o 'o-%%-%j.txt' --wrap true; wait_end $id; ls o-*.txt | sed "s/$id/ID/"

#% sbatch-chdir
mkdir sub; submit -D sub --wrap pwd; wait_end $id; cat sub/slurm-$id.out

#% sbatch-open-mode-append
echo old > out.txt; submit -o out.txt --open-mode=append --wrap 'echo new'; wait_end $id; cat out.txt

#% sbatch-truncates-by-default
echo old > out.txt; submit -o out.txt --wrap 'echo new'; wait_end $id; cat out.txt

#% sbatch-exit-code-of-failed-script
submit --wrap 'exit 3'; wait_end $id; keys $id JobState ExitCode

#% sbatch-exit-code-of-completed-script
submit --wrap 'exit 0'; wait_end $id; keys $id JobState ExitCode Restarts

#% sbatch-wrap-runs-under-sh
submit --wrap 'readlink /proc/$$/exe'; wait_end $id; cat slurm-$id.out

#% sbatch-script-arguments
printf '#!/bin/bash\necho "args: $*"\n' > job.sh
submit job.sh one "two three"; wait_end $id; cat slurm-$id.out

#% sbatch-wait-success
run sbatch --wait --wrap true

#% sbatch-wait-failure-exit-code
run sbatch --wait --wrap 'exit 7'

#% sbatch-hold-then-release
submit --hold --wrap true; keys $id JobState Reason Priority
run scontrol release $id; wait_end $id

#% sbatch-env-job-name
SBATCH_JOB_NAME=fromenv sbatch --parsable --wrap true > id.txt; id=$(cat id.txt); keys $id JobName

#% sbatch-env-beats-script
printf '#!/bin/bash\n#SBATCH -J fromscript\ntrue\n' > job.sh
SBATCH_JOB_NAME=fromenv sbatch --parsable job.sh > id.txt; id=$(cat id.txt); keys $id JobName

#% sbatch-time-limit-shown
submit -t 90 --wrap true; keys $id TimeLimit

#% sbatch-time-limit-day-form
submit --hold -t 1-2:3 --wrap true; keys $id TimeLimit

#% sbatch-time-limit-seconds-form
submit --hold -t 0:30 --wrap true; keys $id TimeLimit

#% sbatch-gres-tres
submit --hold --gres=gpu:2 -c 4 --wrap true; keys $id NumCPUs TRES

#% sbatch-partition-choice
submit --hold -p debug --wrap true; keys $id Partition TimeLimit

#% sbatch-comment-and-name
submit --hold --comment=hello -J n1 --wrap true; keys $id JobName Comment

#% sbatch-nice
submit --hold --nice=10 --wrap true; keys $id Nice

#% sbatch-requeue-flag
submit --hold --no-requeue --wrap true; keys $id Requeue
submit --hold --requeue --wrap true; keys $id Requeue

#% sbatch-begin-in-future
submit --begin=now+1hour --wrap true; keys $id JobState Reason

#% sbatch-exclusive
submit --hold --exclusive --wrap true; keys $id OverSubscribe

#% sbatch-version
run sbatch --version

#% sbatch-usage
sbatch --usage >/dev/null 2>&1; echo "rc=$?"

#% sbatch-help
sbatch --help >/dev/null 2>&1; echo "rc=$?"

#% sbatch-gpu-freq
submit --gpu-freq=medium,memory=high -o out.txt --wrap 'echo "freq: $SLURM_GPU_FREQ"'; wait_end $id; cat out.txt; keys $id TresFreq

#% sbatch-gpu-freq-env
SBATCH_GPU_FREQ=450 submit -o out.txt --wrap 'echo "freq: $SLURM_GPU_FREQ"'; wait_end $id; cat out.txt; keys $id TresFreq
