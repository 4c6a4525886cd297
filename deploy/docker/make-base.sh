#!/usr/bin/env bash
# Builds the base image Drover's image starts from, without pulling anything from a registry: a minimal Debian 12
# root file system made by debootstrap from Debian's own apt mirror, plus the shared libraries the release binaries
# link (`ldd target/release/drover-controller`: librocksdb7.8 and what it needs; the other binaries need only libc
# and libgcc_s), then `docker import`ed as one layer.
#
#   deploy/docker/make-base.sh [TAG]          # default tag: drover-base:bookworm
#
# Env: MIRROR (default http://deb.debian.org/debian), SUITE (default bookworm), KEEP_ROOTFS=1 keeps the work dir.
# Needs root (debootstrap chroots and creates device nodes), debootstrap and docker.
# Where a registry is reachable, `--build-arg BASE=debian:bookworm-slim` plus the same apt-get line does the same.
set -euo pipefail

TAG=${1:-drover-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
# librocksdb7.8: drover-controller's storage (pulls libsnappy, libgflags, liblz4, libzstd, libbz2, libstdc++).
# procps: ps/pgrep for health checks and for looking at tasks in a node container. iproute2: `ip addr` to see
# which site network a container is on. ca-certificates is not needed: Drover brings its own CA.
PACKAGES=${PACKAGES:-librocksdb7.8,procps,iproute2}

die() { echo "make-base: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap needs it): sudo $0 $*"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
command -v docker >/dev/null || die "docker is missing: install Docker Engine (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is it running? are you allowed to use it?)"

ROOTFS=$(mktemp -d /var/tmp/drover-base.XXXXXX)
cleanup() {
    if [ "${KEEP_ROOTFS:-0}" != 1 ]; then rm -rf --one-file-system "$ROOTFS"; else echo "rootfs kept in $ROOTFS"; fi
}
trap cleanup EXIT

start=$(date +%s)
echo "make-base: debootstrap --variant=minbase $SUITE from $MIRROR into $ROOTFS (a few minutes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; die "debootstrap failed; full log in $ROOTFS.log"; }
rm -f "$ROOTFS.log"

# Smaller: no package caches, lists, docs, man pages or locales in an image that never runs apt.
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/log/*.log \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/*
# The resolver and host name come from Docker at run time.
: > "$ROOTFS/etc/resolv.conf"
: > "$ROOTFS/etc/hostname"
# Check the libraries are really there before calling it a base for Drover.
# (Not `ldconfig -p | grep -q`: grep's early exit would fail the pipeline under pipefail.)
libs=$(chroot "$ROOTFS" /sbin/ldconfig -p)
case $libs in *librocksdb.so.7.8*) ;; *) die "librocksdb.so.7.8 is missing from the rootfs" ;; esac

tar --numeric-owner -C "$ROOTFS" -c . \
    | docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --message "debootstrap --variant=minbase $SUITE + $PACKAGES" - "$TAG" >/dev/null
echo "make-base: $TAG built in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
