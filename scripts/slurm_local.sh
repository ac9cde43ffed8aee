#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for tests and demos: scripts/slurm_local.sh up|down|status
#
# Installs the Debian packages if missing (slurmctld slurmd slurm-client munge), writes its
# configuration, state, logs and PID files under one run folder ($LLMCTL_SLURM_DIR, default
# /tmp/llmctl-slurm), starts munged (as the munge user), slurmctld and slurmd, and waits until
# `sinfo` shows the node idle. Idempotent: `up` on a running cluster only checks it.
# `down` stops the daemons it started by the PIDs in their PID files (never by name).
# Needs root (the daemons run as root, without systemd).
#
# Clients (sbatch, sinfo, scontrol) find the configuration through /etc/slurm/slurm.conf, which
# `up` makes a link to the run folder's file when nothing else is there; otherwise export
# SLURM_CONF=<run folder>/etc/slurm.conf (printed by `up` and `status`).
#
# Several nodes: LLMCTL_SLURM_NETNS=N (2..9) makes a separate cluster of N nodes h0..hN-1, each a
# network namespace (scripts/netns_hosts.sh, its own set under the run folder) with its own
# slurmd; slurmctld listens on the bridge's .1 address. Give it its own run folder and port,
# e.g. LLMCTL_SLURM_DIR=/tmp/llmctl-slurm-netns LLMCTL_SLURMCTLD_PORT=6917; clients then need
# SLURM_CONF=<run folder>/etc/slurm.conf (no /etc/slurm link is made). LLMCTL_SLURM_TOPOLOGY
# ("leaf0=h[0-1] leaf1=h2") adds TopologyPlugin=topology/tree and a topology.conf of those leaf
# switches under one spine; LLMCTL_SLURM_SWITCH_WAIT (seconds, default 10) is max_switch_wait.
# LLMCTL_SLURM_NETNS_TAG (a few letters) names a second netns cluster's namespaces, bridge and
# links apart from the first one's; LLMCTL_SLURMD_TIMEOUT (seconds, default SLURM's 300) is how
# long slurmctld waits for a silent node before it sets it DOWN and fails (or requeues) its jobs.
# LLMCTL_SLURM_CRED_EXPIRE (seconds, SLURM's default 120) is the job credential lifetime: SLURM
# holds a requeued job that long (+1 s) before it may start again.
set -euo pipefail

DIR="${LLMCTL_SLURM_DIR:-/tmp/llmctl-slurm}"
NETNS_N="${LLMCTL_SLURM_NETNS:-0}"
TOPOLOGY="${LLMCTL_SLURM_TOPOLOGY:-}"
SWITCH_WAIT="${LLMCTL_SLURM_SWITCH_WAIT:-10}"
NETNS_TAG="${LLMCTL_SLURM_NETNS_TAG:-}"
SLURMD_TIMEOUT="${LLMCTL_SLURMD_TIMEOUT:-300}"
CRED_EXPIRE="${LLMCTL_SLURM_CRED_EXPIRE:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
CONF="$DIR/etc/slurm.conf"
SYS_CONF=/etc/slurm/slurm.conf
CTLD_PORT="${LLMCTL_SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${LLMCTL_SLURMD_PORT:-6818}"
WAIT_S="${LLMCTL_SLURM_WAIT_S:-60}"
PACKAGES=(slurmctld slurmd slurm-client munge)

log() { echo "slurm_local: $*" >&2; }
die() { log "error: $*"; exit 1; }

# A PID file names a live process (not a zombie).
alive() {
  local pidfile=$1 pid state
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/stat ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z && $state != X ]]
}

# One up/down at a time (test sessions may start together). Daemons get 9>&- so they do
# not inherit (and hold) the lock.
lock() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 300 9 || die "another up/down holds $DIR/.lock"
}

need_root() { [[ $(id -u) == 0 ]] || die "needs root (daemons run as root without systemd); run with sudo"; }

install_packages() {
  local missing=0 bin
  for bin in slurmctld slurmd sinfo sbatch munged munge unmunge; do
    command -v "$bin" >/dev/null 2>&1 || missing=1
  done
  [[ $missing == 0 ]] && return 0
  command -v apt-get >/dev/null 2>&1 || die "slurm/munge not installed and no apt-get: install ${PACKAGES[*]}"
  log "installing ${PACKAGES[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null \
    || die "apt-get install ${PACKAGES[*]} failed"
}

