#!/usr/bin/env bash
# Builds Drover's image from release binaries built on this host (see the Dockerfile for why).
#
#   deploy/docker/build.sh [TAG]               # default tag: drover:latest
#
# Env: BASE (default drover-base:bookworm; make it with deploy/docker/make-base.sh), CARGO_TARGET_DIR (where cargo
# builds; default target/), SKIP_CARGO=1 (use the binaries already in $CARGO_TARGET_DIR/release).
set -euo pipefail

TAG=${1:-drover:latest}
BASE=${BASE:-drover-base:bookworm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BINS=(drover drover-controller drover-agent drover-authd drover-relayd)

die() { echo "build: $*" >&2; exit 1; }
command -v docker >/dev/null || die "docker is missing: install Docker Engine (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is it running? are you allowed to use it?)"
docker image inspect "$BASE" >/dev/null 2>&1 \
    || die "base image $BASE is missing: run deploy/docker/make-base.sh (no registry needed), or set BASE=debian:bookworm-slim where a registry is reachable"

start=$(date +%s)
if [ "${SKIP_CARGO:-0}" != 1 ]; then
    command -v cargo >/dev/null || die "cargo is missing (install Rust), or set SKIP_CARGO=1 with binaries in $TARGET_DIR/release"
    echo "build: cargo build --release (binaries: ${BINS[*]})"
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p drover-cli -p drover-controller -p drover-agent -p drover-auth -p drover-relay --bins)
fi
for b in "${BINS[@]}"; do
    [ -x "$TARGET_DIR/release/$b" ] || die "$TARGET_DIR/release/$b is missing: run cargo build --release (or unset SKIP_CARGO)"
done

# A context of a few tens of megabytes: the binaries (stripped copies) and the entrypoint, nothing else.
CONTEXT=$(mktemp -d)
trap 'rm -rf "$CONTEXT"' EXIT
mkdir "$CONTEXT/bin"
for b in "${BINS[@]}"; do
    cp "$TARGET_DIR/release/$b" "$CONTEXT/bin/$b"
    strip --strip-debug "$CONTEXT/bin/$b" 2>/dev/null || true
done
cp "$HERE/drover-entrypoint" "$CONTEXT/"
echo "build: context $(du -sh "$CONTEXT" | cut -f1) -> docker build $TAG (BASE=$BASE)"
if ! docker build -f "$HERE/Dockerfile" --build-arg "BASE=$BASE" -t "$TAG" \
    --label "org.opencontainers.image.revision=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$CONTEXT" > "$CONTEXT.log" 2>&1; then
    tail -30 "$CONTEXT.log" >&2
    die "docker build failed (the full output is in $CONTEXT.log)"
fi
rm -f "$CONTEXT.log"
echo "build: $TAG built in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
