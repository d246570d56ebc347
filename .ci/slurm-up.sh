#!/usr/bin/env bash
# A one-node SLURM for the tests (tests/workflow/test_slurm.py): Debian's slurmctld + slurmd + munge,
# run as root, with three fake GPUs declared as GRES device files (/dev/fakegpu0..2): the
# time-limit test's job holds one while the scancel test's two jobs run beside it.
# No slurmdbd: the executor plugin asks squeue for job states (profiles/slurm-test sets
# status_command: squeue) and MinJobAge keeps finished jobs visible to squeue for an hour.
#
# Idempotent: installs only what is missing, rewrites the config, (re)starts a daemon only
# when it is not running or its config changed, and waits until the node is idle.
# Exit status != 0 with the reason on stderr when SLURM cannot be brought up; the tests then
# fail with that reason (they never skip silently).
#   bash .ci/slurm-up.sh          # install if needed, start, wait for the node
#   bash .ci/slurm-up.sh --down   # stop the daemons (their state stays in $STATE)
set -euo pipefail

STATE=/var/lib/bestofn-slurm  # spool and state of this test cluster only
CONF=/etc/slurm
NODE=$(hostname -s)
# At least 4 CPUs declared (config_overrides), so two 2-CPU bundles run at once on a 2-core box.
CPUS=$(($(nproc) < 4 ? 4 : $(nproc)))
MEM_MB=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024))
log() { echo "slurm-up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

running() { pgrep -x "$1" >/dev/null 2>&1; }
stop() {
  for d in slurmd slurmctld; do
    if [ -f "$STATE/$d.pid" ] && kill "$(cat "$STATE/$d.pid")" 2>/dev/null; then
      log "stopped $d"
    fi
  done
}

if [ "${1:-}" = "--down" ]; then
  stop
  exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (it installs Debian packages and starts slurmd)"

# 1. packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "no apt-get: install slurmctld, slurmd, slurm-client, munge"
  log "installing slurmctld slurmd slurm-client munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >&2 ||
    die "apt-get install of slurmctld slurmd slurm-client munge failed"
fi

# 2. munge (the key is created by the package's postinst; make one if it is missing)
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --force >&2 || die "mungekey failed"
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --force >&2 || die "munged did not start"
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || die "munge does not answer (see /var/log/munge)"
fi

# 3. fake GPUs and the config
# Character devices (major 195 as NVIDIA's); slurmd ignores plain files, and then sets no
# CUDA_VISIBLE_DEVICES. Nothing opens them: they only give the GRES plugin three device entries.
for i in 0 1 2; do
  if [ ! -c /dev/fakegpu$i ]; then
    rm -f /dev/fakegpu$i
    mknod /dev/fakegpu$i c 195 $i || die "mknod /dev/fakegpu$i failed (fake GPU device files)"
  fi
done
mkdir -p "$CONF" "$STATE/ctld" "$STATE/d" "$STATE/log"
new=$(mktemp)
cat >"$new" <<EOF
# Written by bestofn .ci/slurm-up.sh: a one-node test cluster. Do not use in production.
ClusterName=bestofn-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Every process of a job, detached warm workers included, lives in the job's cgroup and ends
# with it (scancel, time limit, end of the bundle), as on real clusters.
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# squeue must still see finished jobs when the executor asks (no slurmdbd, so no sacct).
MinJobAge=3600
# A job past its time limit gets SIGTERM, then SIGKILL KillWait seconds later.
KillWait=5
OverTimeLimit=0
SlurmdTimeout=60
InactiveLimit=0
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:3 State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
gres=$(mktemp)
echo "NodeName=$NODE Name=gpu File=/dev/fakegpu[0-2]" >"$gres"
cgroup=$(mktemp)
printf '%s\n' CgroupPlugin=cgroup/v1 CgroupMountpoint=/sys/fs/cgroup ConstrainCores=no \
  ConstrainRAMSpace=no ConstrainDevices=no >"$cgroup"
[ -d /sys/fs/cgroup/freezer ] ||
  die "no cgroup v1 freezer at /sys/fs/cgroup/freezer (proctrack/cgroup needs it)"
changed=0
for f in slurm gres cgroup; do
  case $f in slurm) src=$new ;; gres) src=$gres ;; *) src=$cgroup ;; esac
  cmp -s "$src" "$CONF/$f.conf" || { cp "$src" "$CONF/$f.conf"; changed=1; }
  chmod 644 "$CONF/$f.conf"
done
rm -f "$new" "$gres" "$cgroup"
if [ "$changed" = 1 ] && { running slurmctld || running slurmd; }; then
  log "config changed: restarting"
  stop
  for _ in $(seq 100); do
    running slurmctld || running slurmd || break
    sleep 0.1
  done
fi

# 4. daemons
if ! running slurmctld; then
  log "starting slurmctld"
  # -c: a fresh queue (jobs of an earlier session would only fail on the fake GPUs)
  slurmctld -c >&2 || die "slurmctld did not start; see $STATE/log/slurmctld.log"
fi
if ! running slurmd; then
  log "starting slurmd"
  slurmd >&2 || die "slurmd did not start; see $STATE/log/slurmd.log"
fi

# 5. wait for an idle node with gpu:3
state=""
for _ in $(seq 120); do
  state=$(sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -1 || true)
  case "$state" in
    idle | mixed | allocated) break ;;
    down* | drain* | fail*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
case "$state" in
  idle | mixed | allocated) ;;
  *)
    die "node $NODE is '${state:-not reported}' after 60 s; last lines of the logs:
$(tail -n 15 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" 2>/dev/null)"
    ;;
esac
gres_now=$(sinfo -h -n "$NODE" -o '%G' | head -1)
[[ "$gres_now" == *gpu:3* ]] || die "node $NODE reports GRES '$gres_now', expected gpu:3"
log "ready: node $NODE $state, $CPUS CPUs, GRES $gres_now"