start_munge() {
  mkdir -p /run/munge /etc/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return 0   # a munged is already serving the default socket (ours or the system's)
  fi
  touch "$DIR/run/munged.pid" && chown munge:munge "$DIR/run/munged.pid"
  runuser -u munge -- /usr/sbin/munged --pid-file="$DIR/run/munged.pid" --force 9>&- \
    || die "munged failed to start (see /var/log/munge/munged.log)"
  local i
  for i in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "munge -n | unmunge fails after starting munged"
}

# cgroup v1 process tracking when the freezer/cpuset/memory hierarchies are writable, else linuxproc.
cgroup_usable() {
  [[ ${LLMCTL_SLURM_NO_CGROUP:-0} == 1 ]] && return 1
  local c probe
  for c in freezer cpuset memory; do
    [[ -d /sys/fs/cgroup/$c ]] || return 1
    probe="/sys/fs/cgroup/$c/llmctl_probe_$$"
    mkdir "$probe" 2>/dev/null || return 1
    rmdir "$probe"
  done
}

# The netns host set of a multi-node cluster: its own folder, names, bridge and links.
netns_env() {
  [[ $NETNS_TAG =~ ^[a-z]{0,4}$ ]] || die "LLMCTL_SLURM_NETNS_TAG must be 0..4 letters a-z, got '$NETNS_TAG'"
  export LLMCTL_NETNS_DIR="$DIR/netns" LLMCTL_NETNS_PREFIX="llmslurm$NETNS_TAG-" \
    LLMCTL_NETNS_BRIDGE="llmslurmbr${NETNS_TAG:-0}" LLMCTL_NETNS_VETH="llms$NETNS_TAG"
}

# NodeName/PartitionName lines of the cluster.
node_lines() {
  local host=$1 cpus=$2 mem=$3 net i nodes=$1
  if (( NETNS_N == 0 )); then
    echo "NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN"
  else
    net=$(<"$DIR/netns/subnet")
    nodes="h[0-$((NETNS_N - 1))]"
    for i in $(seq 0 $((NETNS_N - 1))); do
      # every node is the whole machine; slurmd -C must not find fewer CPUs than stated
      echo "NodeName=h$i NodeAddr=$net.$((i + 2)) NodeHostname=h$i CPUs=$cpus RealMemory=$((mem / NETNS_N)) State=UNKNOWN"
    done
  fi
  echo "PartitionName=local Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
}

topology_conf() {
  local leaves=() pair
  rm -f "$DIR/etc/topology.conf"
  [[ -n $TOPOLOGY ]] || return 0
  {
    echo "# Written by scripts/slurm_local.sh from LLMCTL_SLURM_TOPOLOGY."
    for pair in $TOPOLOGY; do
      [[ $pair == *=* ]] || die "LLMCTL_SLURM_TOPOLOGY entry '$pair' is not SWITCH=NODES"
      echo "SwitchName=${pair%%=*} Nodes=${pair#*=}"
      leaves+=("${pair%%=*}")
    done
    echo "SwitchName=spine Switches=$(IFS=,; echo "${leaves[*]}")"
  } >"$DIR/etc/topology.conf"
  chmod 0644 "$DIR/etc/topology.conf"
}

