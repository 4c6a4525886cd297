# scancel: cancelling, signalling, exit codes.

#% scancel-pending
submit --hold --wrap true; run scancel $id; wait_end $id; keys $id JobState Reason ExitCode

#% scancel-running-output-line
submit -o out.txt --wrap 'sleep 30'; wait_state $id RUNNING; run scancel $id; wait_end $id; sleep 1; grep -c "JOB $id ON node01 CANCELLED AT" out.txt; keys $id JobState ExitCode

#% scancel-finished-job-is-silent
submit --wrap true; wait_end $id; run scancel $id

#% scancel-unknown-job-is-silent
run scancel 999999

#% scancel-unknown-job-verbose
run scancel -v 999999

#% scancel-bad-id
run scancel notajob

#% scancel-signal-usr1-batch
submit -o out.txt --wrap 'trap "echo got USR1" USR1; for i in $(seq 60); do sleep 0.5; done'; wait_state $id RUNNING; sleep 1; run scancel -b --signal=USR1 $id; sleep 1.5; cat out.txt; keys $id JobState

#% scancel-signal-unknown-job
run scancel --signal=USR1 999999

#% scancel-by-name
submit --hold -J victim --wrap true; a=$id; submit --hold -J keep --wrap true; run scancel -n victim; wait_end $a; run squeue -h -o %j

#% scancel-by-state
submit --hold -J p1 --wrap true; submit -J r1 --wrap 'sleep 30'; wait_state $id RUNNING; run scancel -t PENDING -u "$(id -un)"; sleep 1; run squeue -h -o %j

#% scancel-array-task
submit --hold --array=0-3 --wrap true; run scancel ${id}_2; run squeue -h -r -o %i

#% scancel-whole-array
submit --hold --array=0-3 --wrap true; run scancel $id; sleep 0.5; run squeue -h -r -o %i

#% scancel-no-args
run scancel

#% scancel-bad-signal
submit --hold --wrap true; run scancel --signal=NOPE $id
