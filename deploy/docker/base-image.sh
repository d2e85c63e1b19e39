#!/bin/sh
# Builds a Debian 12 base image with debootstrap, for Docker engines that cannot pull debian:bookworm-slim
# (no registry of images, only Debian's packages). The image trusts the certificate authorities this
# machine adds in /usr/local/share/ca-certificates (a company proxy's, for example), so that apt, pip and
# Maven work inside it as they do here.
#
#   sh deploy/docker/base-image.sh                    # makes bergstream/debian:bookworm
#   docker build --build-arg BASE_IMAGE=bergstream/debian:bookworm -t bergstream:latest .
set -eu
IMAGE=${1:-bergstream/debian:bookworm}
SUITE=bookworm

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE exists"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
ROOT=$(mktemp -d "${TMPDIR:-/var/tmp}/bergstream-rootfs.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
echo "debootstrap $SUITE into $ROOT"
debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$ROOT" >"$ROOT.log" 2>&1 \
    || { tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
for ca in /usr/local/share/ca-certificates/*.crt; do
    [ -e "$ca" ] && cp "$ca" "$ROOT/usr/local/share/ca-certificates/"
done
chroot "$ROOT" update-ca-certificates >/dev/null
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import --change 'CMD ["/bin/bash"]' - "$IMAGE"
echo "made $IMAGE"
