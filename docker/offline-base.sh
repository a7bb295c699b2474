#!/bin/sh
# Build the base image the Dockerfile starts from without a registry: a Debian bookworm
# root file system from Debian's apt mirror (debootstrap) with python3, pip and venv,
# imported into the local Docker engine under the base image's name. For machines with
# no Docker Hub (air-gapped, or only an apt mirror and a package index reachable).
#
#   sudo docker/offline-base.sh                      # tags python:3.11-slim (the Dockerfile's default)
#   sudo docker/offline-base.sh agentgym-base:bookworm   # any tag; then build with
#        AGENTGYM_BASE_IMAGE=agentgym-base:bookworm docker-compose build
#
# Environment: MIRROR (default http://deb.debian.org/debian; a local mirror works) and
# SECURITY_MIRROR (default http://deb.debian.org/debian-security),
# SUITE (default bookworm, whose python3 is 3.11 like python:3.11-slim),
# CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt: the host's trusted CAs, so pip
# and apt inside the builds trust what the host trusts, TLS-intercepting proxies included).
# Needs root, debootstrap and a running Docker engine.
set -eu

TAG=${1:-python:3.11-slim}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=${SUITE:-bookworm}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

ROOTFS=$(mktemp -d /tmp/agentgym-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

nice -n 19 debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR"

# The official image's apt sources: the suite, its updates and security fixes.
cat > "$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF

# A local CA (not just a copy of the bundle), so that update-ca-certificates, which runs
# whenever a later apt-get install touches ca-certificates (Java's does), keeps it.
cp "$CA_BUNDLE" "$ROOTFS/usr/local/share/ca-certificates/host-bundle.crt"
chroot "$ROOTFS" update-ca-certificates >/dev/null

# Images install into their own venv, but let pip run in the system Python too, as it
# does in python:3.11-slim (Debian marks its Python externally managed, PEP 668).
rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED

chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin

tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$TAG"
docker image ls "$TAG"
