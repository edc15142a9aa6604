#!/usr/bin/env bash
# A real Slurm cluster on one Linux machine (Debian/Ubuntu, root, no systemd or Docker needed), for hpcvod's
# cluster tests and for trying hpcvod on a laptop. See docs/slurm-sandbox.md.
#
#   scripts/slurm-sandbox.sh up [N]     start (or keep) a cluster of N nodes n1..nN (default 2); idempotent
#   scripts/slurm-sandbox.sh down [--purge]   stop it: daemons by PID file, job processes by namespace,
#                                        then namespaces, bridge, /etc/hosts lines; --purge also deletes the state dir
#   scripts/slurm-sandbox.sh status     print what runs; exit 0 when every node answers, 1 otherwise
#
# Each node's slurmd runs in its own network + UTS namespace (hostname nI, address <net>.1I) on a private bridge,
# so `srun -N2 -n4 hostname` prints n1 n1 n2 n2 and MPI ranks really talk across "nodes". slurmctld runs in the
# machine's own namespace. Nothing outside the private bridge is reachable from the nodes (none is needed).
#
# Settings (environment):
#   HPCVOD_SANDBOX_DIR         state, logs, config (default /tmp/hpcvod-slurm-sandbox)
#   HPCVOD_SANDBOX_CPUS        CPUs each node advertises (default 2: 2 nodes x 2 tasks fit on a 2-core machine)
#   HPCVOD_SANDBOX_ACCOUNTING  1 = also run MariaDB + slurmdbd so plain `sacct` works (+~15 s); default 0
#                              (job completions are always written by jobcomp/filetxt: `sacct -c` works either way)
#   HPCVOD_SANDBOX_NET         first three octets of the private /24 (default 10.251.0)
#   HPCVOD_SANDBOX_PORT        slurmctld port (default 6817; slurmd uses it +1 inside the node namespaces)
#   HPCVOD_SANDBOX_MPI_DEFAULT Slurm's MpiDefault (default pmi2)
#   HPCVOD_SANDBOX_NO_APT      1 = never call apt-get (fail if a package is missing)
set -euo pipefail

BASE=${HPCVOD_SANDBOX_DIR:-/tmp/hpcvod-slurm-sandbox}
CPUS=${HPCVOD_SANDBOX_CPUS:-2}
ACCT=${HPCVOD_SANDBOX_ACCOUNTING:-0}
NET=${HPCVOD_SANDBOX_NET:-10.251.0}
PORT=${HPCVOD_SANDBOX_PORT:-6817}
MPI_DEFAULT=${HPCVOD_SANDBOX_MPI_DEFAULT:-pmi2}
CLUSTER=sandbox
BRIDGE=hvsbr0
HOSTS_TAG="# hpcvod-slurm-sandbox"
NS_PREFIX=hvsb-n            # network namespace of node nI is hvsb-nI
RUN=$BASE/run LOG=$BASE/log CONF=$BASE/slurm.conf
export DEBIAN_FRONTEND=noninteractive

T0=$(date +%s.%N)
say() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN{printf "[slurm-sandbox %5.1fs] %s\n", b-a, m}' >&2; }
die() { echo "slurm-sandbox: $*" >&2; exit "${EXIT:-1}"; }
usage() { EXIT=2 die "usage: $0 up [N] | down [--purge] | status"; }

