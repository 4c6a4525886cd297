# Time limits and signals to batch jobs.

#% timelimit-kills-with-message
# Not ExitCode: Slurm's reads 0:0 or the script's 143:0, by which comes first, the TIMEOUT or the script's exit.
submit -t 1 -o out.txt --wrap 'trap "echo got TERM" TERM; sleep 100 & wait'; wait_end $id 1500; sleep 1; grep -c "JOB $id ON node01 CANCELLED AT" out.txt; grep -c 'DUE TO TIME LIMIT' out.txt; grep -c 'got TERM' out.txt; keys $id JobState Reason

#% signal-option-warns-before-limit
submit -t 1 --signal=B:USR1@55 -o out.txt --wrap 'trap "echo got USR1; exit 0" USR1; sleep 100 & wait'; wait_end $id 1000; grep -v '^slurmstepd' out.txt; keys $id JobState

#% signal-killed-job-state
submit --wrap 'kill -9 $$'; wait_end $id; keys $id JobState Reason ExitCode
