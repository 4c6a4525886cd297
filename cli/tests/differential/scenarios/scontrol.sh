# scontrol: show, hold/release, update, requeue.

#% scontrol-show-job-pending
submit --hold -J show --wrap true; keys $id JobName JobState Reason Priority Dependency Requeue Restarts BatchFlag TimeLimit Partition NumNodes NumCPUs NumTasks

#% scontrol-show-job-completed
submit --wrap true; wait_end $id; keys $id JobState Reason ExitCode Restarts BatchFlag NodeList

#% scontrol-show-job-unknown
run scontrol show job 999999

#% scontrol-show-node
run bash -c "scontrol show node node01 | tr ' ' '\n' | grep -E '^(NodeName|CPUTot|Gres|Partitions|State)='"

#% scontrol-show-partition
run bash -c "scontrol show partition gpu | tr ' ' '\n' | grep -E '^(PartitionName|Default|MaxTime|State|Nodes)='"

#% scontrol-show-partition-unknown
run scontrol show partition nosuch

#% scontrol-show-hostnames
run scontrol show hostnames 'gpu[01-03],login'

#% scontrol-show-hostlist
run scontrol show hostlist gpu01,gpu02,gpu03,login

#% scontrol-hold-release-pending
submit --wrap true --begin=now+1hour; run scontrol hold $id; keys $id JobState Reason Priority; run scontrol release $id; keys $id Reason

#% scontrol-hold-running
submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol hold $id; keys $id JobState

#% scontrol-release-running
submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol release $id

#% scontrol-hold-unknown
run scontrol hold 999999

#% scontrol-uhold
submit --begin=now+1hour --wrap true; run scontrol uhold $id; keys $id Reason Priority

#% scontrol-update-timelimit-pending
submit --hold --wrap true; run scontrol update JobId=$id TimeLimit=30; keys $id TimeLimit

#% scontrol-update-timelimit-running
submit -t 60 --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol update JobId=$id TimeLimit=30; keys $id TimeLimit

#% scontrol-update-timelimit-running-plus
submit -t 60 --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol update JobId=$id TimeLimit=+10; keys $id TimeLimit

#% scontrol-update-timelimit-running-minus
submit -t 60 --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol update JobId=$id TimeLimit=-10; keys $id TimeLimit

#% scontrol-update-jobname
submit --hold --wrap true; run scontrol update JobId=$id JobName=renamed; keys $id JobName

#% scontrol-update-jobname-running
submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol update JobId=$id JobName=renamed; keys $id JobName

#% scontrol-update-partition-pending
submit --hold --wrap true; run scontrol update JobId=$id Partition=debug; keys $id Partition

#% scontrol-update-unknown-field
submit --hold --wrap true; run scontrol update JobId=$id Bogus=1

#% scontrol-update-comment
submit --hold --wrap true; run scontrol update JobId=$id Comment=hi; keys $id Comment

#% scontrol-update-nice
submit --hold --wrap true; run scontrol update JobId=$id Nice=5; keys $id Nice

#% scontrol-requeue-running
# Appending, and only the first run's lines: Slurm holds a requeued job back a while, Drover restarts it at once.
submit -o out.txt --open-mode=append --wrap 'echo run ${SLURM_RESTART_COUNT:-0}; trap "echo got TERM" TERM; sleep 30 & wait'; wait_state $id RUNNING; sleep 1; run scontrol requeue $id; keys $id Restarts; sleep 2; grep -v '^run [1-9]' out.txt

#% scontrol-requeue-completed
submit --wrap true; wait_end $id; run scontrol requeue $id; keys $id JobState Restarts

#% scontrol-requeue-pending
submit --hold --wrap true; run scontrol requeue $id

#% scontrol-requeuehold-running
submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol requeuehold $id; wait_state $id PENDING; keys $id JobState Reason Restarts

#% scontrol-requeue-unknown
run scontrol requeue 999999

#% scontrol-suspend-resume
submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol suspend $id; keys $id JobState; run scontrol resume $id; keys $id JobState

#% scontrol-suspend-stops-the-tasks
submit -o out.txt --wrap 'while true; do echo tick; sleep 0.2; done'; wait_state $id RUNNING; sleep 1; run scontrol suspend $id; sleep 0.5; a=$(wc -l < out.txt); sleep 2; b=$(wc -l < out.txt); [ "$a" = "$b" ] && echo "stopped while suspended"; run scontrol resume $id; sleep 2; c=$(wc -l < out.txt); [ "$c" -gt "$b" ] && echo "going again after resume"; run scontrol suspend $id; run scancel $id; wait_end $id; keys $id JobState

#% scontrol-suspend-pending-and-resume-running
submit --hold --wrap true; run scontrol suspend $id; submit --wrap 'sleep 30'; wait_state $id RUNNING; run scontrol resume $id; run scancel $id

#% scontrol-top
submit --hold --wrap true; a=$id; submit --hold --wrap true; run scontrol top $id

#% scontrol-bad-command
run scontrol frobnicate

#% scontrol-ping-rc
scontrol ping >/dev/null 2>&1; echo "rc=$?"

#% scontrol-write-batch-script
printf '#!/bin/bash\n#SBATCH -J w\necho saved\n' > job.sh; submit --hold job.sh; run scontrol write batch_script $id -

#% scontrol-show-job-dependency
submit --hold --wrap true; a=$id; submit -d afterok:$a --wrap true; keys $id Dependency Reason; run scontrol release $a; wait_end $a; wait_end $id; keys $id Dependency

#% scontrol-show-job-array
submit --hold --array=1-3 --wrap true; keys $id ArrayJobId ArrayTaskId JobState
