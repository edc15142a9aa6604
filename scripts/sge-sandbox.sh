#!/usr/bin/env bash
# A real Grid Engine (Debian's gridengine 8.1.9) on this one machine, for hpcvod's `sge` scheduler tests and for
# trying it out. One execution host (this machine), queue all.q, parallel environment `mpi`. See
# docs/slurm-sandbox.md ("Grid Engine").
#
#   scripts/sge-sandbox.sh up        install (apt) and configure if needed, start qmaster + execd; idempotent
#   scripts/sge-sandbox.sh down      stop the daemons it started (by PID), after deleting the sandbox's jobs
#   scripts/sge-sandbox.sh status    exit 0 when the queue takes jobs
#
# Settings: HPCVOD_SGE_SLOTS (slots of all.q on this host, default 4), HPCVOD_SGE_RUN (where PID copies live,
# default /tmp/hpcvod-sge-sandbox), HPCVOD_SANDBOX_NO_APT=1 (never call apt-get).
# Grid Engine's qsub conflicts with slurm-wlm-torque's (not installed by scripts/slurm-sandbox.sh).
set -euo pipefail

SLOTS=${HPCVOD_SGE_SLOTS:-4}
RUN=${HPCVOD_SGE_RUN:-/tmp/hpcvod-sge-sandbox}
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
SPOOL=/var/spool/gridengine
HOST=$(hostname)
export DEBIAN_FRONTEND=noninteractive
T0=$(date +%s.%N)
say() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN{printf "[sge-sandbox %5.1fs] %s\n", b-a, m}' >&2; }
die() { echo "sge-sandbox: $*" >&2; exit "${EXIT:-1}"; }

