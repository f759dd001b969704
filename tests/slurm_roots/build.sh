#!/usr/bin/env bash
# Build, or reuse, a Debian root that holds Slurm VERSION, for the cluster tests on that version.
#
#   tests/slurm_roots/build.sh VERSION [DIR]      VERSION: 24.11 (Debian trixie) | 26.05 (Debian sid)
#
# DIR defaults to $SLURM_TEST_ROOTS/VERSION (default /var/cache/slurm-supervisor/roots).
# Idempotent and cached: a root that is complete (its stamp file is there and its slurmctld reports
# VERSION) is reused at once. A root is built beside DIR and renamed into place only when complete,
# so an interrupted build never looks complete. Every mount it needs (/proc, /dev for the package
# scripts) lives in a private mount namespace (unshare -m) and vanishes with it: nothing is left
# mounted, whatever happens. Needs root, debootstrap, unshare and Debian's mirror.
#
# The root gets munge, slurm-wlm (slurmctld, slurmd, client commands), slurmdbd, python3 and python3-venv;
# python3 also brings the shared libraries (libssl, libffi, libsqlite3, ...) that the host's
# interpreter needs when the tests run it inside the root (tests/slurm_roots/enter.sh binds it).
set -euo pipefail

VERSION="${1:?usage: build.sh VERSION [DIR]  (VERSION: 24.11 or 26.05)}"
ROOTS="${SLURM_TEST_ROOTS:-/var/cache/slurm-supervisor/roots}"
DIR="${2:-$ROOTS/$VERSION}"
MIRROR="${SLURM_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="munge slurm-wlm python3 python3-venv procps"
PACKAGES="$PACKAGES slurmdbd"  # accounting for the QOS tests (the database is the host's MariaDB)

case "$VERSION" in
  24.11) SUITE=trixie ;;
  26.05) SUITE=sid ;;
  *) echo "build.sh: no Debian suite known for Slurm $VERSION (known: 24.11 trixie, 26.05 sid)" >&2; exit 2 ;;
esac

log() { printf '[build %s] %s\n' "$VERSION" "$*" >&2; }
mounted_under() { awk -v d="$1" '$5 == d || index($5, d "/") == 1 {found=1} END {exit !found}' /proc/self/mountinfo; }
safe_rm() {  # never delete through a mount (a bind of /tmp inside a root would take /tmp with it)
  [ -e "$1" ] || return 0
  if mounted_under "$1"; then log "refusing to remove $1: something is mounted under it"; exit 1; fi
  rm -rf --one-file-system "$1"
}
complete() {
  [ -f "$1/.slurm-root.json" ] && [ -x "$1/usr/sbin/slurmctld" ] && [ -x "$1/usr/sbin/slurmdbd" ] \
    && chroot "$1" /usr/sbin/slurmctld -V 2>/dev/null | grep -q " ${VERSION//./\\.}\."
}

if [ "$(id -u)" != 0 ]; then echo "build.sh: needs root (debootstrap, chroot)" >&2; exit 1; fi
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9  # one build of a root at a time; a second caller waits, then finds it complete

if complete "$DIR"; then
  log "cached: $DIR ($(chroot "$DIR" /usr/sbin/slurmctld -V))"
  exit 0
fi
for tool in debootstrap unshare chroot; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (apt-get install -y debootstrap util-linux)" >&2; exit 1; }
done

start=$(date +%s)
TMP="$DIR.building"
safe_rm "$TMP"
log "debootstrap $SUITE into $TMP"
# Inside unshare -m: debootstrap mounts /proc etc. in the target; those mounts die with the namespace.
unshare -m --propagation private debootstrap --variant=minbase "$SUITE" "$TMP" "$MIRROR" >"$DIR.debootstrap.log" 2>&1 \
  || { tail -30 "$DIR.debootstrap.log" >&2; log "debootstrap failed (log: $DIR.debootstrap.log)"; exit 1; }
log "debootstrap done after $(( $(date +%s) - start )) s"

# No service starts inside the root; sid's Release may be past Valid-Until on a snapshot mirror.
printf '#!/bin/sh\nexit 101\n' >"$TMP/usr/sbin/policy-rc.d"
chmod 755 "$TMP/usr/sbin/policy-rc.d"
printf 'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n' >"$TMP/etc/apt/apt.conf.d/99slurm-root"
cp /etc/hosts "$TMP/etc/hosts"
cp /etc/resolv.conf "$TMP/etc/resolv.conf" 2>/dev/null || true

log "apt-get install $PACKAGES"
unshare -m --propagation private /bin/sh -euc '
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  chroot "$1" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C /bin/sh -euc "
    apt-get -q update
    apt-get -q install -y $2
    apt-get clean
  "
' sh "$TMP" "$PACKAGES" >"$DIR.apt.log" 2>&1 \
  || { tail -30 "$DIR.apt.log" >&2; log "apt-get failed (log: $DIR.apt.log)"; exit 1; }

got="$(chroot "$TMP" /usr/sbin/slurmctld -V)"
case "$got" in
  *" $VERSION."*) ;;
  *) log "$SUITE gave '$got', not Slurm $VERSION: the suite moved on; update build.sh"; exit 1 ;;
esac
elapsed=$(( $(date +%s) - start ))
cat >"$TMP/.slurm-root.json" <<JSON
{"version": "$VERSION", "suite": "$SUITE", "slurm": "$got", "munge": "$(chroot "$TMP" /usr/sbin/munged -V 2>&1 | head -1)", "python3": "$(chroot "$TMP" /usr/bin/python3 -V 2>&1)", "built": "$(date -u +%FT%TZ)", "build_seconds": $elapsed}
JSON
safe_rm "$DIR"
mv "$TMP" "$DIR"
log "built $DIR in ${elapsed} s: $got"
