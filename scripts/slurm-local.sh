#!/usr/bin/env bash
# A real Slurm on this machine, without systemd, for the tests and for trying the batch scripts:
# munged, slurmctld and NODES slurmd (fake nodes n1..nN on one host, each with its own port and
# spool directory) under DIR. Installs Debian's slurm-wlm and munge when they are missing.
#   scripts/slurm-local.sh start DIR [NODES] [CPUS_PER_NODE]   (prints the SLURM_CONF to export)
#   scripts/slurm-local.sh stop DIR
set -euo pipefail
usage() { echo "usage: scripts/slurm-local.sh start DIR [NODES] [CPUS_PER_NODE] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
nodes=${3:-2}
cpus=${4:-4}

stop() {
  for pidfile in "$dir"/run/*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

case "$action" in
  stop) stop; exit 0 ;;
  start) ;;
  *) usage ;;
esac

missing=()
for p in slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stop
mkdir -p "$dir"/{etc,run,log,state,munge}
user=$(id -un)
# munge: its own key and socket, so nothing of the machine's is touched.
[ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null; chmod 400 "$dir/munge/munge.key"; }
chmod 700 "$dir/munge"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed"

# Free ports: the controller's, then one per node.
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctl_port=$(port)
conf="$dir/etc/slurm.conf"
{
  echo "ClusterName=local"
  echo "SlurmctldHost=localhost"
  echo "SlurmctldPort=$ctl_port"
  echo "SlurmUser=$user"
  echo "SlurmdUser=$user"  # the daemons run as whoever starts them
  echo "AuthType=auth/munge"
  echo "AuthInfo=socket=$dir/munge/munge.socket"
  echo "CredType=cred/munge"
  echo "StateSaveLocation=$dir/state"
  echo "SlurmdSpoolDir=$dir/state/%n"
  echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
  echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SlurmdParameters=config_overrides"
  echo "ReturnToService=2"
  echo "SchedulerType=sched/builtin"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "TmpFS=$dir/state/%n/tmp"  # per node: PMIx keeps its client directories there
  echo "InactiveLimit=0"
  echo "KillWait=5"
  echo "MinJobAge=300"
  for ((n = 1; n <= nodes; ++n)); do
    echo "NodeName=n$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(port) CPUs=$cpus State=UNKNOWN"
  done
  echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$conf"
for ((n = 1; n <= nodes; ++n)); do mkdir -p "$dir/state/n$n/tmp"; done
export SLURM_CONF="$conf"
slurmctld -f "$conf"
for ((n = 1; n <= nodes; ++n)); do slurmd -f "$conf" -N "n$n"; done
# Ready when every node is idle.
for _ in $(seq 1 50); do
  if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" -eq "$nodes" ]; then
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.2
done
echo "slurm-local: the nodes did not come up; see $dir/log" >&2
sinfo -N >&2 || true
exit 1
