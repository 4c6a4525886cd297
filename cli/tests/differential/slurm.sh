#!/bin/bash
# Starts a private Slurm 22.05 (Debian's slurm-wlm) for the differential suite: its own munge socket and key, its
# own ports, state and spool under DIR, one node `node01` (64 CPUs, 8 fake GPUs) named as a local Drover cluster's
# first agent, partitions `gpu` (default) and `debug` as the suite's Drover cluster has them. Nothing global is
# touched, so it runs beside the peer of ../shared/peers/slurm. Needs root (slurmd launches jobs as their user).
#   slurm.sh start DIR PORT   (PORT: slurmctld's; slurmd takes PORT+1)
#   slurm.sh stop DIR
set -euo pipefail
cmd=$1 dir=$2
case "$cmd" in
stop)
  for p in slurmd slurmctld munged; do
    [ -f "$dir/$p.pid" ] && kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
  done
  exit 0 ;;
start) port=$3 ;;
*) echo "usage: slurm.sh start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
host=$(hostname -s)
mkdir -p "$dir"/{state,spool,log,gres}
# munge refuses keys others can read and directories others can write.
chmod 700 "$dir"
[ -f "$dir/munge.key" ] || head -c 1024 /dev/urandom > "$dir/munge.key"
chmod 400 "$dir/munge.key"
/usr/sbin/munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge.seed"
for i in 0 1 2 3 4 5 6 7; do touch "$dir/gres/gpu$i"; done
cat > "$dir/slurm.conf" <<CONF
ClusterName=diff
FirstJobId=1000
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
MpiDefault=none
NodeName=node01 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=64 RealMemory=16000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=node01 Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=node01 MaxTime=00:10:00 State=UP
CONF
echo "NodeName=node01 Name=gpu File=$dir/gres/gpu[0-7]" > "$dir/gres.conf"
export SLURM_CONF=$dir/slurm.conf
/usr/sbin/slurmctld -i -f "$dir/slurm.conf"
/usr/sbin/slurmd -N node01 -f "$dir/slurm.conf"
for _ in $(seq 1 100); do
  if sinfo -h -o %t 2>/dev/null | grep -qx idle; then exit 0; fi
  sleep 0.2
done
echo "the private Slurm did not come up; logs in $dir/log" >&2
exit 1
