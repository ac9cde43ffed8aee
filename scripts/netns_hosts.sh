#!/usr/bin/env bash
# N "hosts" on this one machine as network namespaces, for real multi-node launch tests:
#   scripts/netns_hosts.sh up N | down | status
#
# Each host hK is a network namespace (named ${PREFIX}hK) with its own address on a private /24
# (checked unused; no default route, so traffic never leaves the machine), its own hostname
# (hK, through `unshare --uts`) and hosts file (/etc/netns/<ns>/hosts maps h0..hN-1), and its own
# sshd (config, host key and PID file under the run folder; key-only root login, UsePAM no).
# A bridge in the root namespace joins them; the root side holds .1 so it can ssh in.
#
# `up` writes, under the run folder ($LLMCTL_NETNS_DIR, default /tmp/llmctl-netns):
#   hostfile     one host per line (h0, h1, ...)
#   ssh_config   for `ssh -F ssh_config hK` (key, BatchMode, no known_hosts), used by the launcher
#   id_ed25519   the client key
# Override the subnet with LLMCTL_NETNS_SUBNET=10.213.7 (first three octets); a second, separate
# set needs its own LLMCTL_NETNS_DIR, _PREFIX, _BRIDGE and _VETH. Needs root.
set -euo pipefail

DIR="${LLMCTL_NETNS_DIR:-/tmp/llmctl-netns}"
PREFIX="${LLMCTL_NETNS_PREFIX:-llmctl-}"
BRIDGE="${LLMCTL_NETNS_BRIDGE:-llmctlbr0}"
VETH="${LLMCTL_NETNS_VETH:-llmv}"  # root-side link names: ${VETH}-hK (<= 15 chars)
SSHD=/usr/sbin/sshd

log() { echo "netns_hosts: $*" >&2; }
die() { log "error: $*"; exit 1; }
# One up/down at a time (test sessions may start together). Daemons get 9>&- so they do
# not inherit (and hold) the lock.
lock() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 300 9 || die "another up/down holds $DIR/.lock"
}

need_root() { [[ $(id -u) == 0 ]] || die "needs root (network namespaces); run with sudo"; }

alive() {
  local pidfile=$1 pid state
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/stat ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z && $state != X ]]
}

install_packages() {
  [[ -x $SSHD ]] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null && return 0
  command -v apt-get >/dev/null 2>&1 || die "no sshd and no apt-get: install openssh-server"
  log "installing openssh-server openssh-client (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null \
    || die "apt-get install openssh-server failed"
}

# First /24 among candidates that no address or route of this machine touches.
pick_subnet() {
  if [[ -n ${LLMCTL_NETNS_SUBNET:-} ]]; then echo "$LLMCTL_NETNS_SUBNET"; return; fi
  local used cand
  used=$( { ip -4 -o addr show; ip -4 route show table all; } 2>/dev/null)
  for cand in 10.213.{7..250}; do
    grep -q "${cand//./\\.}\." <<<"$used" || { echo "$cand"; return; }
  done
  die "no free 10.213.x.0/24 subnet"
}

