# sbatch: what bad input gets (messages a user reads, exit codes scripts test).

#% sbatch-error-unknown-option
run sbatch --no-such-option --wrap true

#% sbatch-error-bad-time
run sbatch -t abc --wrap true

#% sbatch-error-bad-nodes
run sbatch -N two --wrap true

#% sbatch-error-unknown-partition
run sbatch -p nosuch --wrap true

#% sbatch-error-missing-script
run sbatch does-not-exist.sh

#% sbatch-error-no-shebang
printf 'echo hi\n' > job.sh; run sbatch job.sh

#% sbatch-error-empty-script
: > job.sh; run sbatch job.sh

#% sbatch-error-too-many-gpus
run sbatch --gres=gpu:9 --wrap true

#% sbatch-error-too-many-nodes
run sbatch -N 2 --wrap true

#% sbatch-error-bad-gres
run sbatch --gres=gpu:x --wrap true

#% sbatch-error-bad-array
run sbatch --array=5-1 --wrap true

#% sbatch-error-bad-dependency
run sbatch --dependency=afterok:notanumber --wrap true

#% sbatch-error-dependency-on-unknown-job
run sbatch --dependency=afterok:999999 --wrap true

#% sbatch-error-bad-signal
run sbatch --signal=NOPE --wrap true

#% sbatch-error-wrap-and-script
printf '#!/bin/bash\ntrue\n' > job.sh; run sbatch --wrap true job.sh

#% sbatch-error-bad-sbatch-line
printf '#!/bin/bash\n#SBATCH --nodes=two\ntrue\n' > job.sh; run sbatch job.sh

#% sbatch-error-bad-mem
run sbatch --mem=lots --wrap true

#% sbatch-error-time-over-partition-limit
submit -p debug -t 20 --wrap true; echo "id set: ${id:+yes}"; [ -n "$id" ] && keys $id JobState Reason

#% sbatch-error-bad-begin
run sbatch --begin=notatime --wrap true

#% sbatch-error-bad-cpus
run sbatch -c 0 --wrap true

#% sbatch-error-bad-ntasks
run sbatch -n -1 --wrap true

#% sbatch-error-more-cpus-than-node
run sbatch -c 65 --wrap true

#% sbatch-error-bad-gpu-freq
run sbatch --gpu-freq=HIGH --wrap true
