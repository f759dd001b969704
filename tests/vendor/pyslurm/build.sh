#!/usr/bin/env bash
# Build, or reuse, pyslurm for one test cluster's Slurm, from the archives beside this script.
#
#   tests/vendor/pyslurm/build.sh VERSION      VERSION: 22.05 (the host's Slurm) | 24.11 (the Debian root)
#
# Prints, as its last line on stdout, the directory to put on PYTHONPATH to import that pyslurm, as
# the processes of that cluster see it (README.md beside this script says why each lives where):
#   22.05: /var/cache/slurm-supervisor/pyslurm/22.05/site       (on the host)
#   24.11: /opt/slurm-supervisor/pyslurm-24.11                   (inside the 24.11 root only)
#
# Both are built and run by the interpreter that runs the tests ($PYTHON, default python3): the
# 24.11 one inside the root (tests/slurm_roots/enter.sh binds the interpreter there, as it does for
# every job of the 24.11 test cluster), where the root's own libslurm 24.11 and headers are found.
#
# Compiled with CFLAGS=-O0 -g0 (override: $PYSLURM_CFLAGS): Python's own flags (-O3 -g) made the
# Cython-generated C take over half an hour on 2 busy cores; a test binding's cost is its RPCs.
#
# Cached: one wheel per (archive sha256, libslurm-dev version, Python tag, CFLAGS) under
# $CACHE/wheels/KEY/ (CACHE: $SLURM_SUPERVISOR_CACHE, default /var/cache/slurm-supervisor), reused
# while all three are unchanged; the site directory is re-made from that wheel when its key differs
# (e.g. the root was rebuilt). Needs root (apt-get, chroot) and, on a cold build, Debian's mirror.
set -euo pipefail

VERSION="${1:?usage: build.sh VERSION  (22.05: the host, 24.11: the root)}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
CACHE="${SLURM_SUPERVISOR_CACHE:-/var/cache/slurm-supervisor}/pyslurm"
PY="$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')"
PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
PYPREFIXES="$("$PY" -c 'import sys; print(" ".join(sorted({sys.prefix, sys.base_prefix})))')"

case "$VERSION" in
  22.05) BRANCH=22.5.x; ROOT=""; SITE_SEEN="$CACHE/22.05/site" ;;
  24.11) BRANCH=24.11.x; ROOT="${SLURM_TEST_ROOTS:-/var/cache/slurm-supervisor/roots}/24.11"
         SITE_SEEN=/opt/slurm-supervisor/pyslurm-24.11 ;;
  *) echo "build.sh: no pyslurm for Slurm $VERSION here (22.05: host, 24.11: root; 26.05 has none upstream)" >&2
     exit 2 ;;
esac
SITE="$ROOT$SITE_SEEN"  # where the site directory is on the host's file system
ARCHIVE="$(ls "$HERE"/pyslurm-"$BRANCH"-*.tar.gz)"
CFLAGS_USED="${PYSLURM_CFLAGS:--O0 -g0}"
log() { printf '[pyslurm %s] %s\n' "$VERSION" "$*" >&2; }

if [ "$(id -u)" != 0 ]; then echo "build.sh: needs root (apt-get, chroot)" >&2; exit 1; fi
if [ -n "$ROOT" ] && [ ! -f "$ROOT/.slurm-root.json" ]; then
  echo "build.sh: no Slurm $VERSION root at $ROOT; build it first: tests/slurm_roots/build.sh $VERSION" >&2
  exit 1
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/$VERSION.lock"
flock 9  # one build per version at a time; a second caller waits, then reuses it

# inside CMD...: run CMD where this version's Slurm is (the root, with the interpreter and the cache bound in).
inside() {
  if [ -z "$ROOT" ]; then "$@"; return; fi
  # shellcheck disable=SC2086 # the prefixes are paths without spaces, one word each
  bash "$REPO/tests/slurm_roots/enter.sh" "$ROOT" $PYPREFIXES "$CACHE" -- "$@"
}