ssh_keys() {
  [[ -s $DIR/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C llmctl-netns -f "$DIR/id_ed25519"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/id_ed25519" "$DIR/authorized_keys"
}

host_up() {
  local i=$1 n=$2 net=$3 ns="${PREFIX}h$i" h="h$i" addr="$3.$((i + 2))" hd="$DIR/h$i"
  mkdir -p "$hd" "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    local k
    for k in $(seq 0 $((n - 1))); do echo "$net.$((k + 2)) h$k"; done
  } >"/etc/netns/$ns/hosts"
  ip netns add "$ns"
  ip link add "$VETH-$h" type veth peer name "$VETH-p$i"
  ip link set "$VETH-p$i" netns "$ns"
  ip -n "$ns" link set "$VETH-p$i" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip link set "$VETH-$h" master "$BRIDGE" up
  [[ -s $hd/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$hd/ssh_host_ed25519_key"
  cat >"$hd/sshd_config" <<EOF
Port 22
ListenAddress $addr
HostKey $hd/ssh_host_ed25519_key
PidFile $hd/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile $DIR/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
MaxStartups 64:30:128
MaxSessions 64
EOF
  ip netns exec "$ns" unshare --uts sh -c "hostname $h; exec $SSHD -f '$hd/sshd_config' -E '$hd/sshd.log'" 9>&-
}

write_client_files() {
  local n=$1 net=$2 i
  : >"$DIR/hostfile"
  : >"$DIR/ssh_config"
  for i in $(seq 0 $((n - 1))); do
    echo "h$i" >>"$DIR/hostfile"
    cat >>"$DIR/ssh_config" <<EOF
Host h$i
  HostName $net.$((i + 2))
EOF
  done
  cat >>"$DIR/ssh_config" <<EOF
Host *
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 5
EOF
  echo "$net" >"$DIR/subnet"
}

wait_ssh() {
  local n=$1 i k
  for i in $(seq 0 $((n - 1))); do
    for k in $(seq 50); do
      ssh -F "$DIR/ssh_config" "h$i" true 2>/dev/null && break
      [[ $k == 50 ]] && die "ssh to h$i fails; see $DIR/h$i/sshd.log"
      sleep 0.1
    done
  done
}

up() {
  local n=${1:-2}
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "N must be 1..99, got '$n'"
  need_root
  install_packages
  if [[ -s $DIR/hostfile ]]; then
    if [[ $(wc -l <"$DIR/hostfile") == "$n" ]] && status >/dev/null 2>&1; then
      log "already up: $n hosts (hostfile $DIR/hostfile, ssh config $DIR/ssh_config)"; return 0
    fi
  fi
  down >/dev/null 2>&1 || true
  mkdir -p "$DIR" /run/sshd
  chmod 700 "$DIR"
  local net i
  net=$(pick_subnet)
  ssh_keys
  ip link add "$BRIDGE" type bridge
  ip addr add "$net.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 0 $((n - 1))); do host_up "$i" "$n" "$net"; done
  write_client_files "$n" "$net"
  wait_ssh "$n"
  log "up: $n hosts on $net.0/24 (hostfile $DIR/hostfile, ssh config $DIR/ssh_config)"
}

down() {
  need_root
  local hd ns pid link
  for hd in "$DIR"/h*/; do
    [[ -d $hd ]] || continue
    if alive "$hd/sshd.pid"; then kill -TERM "$(<"$hd/sshd.pid")" 2>/dev/null || true; fi
    rm -f "$hd/sshd.pid"
  done
  # Our namespaces (by prefix) and whatever still runs inside them (sshd, launched ranks).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}h[0-9]+$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -TERM "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
                | grep -E "^$VETH-h[0-9]+$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$DIR/hostfile" "$DIR/ssh_config" "$DIR/subnet"
  log "down"
}

status() {
  [[ -s $DIR/hostfile ]] || { echo "no hosts (run: $0 up N)"; return 1; }
  local h rc=0
  while read -r h; do
    if alive "$DIR/$h/sshd.pid" && ssh -n -F "$DIR/ssh_config" "$h" true 2>/dev/null; then
      echo "$h: up ($(grep -A1 "^Host $h\$" "$DIR/ssh_config" | awk '/HostName/ {print $2}'))"
    else echo "$h: unreachable"; rc=1; fi
  done <"$DIR/hostfile"
  echo "hostfile: $DIR/hostfile  ssh config: $DIR/ssh_config"
  return $rc
}

case "${1:-}" in
  up) lock; up "${2:-2}" ;;
  down) lock; down ;;
  status) status ;;
  *) echo "usage: $0 up N|down|status   (run folder: \$LLMCTL_NETNS_DIR, default /tmp/llmctl-netns)" >&2; exit 2 ;;
esac