# Daemons are started with 9>&- : fd 9 holds this script's lock and must not outlive it.
# --- processes: only ever the ones whose PID we recorded (the machine is shared) -------------------------------
pid_alive() {  # pid_alive PIDFILE [COMM]: the pid in PIDFILE runs (and, if given, is the program COMM)
  local f=$1 comm=${2:-} p
  [ -s "$f" ] || return 1
  p=$(cat "$f" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null || return 1
  # a killed daemon not yet reaped (a zombie) still answers kill -0: it is not running
  [ "$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$p/status" 2>/dev/null)" != Z ] || return 1
  [ -z "$comm" ] || [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$comm" ]
}
stop_pids() {  # SIGTERM the given pids, wait up to 15 s, SIGKILL what is left
  local pids=("$@") p alive
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 75); do
    alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0; sleep 0.2
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}
stop_pidfiles() {  # stop_pidfiles PIDFILE:COMM...: stop (together) the daemons recorded there, if still that program
  local arg f pids=()
  for arg in "$@"; do
    f=${arg%:*}
    if pid_alive "$f" "${arg##*:}"; then pids+=("$(cat "$f")"); fi
  done
  stop_pids "${pids[@]}"
  for arg in "$@"; do rm -f "${arg%:*}"; done
}

# --- recorded settings of the running sandbox --------------------------------------------------------------------
settings() { echo "nodes=$1 cpus=$CPUS accounting=$ACCT net=$NET port=$PORT mpi_default=$MPI_DEFAULT"; }
running_nodes() { sed -n 's/^nodes=\([0-9]*\).*/\1/p' "$BASE/sandbox.settings" 2>/dev/null || true; }

# --- 1. packages -------------------------------------------------------------------------------------------------
ensure_packages() {
  local want=(slurmctld slurmd slurm-client munge libpmix-dev libpmi2-0 iproute2 util-linux procps)
  [ "$ACCT" = 1 ] && want+=(slurmdbd mariadb-server mariadb-client)
  local missing=() p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "${HPCVOD_SANDBOX_NO_APT:-0}" = 1 ] && die "missing packages ${missing[*]} and HPCVOD_SANDBOX_NO_APT=1"
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get on this machine"
    # package scripts must not start daemons from /etc/init.d with a config that is not ours
    local own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
    fi
    say "installing ${missing[*]}"
    # libpmix-dev must be there BEFORE slurmd starts: Slurm's mpi_pmix plugin dlopens libpmix.so from it,
    # without it `srun --mpi=pmix` hangs.
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
      || { [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get install ${missing[*]} failed"; }
    [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  fi
  say "packages ready ($(slurmd -V))"
}

# --- 2. munge ----------------------------------------------------------------------------------------------------
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
ensure_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  if munge_works; then
    if pid_alive "$RUN/munged.pid" munged; then say "munged up (pid $(cat "$RUN/munged.pid"))"
    else say "munged already running (not started by this script, left alone on down)"; fi
    return
  fi
  runuser -u munge -- /usr/sbin/munged 9>&-
  for _ in $(seq 100); do munge_works && break; sleep 0.1; done
  munge_works || die "munged did not come up (see /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$RUN/munged.pid"    # ours: down stops it
  say "munged up (pid $(cat "$RUN/munged.pid"))"
}

# --- 3. configuration --------------------------------------------------------------------------------------------
write_config() {  # write_config N
  local n=$1 i mem nodelines="" acctlines
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  for i in $(seq 1 "$n"); do
    mkdir -p "$BASE/state/d/n$i" "$BASE/tmp/n$i"
    nodelines+="NodeName=n$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=$((mem * 8 / 10 / n)) State=UNKNOWN"$'\n'
  done
  if [ "$ACCT" = 1 ]; then
    acctlines="JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$NET.1
AccountingStoragePort=$((PORT + 2))"
  else
    acctlines="JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none"
  fi
  cat > "$CONF.new" <<EOF
# Written by hpcvod scripts/slurm-sandbox.sh -- $(settings "$n")
ClusterName=$CLUSTER
# "localhost(ADDR)" works whatever this machine's hostname is; the nodes reach slurmctld on the bridge address
SlurmctldHost=localhost($NET.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job may start again after cred_expire seconds and is then started by the next scheduler pass:
# Slurm's defaults (120 s, passes every 30-60 s) would make every requeue take minutes on this toy cluster
AuthInfo=cred_expire=5
StateSaveLocation=$BASE/state/ctld
SlurmdSpoolDir=$BASE/state/d/%n
# one TmpFS per node, or PMIx's per-job directories of two "nodes" collide
TmpFS=$BASE/tmp/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=$MPI_DEFAULT
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=5
# nodes advertise HPCVOD_SANDBOX_CPUS whatever the hardware has
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# finished jobs stay visible to squeue/scontrol for 10 minutes
MinJobAge=600
# SIGTERM -> SIGKILL delay at time limit / scancel (Slurm's default is 30 s)
KillWait=10
$acctlines
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
# a job in partition "urgent" preempts (requeues) jobs of "debug", as on clusters with preemptible queues
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$nodelines
PartitionName=debug Nodes=ALL Default=YES DefaultTime=00:30:00 MaxTime=04:00:00 PriorityTier=1 PreemptMode=REQUEUE State=UP
PartitionName=urgent Nodes=ALL DefaultTime=00:10:00 MaxTime=01:00:00 PriorityTier=10 PreemptMode=OFF State=UP
EOF
  mv "$CONF.new" "$CONF"
}

link_config() {  # clients (sbatch, srun, squeue, hpcvod) find the config at Slurm's default place
  local f target
  mkdir -p /etc/slurm
  for f in slurm.conf slurmdbd.conf; do
    [ -e "$BASE/$f" ] || continue
    if [ -e /etc/slurm/$f ] && [ ! -L /etc/slurm/$f ]; then
      say "WARNING: /etc/slurm/$f is a real file (not ours); left alone -- export SLURM_CONF=$CONF to use the sandbox"
      continue
    fi
    target=$(readlink /etc/slurm/$f || true)
    if [ -n "$target" ] && [ "$target" != "$BASE/$f" ] && [ -e "$target" ] && port_in_use "$PORT"; then
      die "/etc/slurm/$f points to $target and a slurmctld is listening on $PORT: another cluster runs here"
    fi
    ln -sfn "$BASE/$f" /etc/slurm/$f
  done
}
port_in_use() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# --- 4. network: one namespace per node on a private bridge ------------------------------------------------------
ensure_network() {  # ensure_network N
  local n=$1 i ns
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  for i in $(seq 1 "$n"); do
    ns=$NS_PREFIX$i
    if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
      ip netns add "$ns"
      ip link add "hvsb$i" type veth peer name eth0 netns "$ns"
      ip link set "hvsb$i" master "$BRIDGE" up
      ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
    fi
    grep -q "^$NET.$((10 + i)) n$i $HOSTS_TAG\$" /etc/hosts || echo "$NET.$((10 + i)) n$i $HOSTS_TAG" >> /etc/hosts
    local seen; seen=$(getent hosts "n$i" | awk '{print $1; exit}')
    [ "$seen" = "$NET.$((10 + i))" ] || say "WARNING: n$i resolves to $seen, not $NET.$((10 + i)) (another /etc/hosts line?)"
  done
}

# --- 5. daemons --------------------------------------------------------------------------------------------------
ensure_accounting() {
  [ "$ACCT" = 1 ] || return 0
  if ! mysql -e 'select 1' >/dev/null 2>&1; then
    install -d -o mysql -g mysql /run/mysqld
    # unix socket only; the data directory was initialised by the package
    /usr/sbin/mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock \
      --pid-file=/run/mysqld/mysqld.pid > "$LOG/mariadb.log" 2>&1 < /dev/null 9>&- &
    disown
    for _ in $(seq 200); do mysql -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
    mysql -e 'select 1' >/dev/null 2>&1 || die "MariaDB did not start (see $LOG/mariadb.log)"
    cp /run/mysqld/mysqld.pid "$RUN/mariadbd.pid"    # ours: down stops it (mariadbd, as mysql, cannot write here)
  fi
  cat > "$BASE/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$((PORT + 2))
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=hpcvod_sandbox_acct
EOF
  chmod 600 "$BASE/slurmdbd.conf"
  link_config
  if ! pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
    slurmdbd 9>&-
    for _ in $(seq 150); do port_in_use $((PORT + 2)) && break; sleep 0.1; done
  fi
  say "MariaDB + slurmdbd up"
}

ensure_daemons() {  # ensure_daemons N
  local n=$1 i
  if ! pid_alive "$RUN/slurmctld.pid" slurmctld; then
    port_in_use "$PORT" && die "port $PORT is taken by a program this script did not start (another slurmctld?); set HPCVOD_SANDBOX_PORT"
    slurmctld 9>&-
  fi
  for i in $(seq 1 "$n"); do
    pid_alive "$RUN/slurmd-n$i.pid" slurmd && continue
    # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then finds no cgroup filesystem.
    # The UTS namespace gives the node its own hostname, so Slurm and MPI see nI, not this machine's name.
    nsenter --net="/run/netns/$NS_PREFIX$i" unshare --uts sh -c "hostname n$i; exec slurmd -N n$i" 9>&-
  done
}

wait_nodes() {  # wait_nodes N: every node registered and usable
  local n=$1 states bad
  for _ in $(seq 300); do
    states=$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null || true)
    if [ "$(echo "$states" | grep -c '^n')" -ge "$n" ]; then
      bad=$(echo "$states" | awk '$2 ~ /down|drain|unk|fail|no_resp|\*/' || true)
      [ -z "$bad" ] && return 0
    fi
    sleep 0.1
  done
  echo "$states" >&2
  tail -n 20 "$LOG/slurmctld.log" >&2 || true
  die "nodes not ready after 30 s (logs in $LOG)"
}

cmd_up() {
  local n=${1:-2}
  [[ $n =~ ^[1-9][0-9]?$ ]] || EXIT=2 die "up: node count must be 1..99, got '$n'"
  [[ $CPUS =~ ^[1-9][0-9]*$ ]] || EXIT=2 die "HPCVOD_SANDBOX_CPUS must be a positive integer, got '$CPUS'"
  [ "$(id -u)" = 0 ] || EXIT=2 die "up needs root (network namespaces, daemons, apt)"
  mkdir -p "$RUN" "$LOG" "$BASE/state/ctld"
  exec 9>"$BASE/.lock"; flock 9
  if pid_alive "$RUN/slurmctld.pid" slurmctld; then
    local have; have=$(cat "$BASE/sandbox.settings" 2>/dev/null || true)
    [ "$have" = "$(settings "$n")" ] \
      || EXIT=2 die "a sandbox is already up with: ${have:-unknown settings}; wanted: $(settings "$n") -- run '$0 down' first"
  fi
  ensure_packages
  ensure_munge
  [ -e "$CONF" ] && [ "$(cat "$BASE/sandbox.settings" 2>/dev/null)" = "$(settings "$n")" ] || write_config "$n"
  settings "$n" > "$BASE/sandbox.settings"
  ensure_network "$n"
  link_config
  ensure_accounting
  ensure_daemons "$n"
  wait_nodes "$n"
  say "cluster up: $n node(s) x $CPUS CPUs, partitions debug (default) and urgent; config $CONF"
  sinfo >&2
}

cmd_down() {
  local purge=${1:-}
  [ -z "$purge" ] || [ "$purge" = --purge ] || usage
  # without its folder there are no PID files, but namespaces, bridge and /etc/hosts lines may still be left over
  mkdir -p "$RUN"
  exec 9>"$BASE/.lock"; flock 9
  # jobs first, so their processes end through Slurm rather than being orphaned by a dead slurmd
  if pid_alive "$RUN/slurmctld.pid" slurmctld && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full $(squeue -h -o %i) 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h -t R,CG -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  local f ns pids slurm_daemons=()
  for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && slurm_daemons+=("$f:slurmd"); done
  # each takes 1-2 s to stop: all Slurm daemons at once, then what they needed
  stop_pidfiles "${slurm_daemons[@]}" "$RUN/slurmctld.pid:slurmctld" "$RUN/slurmdbd.pid:slurmdbd"
  stop_pidfiles "$RUN/mariadbd.pid:mariadbd" "$RUN/munged.pid:munged"
  # whatever still lives in a node namespace (a job step slurmd left behind) was started by this cluster
  for ns in $(ip netns list 2>/dev/null | awk -v p="^$NS_PREFIX[0-9]+\$" '$1 ~ p {print $1}'); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -n "$pids" ] && stop_pids $pids
    ip netns del "$ns"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  sed -i "/ $HOSTS_TAG\$/d" /etc/hosts
  for f in slurm.conf slurmdbd.conf; do
    [ "$(readlink /etc/slurm/$f 2>/dev/null)" = "$BASE/$f" ] && rm -f /etc/slurm/$f
  done
  rm -f "$BASE/sandbox.settings"
  if [ "$purge" = --purge ]; then rm -rf "$BASE"; fi
  say "down"
}

cmd_status() {
  local n ok=0 f
  n=$(running_nodes)
  if ! pid_alive "$RUN/slurmctld.pid" slurmctld; then
    echo "slurm-sandbox: down"; return 1
  fi
  echo "slurm-sandbox: $(cat "$BASE/sandbox.settings")"
  echo "  config:    $CONF"
  echo "  slurmctld: pid $(cat "$RUN/slurmctld.pid")"
  for f in "$RUN"/slurmd-*.pid "$RUN/slurmdbd.pid" "$RUN/mariadbd.pid" "$RUN/munged.pid"; do
    [ -e "$f" ] || continue
    if pid_alive "$f"; then echo "  $(basename "$f" .pid): pid $(cat "$f")"; else echo "  $(basename "$f" .pid): DEAD"; ok=1; fi
  done
  sinfo -N -o '%N %P %t %c' 2>/dev/null | sed 's/^/  /' || ok=1
  if [ -n "$n" ] && [ "$(sinfo -h -N -p debug -t idle,mix,alloc -o %N 2>/dev/null | grep -c .)" -lt "$n" ]; then ok=1; fi
  return $ok
}

case ${1:-} in
  up) shift; [ $# -le 1 ] || usage; cmd_up "$@" ;;
  down) shift; [ $# -le 1 ] || usage; cmd_down "$@" ;;
  status) cmd_status ;;
  *) usage ;;
esac
