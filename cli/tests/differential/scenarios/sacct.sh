# sacct (Slurm here has no accounting database: see intended.toml).

#% sacct-completed-job
submit --wrap true; wait_end $id; run sacct -j $id -n -X -P -o JobID,State,ExitCode
