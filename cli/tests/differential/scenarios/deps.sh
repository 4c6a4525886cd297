# Dependencies.

#% dep-afterok-runs-after
submit --wrap 'sleep 1'; a=$id; submit -d afterok:$a --wrap true; b=$id; keys $b JobState Reason; wait_end $b; keys $b JobState

#% dep-afterok-never-satisfied
submit --wrap 'exit 1'; a=$id; submit -d afterok:$a --wrap true; b=$id; wait_end $a; wait_reason $b DependencyNeverSatisfied; keys $b JobState Reason Dependency

#% dep-afternotok
submit --wrap 'exit 1'; a=$id; submit -d afternotok:$a --wrap true; b=$id; wait_end $b; keys $b JobState

#% dep-afterany
submit --wrap 'exit 1'; a=$id; submit -d afterany:$a --wrap true; b=$id; wait_end $b; keys $b JobState

#% dep-kill-on-invalid
submit --wrap 'exit 1'; a=$id; submit --kill-on-invalid-dep=yes -d afterok:$a --wrap true; b=$id; wait_end $b; keys $b JobState Reason

#% dep-singleton
submit -J single --hold --wrap true; a=$id; submit -J single -d singleton --wrap true; keys $id Reason Dependency

#% dep-multiple
submit --hold --wrap true; a=$id; submit --hold --wrap true; b=$id; submit -d afterok:$a:$b --wrap true; keys $id Dependency

#% dep-on-finished-ok-job
submit --wrap true; a=$id; wait_end $a; submit -d afterok:$a --wrap true; wait_end $id; keys $id JobState

#% dep-after-started
submit --wrap 'sleep 5'; a=$id; submit -d after:$a --wrap true; wait_end $id; keys $id JobState