write_config() {
  local host node_line track task ctld_host sched=batch_sched_delay=0 topo=topology/none per_node=
  host=$(hostname -s)
  ctld_host=$host
  if (( NETNS_N > 0 )); then
    ctld_host="$host($(<"$DIR/netns/subnet").1)"
    per_node=-%n  # one spool, PID file and log per slurmd
    sched="$sched,sched_interval=2,bf_interval=2"  # a job SLURM stops holding starts soon after
    LLMCTL_SLURM_NO_CGROUP=1  # several slurmds on one cgroup tree would share job cgroups
    netns_env
  fi
  topology_conf
  if [[ -n $TOPOLOGY ]]; then
    topo=topology/tree
    sched="$sched,max_switch_wait=$SWITCH_WAIT"
  fi
  getent hosts "$host" >/dev/null || die "hostname '$host' does not resolve: add '127.0.0.1 $host' to /etc/hosts"
  node_line=$(slurmd -C 2>/dev/null | head -1)
  [[ $node_line == NodeName=* ]] || die "slurmd -C printed no node line"
  # Keep CPUs and memory only; sockets/cores layout from slurmd -C can disagree inside a VM.
  local cpus mem
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
  if cgroup_usable; then
    track=proctrack/cgroup; task=task/cgroup,task/affinity
    cat >"$DIR/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
EOF
  else
    track=proctrack/linuxproc; task=task/none
    rm -f "$DIR/etc/cgroup.conf"
  fi
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a one-node cluster for tests. Do not edit; rerun 'up'.
ClusterName=llmctl-local
SlurmctldHost=$ctld_host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool$per_node
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd$per_node.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd$per_node.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=$track
TaskPlugin=$task
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=$sched
TopologyPlugin=$topo
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=300
KillWait=30
SlurmdTimeout=$SLURMD_TIMEOUT
${CRED_EXPIRE:+AuthInfo=cred_expire=$CRED_EXPIRE}
InactiveLimit=0
$(node_lines "$host" "$cpus" "$mem")
EOF
  chmod 0644 "$CONF"
  (( NETNS_N == 0 )) || return 0  # clients of a netns cluster use SLURM_CONF
  # Link the client config when /etc/slurm/slurm.conf is free, ours, or a dangling link.
  mkdir -p /etc/slurm
  if [[ ! -e $SYS_CONF || ( -L $SYS_CONF && $(readlink "$SYS_CONF") == "$CONF" ) ]]; then
    ln -sfn "$CONF" "$SYS_CONF"
  else
    log "note: $SYS_CONF is not ours; clients need: export SLURM_CONF=$CONF"
  fi
}

# The cluster's node names, one per line.
nodes() {
  if (( NETNS_N == 0 )); then hostname -s; else seq -f 'h%g' 0 $((NETNS_N - 1)); fi
}

slurmd_pidfile() { if (( NETNS_N == 0 )); then echo "$DIR/run/slurmd.pid"; else echo "$DIR/run/slurmd-$1.pid"; fi; }

start_slurmd() {
  local node=$1
  alive "$(slurmd_pidfile "$node")" && return 0
  if (( NETNS_N == 0 )); then
    slurmd -f "$CONF" 9>&- || die "slurmd failed; see $DIR/log/slurmd.log"
  else
    # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs the cgroup mount under
    # it; the namespace's hosts file is bound over /etc/hosts in a private mount namespace.
    local ns="${LLMCTL_NETNS_PREFIX}$node"
    mkdir -p "$DIR/spool-$node"
    nsenter --net="/run/netns/$ns" unshare --uts --mount sh -c \
      "mount --bind /etc/netns/$ns/hosts /etc/hosts && hostname $node && exec slurmd -f '$CONF'" 9>&- \
      || die "slurmd of $node failed; see $DIR/log/slurmd-$node.log"
  fi
}

wait_idle() {
  local i state node
  for node in $(nodes); do
    for i in $(seq $((WAIT_S * 5))); do
      state=$(SLURM_CONF=$CONF sinfo -h -n "$node" -o '%T' 2>/dev/null | head -1 || true)
      case $state in
        idle|mixed|allocated|completing) break ;;
        down*|drain*|fail*) SLURM_CONF=$CONF scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
      esac
      (( i == WAIT_S * 5 )) && die "node '$node' not idle after ${WAIT_S}s (state: ${state:-none}); see $DIR/log/"
      sleep 0.2
    done
  done
}

all_alive() {
  local node
  alive "$DIR/run/slurmctld.pid" || return 1
  for node in $(nodes); do alive "$(slurmd_pidfile "$node")" || return 1; done
}

up() {
  need_root
  install_packages
  mkdir -p "$DIR"/{etc,state,spool,run,log}
  if (( NETNS_N > 0 )); then
    [[ $NETNS_N =~ ^[2-9]$ ]] || die "LLMCTL_SLURM_NETNS must be 2..9, got '$NETNS_N'"
    netns_env
    bash "$HERE/netns_hosts.sh" up "$NETNS_N"
  fi
  if all_alive; then
    wait_idle
    log "already up (SLURM_CONF=$CONF)"
    return 0
  fi
  start_munge
  write_config
  alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF" 9>&- || die "slurmctld failed; see $DIR/log/slurmctld.log"
  local node
  for node in $(nodes); do start_slurmd "$node"; done
  wait_idle
  log "up: node(s) $(nodes | paste -sd, -) idle (SLURM_CONF=$CONF)"
}

