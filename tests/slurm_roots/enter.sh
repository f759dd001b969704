#!/bin/sh
# Run one command inside a Slurm root (tests/slurm_roots/build.sh), as if it ran on the host.
#
#   tests/slurm_roots/enter.sh ROOT [BIND...] -- COMMAND [ARG...]
#
# The command gets a private mount namespace (unshare -m) holding /proc, /dev, /sys, /etc/hosts and
# every BIND (a host path, bound at the same path inside the root: the repository, the temp dir,
# the Python interpreter's prefix), then chroot ROOT, then the caller's working directory. The
# mounts exist only in that namespace: they vanish with the last process in it (a daemon, a job),
# so nothing is ever left mounted on the host and the root can be deleted safely once its
# processes are gone. Every stage execs, so the command keeps this script's pid (the cluster
# records daemon pids and their parent-death signal).
#
# $SLURM_ROOT_SHIMS (a directory of client-command shims that call this script) is dropped from
# PATH inside: a job submitted through a shim inherits PATH and must find the root's own commands.
set -eu
[ $# -ge 3 ] || { echo "usage: enter.sh ROOT [BIND...] -- COMMAND [ARG...]" >&2; exit 2; }
ROOT=$1
shift
BINDS=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  BINDS="$BINDS $1"
  shift
done
[ "${1:-}" = "--" ] || { echo "enter.sh: missing -- before the command" >&2; exit 2; }
shift
if [ -n "${SLURM_ROOT_SHIMS:-}" ]; then
  kept=""
  old_ifs=$IFS
  IFS=:
  for entry in $PATH; do
    [ "$entry" = "$SLURM_ROOT_SHIMS" ] || kept="${kept:+$kept:}$entry"
  done
  IFS=$old_ifs
  PATH=$kept
  export PATH
  unset SLURM_ROOT_SHIMS
fi
HERE=$(pwd -P 2>/dev/null || echo /)
export SLURM_ROOT_ENTER_ROOT="$ROOT" SLURM_ROOT_ENTER_BINDS="$BINDS" SLURM_ROOT_ENTER_CWD="$HERE"
exec unshare -m --propagation private /bin/sh -euc '
  R=$SLURM_ROOT_ENTER_ROOT
  mount -t proc proc "$R/proc"
  mount --rbind /dev "$R/dev"
  mount --rbind /sys "$R/sys" 2>/dev/null || true
  mount --bind /etc/hosts "$R/etc/hosts"
  for b in $SLURM_ROOT_ENTER_BINDS; do
    [ -e "$b" ] || continue
    if [ -d "$b" ]; then mkdir -p "$R$b"; else mkdir -p "$R$(dirname "$b")"; [ -e "$R$b" ] || : >"$R$b"; fi
    mount --rbind "$b" "$R$b"
  done
  cwd=$SLURM_ROOT_ENTER_CWD
  unset SLURM_ROOT_ENTER_ROOT SLURM_ROOT_ENTER_BINDS SLURM_ROOT_ENTER_CWD
  exec chroot "$R" /bin/sh -c "cd \"\$0\" 2>/dev/null || cd /; exec \"\$@\"" "$cwd" "$@"
' enter "$@"
