# squeue: listings, formats, filters.

#% squeue-empty-header
run squeue

#% squeue-pending-held-job
submit --hold -J held --wrap true; run squeue -o '%i %j %t %r'

#% squeue-no-header
submit --hold -J held --wrap true; run squeue -h -o '%i %j %T'

#% squeue-running-job
submit -J runner --wrap 'sleep 30'; wait_state $id RUNNING; run squeue -h -o '%i %j %t %D %R %C %b'

#% squeue-long-format-header
run squeue -l -h

#% squeue-states-filter-pending
submit --hold --wrap true; a=$id; submit --wrap 'sleep 30'; wait_state $id RUNNING; run squeue -h -t PD -o %i; run squeue -h -t R -o %i

#% squeue-states-all-lists-finished
submit -J doneall --wrap true; wait_end $id; run squeue -h -t all -n doneall -o '%i %T'

#% squeue-completed-state-filter
submit -J donecd --wrap true; wait_end $id; run squeue -h -t CD -n donecd -o '%i %T'

#% squeue-job-filter
submit --hold --wrap true; a=$id; submit --hold --wrap true; run squeue -h -j $a -o %i

#% squeue-finished-job-by-id
submit --wrap true; wait_end $id; run squeue -h -j $id -o '%i %T'

#% squeue-unknown-job
run squeue -j 999999

#% squeue-name-filter
submit --hold -J alpha --wrap true; submit --hold -J beta --wrap true; run squeue -h -n beta -o %j

#% squeue-partition-filter
submit --hold -p debug --wrap true; submit --hold --wrap true; run squeue -h -p debug -o '%i %P'

#% squeue-sort-default-pending-by-priority
submit --hold --nice=100 -J low --wrap true; submit --hold -J high --wrap true; run squeue -h -o '%j %t'

#% squeue-format-time-limit
submit --hold -t 1-00:00:00 --wrap true; submit --hold -t 5 --wrap true; submit --hold --wrap true; run squeue -h -o '%l'

#% squeue-format-widths
submit --hold -J averyveryverylongname --wrap true; run squeue -o '%.5i %.4j %-6t|'

#% squeue-Format-long-names
submit --hold -J fmt --wrap true; run squeue -h -O 'JobID,Name,State,Partition'

#% squeue-bad-state
run squeue -t NOTASTATE

#% squeue-bad-option
run squeue --no-such-option

#% squeue-user-filter
submit --hold --wrap true; run squeue -h -u "$(id -un)" -o %u

#% squeue-me
submit --hold --wrap true; run squeue -h --me -o %u

#% squeue-help-rc
squeue --help >/dev/null 2>&1; echo "rc=$?"

#% squeue-array-pending-collapsed
submit --hold --array=0-3 --wrap true; run squeue -h -o '%i %t'

#% squeue-array-expanded
submit --hold --array=0-2 --wrap true; run squeue -h -r -o '%i %t'

#% squeue-dependency-reason
submit --hold --wrap true; a=$id; submit -d afterok:$a --wrap true; run squeue -h -j $id -o '%i %r %E'

#% squeue-json-held-job-and-array
# What client libraries read from Slurm 22.05's `squeue --json` (OpenAPI v0.0.38).
submit --hold -J jsonjob -t 30 -n 2 --wrap true; single=$id; submit --hold --array=1-3%2 -J jsonarray --wrap true
squeue --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["meta"]["plugin"]["type"], d["errors"])
keys = ["job_state", "state_reason", "name", "partition", "user_name", "group_name", "priority", "time_limit", "batch_flag", "requeue", "restart_cnt", "tasks", "node_count", "array_task_string", "array_max_tasks", "standard_input", "current_working_directory", "nodes", "start_time"]
for j in sorted((j for j in d["jobs"] if j["name"].startswith("json")), key=lambda j: j["name"]):
    print(" ".join("%s=%s" % (k, j[k]) for k in keys))
print(len(set.intersection(*[set(j) for j in d["jobs"]]) - {"job_resources"}))
' | sed "s|$PWD|<dir>|g"