pid_alive() {  # pid_alive PIDFILE COMM
  local p
  [ -s "$1" ] || return 1
  p=$(cat "$1" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}
stop_pid() {  # stop_pid PID: SIGTERM, up to 15 s, SIGKILL
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 75); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$1" 2>/dev/null || true
}
edit_with() {  # edit_with SED-EXPRESSIONS -- qconf -mX ARGS: qconf's editor is a sed script
  local expr=$1; shift; [ "$1" = -- ] && shift
  local ed; ed=$(mktemp); printf '#!/bin/sh\nsed -i %s "$1"\n' "$expr" > "$ed"; chmod +x "$ed"
  EDITOR=$ed qconf "$@" >/dev/null 2>&1 || { rm -f "$ed"; die "qconf $* failed"; }
  rm -f "$ed"
}
execd_pidfile() { local f; for f in "$SPOOL"/execd/*/execd.pid; do [ -e "$f" ] && echo "$f" && return; done; true; }

ensure_packages() {
  local p missing=0
  for p in gridengine-master gridengine-exec gridengine-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing=1
  done
  if [ $missing = 0 ] && [ -s "$SGE_ROOT/$SGE_CELL/common/act_qmaster" ]; then return; fi
  [ "${HPCVOD_SANDBOX_NO_APT:-0}" = 1 ] && die "gridengine is not installed and HPCVOD_SANDBOX_NO_APT=1"
  # the package scripts create the cell "default" with this machine as master
  debconf-set-selections <<EOF
gridengine-common shared/gridenginemaster string $HOST
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean true
EOF
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d; own_policy=1; fi
  say "installing gridengine"
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends gridengine-master gridengine-exec \
      gridengine-client >/dev/null; } || { [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get failed"; }
  [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ -s "$SGE_ROOT/$SGE_CELL/common/act_qmaster" ] || die "gridengine installed but its cell was not created"
}

cmd_up() {
  [ "$(id -u)" = 0 ] || EXIT=2 die "up needs root"
  [[ $SLOTS =~ ^[1-9][0-9]*$ ]] || EXIT=2 die "HPCVOD_SGE_SLOTS must be a positive integer, got '$SLOTS'"
  mkdir -p "$RUN"
  exec 9>"$RUN/.lock"; flock 9
  ensure_packages
  # Grid Engine compares the name a client's address resolves to with the name it reports: when this machine's
  # name resolves to a loopback address ("localhost"), both must be declared the same host.
  local aliases=$SGE_ROOT/$SGE_CELL/common/host_aliases
  grep -qx "$HOST localhost" "$aliases" 2>/dev/null || echo "$HOST localhost" >> "$aliases"
  mkdir -p /var/run/gridengine && chown sgeadmin /var/run/gridengine
  if ! pid_alive "$SPOOL/qmaster/qmaster.pid" sge_qmaster; then
    /usr/sbin/sge_qmaster 9>&-
    for _ in $(seq 100); do qconf -sh >/dev/null 2>&1 && break; sleep 0.1; done
    qconf -sh >/dev/null 2>&1 || die "sge_qmaster did not come up (see $SPOOL/qmaster/messages)"
    cp "$SPOOL/qmaster/qmaster.pid" "$RUN/qmaster.pid"   # ours: down stops it
  fi
  say "qmaster up"
  # configuration, each step only when not done yet
  qconf -ss 2>/dev/null | grep -qx "$HOST" || qconf -as "$HOST" >/dev/null 2>&1
  qconf -sconf | grep -q '^min_uid *0$' || edit_with "-e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/'" -- -mconf
  if ! qconf -sp mpi >/dev/null 2>&1; then
    local pe; pe=$(mktemp)
    # qsort_args must be NONE (the package's template leaves it empty, which qconf rejects)
    printf '%s\n' "pe_name mpi" "slots 9999" "user_lists NONE" "xuser_lists NONE" "start_proc_args NONE" \
      "stop_proc_args NONE" 'allocation_rule $fill_up' "control_slaves TRUE" "job_is_first_task FALSE" \
      "urgency_slots min" "accounting_summary FALSE" "qsort_args NONE" > "$pe"
    qconf -Ap "$pe" >/dev/null 2>&1; rm -f "$pe"
  fi
  if ! qconf -sq all.q >/dev/null 2>&1; then
    edit_with "-e 's/^qname .*/qname all.q/' -e 's/^hostlist .*/hostlist $HOST/' -e 's/^pe_list .*/pe_list mpi/' \
      -e 's|^shell .*|shell /bin/bash|' -e 's/^h_rt .*/h_rt 04:00:00/' -e 's/^load_thresholds .*/load_thresholds NONE/'" \
      -- -aq
  fi
  qconf -sq all.q | grep -q "^slots *$SLOTS\$" || qconf -mattr queue slots "$SLOTS" all.q >/dev/null
  # schedule every second, and do not hold back slots for the load a job is expected to add (a toy machine)
  qconf -ssconf | grep -q '^schedule_interval *0:0:1$' || edit_with \
    "-e 's/^schedule_interval .*/schedule_interval 0:0:1/' -e 's/^job_load_adjustments .*/job_load_adjustments NONE/' \
     -e 's/^load_adjustment_decay_time .*/load_adjustment_decay_time 0:0:0/'" -- -msconf
  local execd_pid; execd_pid=$(execd_pidfile)
  if [ -z "$execd_pid" ] || ! pid_alive "$execd_pid" sge_execd; then
    /usr/sbin/sge_execd 9>&-
    for _ in $(seq 100); do execd_pid=$(execd_pidfile); [ -n "$execd_pid" ] && pid_alive "$execd_pid" sge_execd && break; sleep 0.1; done
    pid_alive "$execd_pid" sge_execd || die "sge_execd did not come up"
    cp "$execd_pid" "$RUN/execd.pid"
  fi
  for _ in $(seq 200); do
    qstat -f -q all.q 2>/dev/null | awk '/^all.q@/ {print ($6 == "" ? "ok" : $6)}' | grep -qx ok && break
    sleep 0.1
  done
  qstat -f -q all.q | awk '/^all.q@/ {exit ($6 == "" ? 0 : 1)}' || die "queue all.q not usable: $(qstat -f -q all.q)"
  say "Grid Engine up: queue all.q ($SLOTS slots on $HOST), parallel environment mpi"
}

cmd_down() {
  [ -d "$RUN" ] || { say "nothing to stop"; return 0; }
  exec 9>"$RUN/.lock"; flock 9
  if pid_alive "$RUN/qmaster.pid" sge_qmaster && [ -n "$(qstat -u '*' 2>/dev/null)" ]; then
    qdel -u '*' >/dev/null 2>&1 || true
    for _ in $(seq 100); do [ -z "$(qstat -u '*' 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  # only what this script started (its PID copies); a Grid Engine that was running before is left alone
  # both at once: each takes a few seconds to stop
  local pids=() f
  for f in "$RUN/execd.pid:sge_execd" "$RUN/qmaster.pid:sge_qmaster"; do
    pid_alive "${f%:*}" "${f##*:}" && pids+=("$(cat "${f%:*}")")
  done
  for f in "${pids[@]}"; do stop_pid "$f" & done
  wait
  rm -f "$RUN/execd.pid" "$RUN/qmaster.pid"
  say "down"
}

cmd_status() {
  if ! qstat -f -q all.q >/dev/null 2>&1; then echo "sge-sandbox: down"; return 1; fi
  qstat -f -q all.q
  qstat -f -q all.q | awk '/^all.q@/ {exit ($6 == "" ? 0 : 1)}'
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) EXIT=2 die "usage: $0 up | down | status" ;;
esac