# The build needs libslurm-dev of this Slurm (and, in the root, a C compiler): installed once.
need="libslurm-dev"
[ -n "$ROOT" ] && need="libslurm-dev gcc libc6-dev"
missing=""
for p in $need; do
  if [ -n "$ROOT" ]; then chroot "$ROOT" dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
  else dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; fi
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  if [ -z "$ROOT" ]; then
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq $missing >"$CACHE/$VERSION.apt.log" 2>&1 \
      || { tail -20 "$CACHE/$VERSION.apt.log" >&2; exit 1; }
  else
    unshare -m --propagation private /bin/sh -euc '
      mount -t proc proc "$1/proc"
      mount --rbind /dev "$1/dev"
      chroot "$1" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C /bin/sh -euc "
        apt-get -q update && apt-get -q install -y $2 && apt-get clean"
    ' sh "$ROOT" "$missing" >"$CACHE/$VERSION.apt.log" 2>&1 || { tail -20 "$CACHE/$VERSION.apt.log" >&2; exit 1; }
  fi
fi
if [ -n "$ROOT" ]; then LIBSLURM="$(chroot "$ROOT" dpkg-query -W -f='${Version}' libslurm-dev)"
else LIBSLURM="$(dpkg-query -W -f='${Version}' libslurm-dev)"; fi
case "$LIBSLURM" in
  "$VERSION".*) ;;
  *) log "libslurm-dev is $LIBSLURM, not Slurm $VERSION: the suite moved on; update build.sh"; exit 1 ;;
esac

KEY="$VERSION-$(sha256sum "$ARCHIVE" | cut -c1-16)-libslurm$LIBSLURM-$PYTAG-$(printf %s "$CFLAGS_USED" | tr -c 'A-Za-z0-9' _)"
WHEELS="$CACHE/wheels/$KEY"
if ! ls "$WHEELS"/pyslurm-*.whl >/dev/null 2>&1; then
  start=$(date +%s)
  work="$CACHE/build/$KEY"
  rm -rf "$work" "$WHEELS.tmp"
  mkdir -p "$work" "$WHEELS.tmp"
  tar xzf "$ARCHIVE" -C "$work"
  log "building $(basename "$ARCHIVE") against libslurm-dev $LIBSLURM with $PY (log: $work/build.log)"
  inside /usr/bin/env CFLAGS="$CFLAGS_USED" SLURM_INCLUDE_DIR=/usr/include SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu PIP_NO_INDEX=1 \
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WHEELS.tmp" "$work/pyslurm-$BRANCH" \
    >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; log "build failed (log: $work/build.log)"; exit 1; }
  rm -rf "$WHEELS"
  mv "$WHEELS.tmp" "$WHEELS"
  rm -rf "$work/pyslurm-$BRANCH"
  log "wheel built in $(( $(date +%s) - start )) s: $(ls "$WHEELS")"
else
  log "cached wheel: $WHEELS/$(ls "$WHEELS")"
fi

if [ "$(cat "$SITE/.key" 2>/dev/null)" != "$KEY" ]; then
  rm -rf "$SITE.tmp"
  mkdir -p "$(dirname "$SITE")"
  PIP_NO_INDEX=1 PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-deps --target "$SITE.tmp" \
    "$WHEELS"/pyslurm-*.whl >&2
  echo "$KEY" >"$SITE.tmp/.key"
  rm -rf "$SITE"
  mv "$SITE.tmp" "$SITE"
  log "installed into $SITE_SEEN"
fi

# Proof that it loads against this Slurm's libslurm, with the interpreter that will use it. Importing
# pyslurm reads a slurm.conf (without one libslurm exits the process): a two-line one is enough.
printf 'ClusterName=verify\nSlurmctldHost=localhost\n' >"$CACHE/verify-slurm.conf"
got="$(inside /usr/bin/env SLURM_CONF="$CACHE/verify-slurm.conf" PYTHONPATH="$SITE_SEEN" "$PY" -c \
  'import pyslurm; print(pyslurm.__version__, "built for Slurm", ".".join(map(str, pyslurm.slurm_api_version())))')" \
  || { log "import pyslurm failed with PYTHONPATH=$SITE_SEEN"; exit 1; }
log "import pyslurm: $got (libslurm $LIBSLURM)"
echo "$SITE_SEEN"