stop_pidfile() {
  local pidfile=$1 name=$2 pid i
  if ! alive "$pidfile"; then rm -f "$pidfile"; return 0; fi
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do
    alive "$pidfile" || { rm -f "$pidfile"; log "stopped $name ($pid)"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  log "killed $name ($pid)"
}

down() {
  need_root
  local node
  for node in $(nodes); do stop_pidfile "$(slurmd_pidfile "$node")" "slurmd $node"; done
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  # munged serves every cluster on this machine (the first `up` starts it): keep it while
  # another cluster's slurmctld runs.
  if pgrep -x slurmctld >/dev/null; then
    alive "$DIR/run/munged.pid" && log "munged left running: another slurmctld uses it"
  else
    stop_pidfile "$DIR/run/munged.pid" munged
  fi
  if [[ -L $SYS_CONF && $(readlink "$SYS_CONF") == "$CONF" ]]; then rm -f "$SYS_CONF"; fi
  # State is dropped so the next 'up' starts clean (job ids restart, no stale jobs).
  rm -rf "$DIR/state" "$DIR/spool"
  if (( NETNS_N > 0 )); then netns_env; bash "$HERE/netns_hosts.sh" down; fi
}

status() {
  local d rc=0
  local pidfiles=(munged slurmctld) node
  for node in $(nodes); do pidfiles+=("$(basename "$(slurmd_pidfile "$node")" .pid)"); done
  for d in "${pidfiles[@]}"; do
    if alive "$DIR/run/$d.pid"; then echo "$d: running (pid $(<"$DIR/run/$d.pid"))"
    elif [[ $d == munged ]] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munged: running (not started here)"
    else echo "$d: stopped"; rc=1; fi
  done
  echo "SLURM_CONF=$CONF"
  [[ $rc == 0 ]] && SLURM_CONF=$CONF sinfo 2>&1
  return $rc
}

# A netns node's crash and return, for fault tests: `crash-node hK` SIGKILLs every process in
# the node's namespace (slurmd, job steps, ranks, sshd) and cuts its link, as a power loss
# would; `restore-node hK` brings the link back and starts its slurmd again (ReturnToService=2
# makes a node SLURM set DOWN for not answering usable once it registers).
node_ns() {
  (( NETNS_N > 0 )) || die "$1 needs a netns cluster (LLMCTL_SLURM_NETNS=N)"
  [[ ${2:-} =~ ^h[0-9]$ ]] && (( ${2#h} < NETNS_N )) || die "$1: no node '${2:-}' (h0..h$((NETNS_N - 1)))"
  netns_env
  [[ -e /run/netns/${LLMCTL_NETNS_PREFIX}$2 ]] || die "$1: namespace ${LLMCTL_NETNS_PREFIX}$2 is not up"
}

crash_node() {
  need_root; node_ns crash-node "${1:-}"
  local pids
  pids=$(ip netns pids "${LLMCTL_NETNS_PREFIX}$1" | tr '\n' ' ')
  [[ -n ${pids// } ]] && kill -KILL $pids 2>/dev/null || true
  ip link set "${LLMCTL_NETNS_VETH}-$1" down
  rm -f "$(slurmd_pidfile "$1")"
  log "crashed $1: killed ${pids:-nothing}, link down"
}

restore_node() {
  need_root; node_ns restore-node "${1:-}"
  ip link set "${LLMCTL_NETNS_VETH}-$1" up
  start_slurmd "$1"
  log "restored $1: link up, slurmd started"
}

case "${1:-}" in
  up) lock; up ;;
  down) lock; down ;;
  status) status ;;
  crash-node) crash_node "${2:-}" ;;
  restore-node) restore_node "${2:-}" ;;
  *) echo "usage: $0 up|down|status|crash-node hK|restore-node hK   (run folder: \$LLMCTL_SLURM_DIR, default /tmp/llmctl-slurm)" >&2; exit 2 ;;
esac
