#!/bin/sh
# Installs what bergstream needs from Debian's packages when it is missing: the Python interpreter given (python3.11
# by default) with venv, a JDK (17 or newer) and Maven for the JVM side; PostgreSQL and Prometheus for the tests
# of a PostgreSQL JDBC catalog and of the router's metrics; docker-compose (Compose 1, Python) to check
# docker-compose.yml. With --image, also what `make test-image` needs: a Docker engine (docker.io) and
# debootstrap (the image's Debian base, where no registry of images is reached).
#
#   install-system-packages.sh [--image] [PYTHON]
#   install-system-packages.sh --list      every package it may install, on one line
#
# Not Debian 12's burrow package: its Burrow 1.2.1 cannot read a Kafka 4 cluster (`bergstream local burrow` says
# why). Burrow 1.9.5 or newer, where a user runs it, is given with BERGSTREAM_BURROW. Nor Go: Debian's is older
# than the Go programs of the local stack need (README says which Go).
set -eu
if [ "${1:-}" = "--list" ]; then
  echo "python3.11 python3.11-venv default-jdk-headless maven prometheus docker-compose postgresql docker.io debootstrap"
  exit 0
fi
image=""
if [ "${1:-}" = "--image" ]; then
  image=1
  shift
fi
python="${1:-python3.11}"
missing=""
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }
if ! "$python" -c '' >/dev/null 2>&1; then
  missing="$missing $(basename "$python") $(basename "$python")-venv"
elif ! "$python" -c 'import ensurepip' >/dev/null 2>&1; then  # Debian splits venv's pip out
  missing="$missing $(basename "$python")-venv"
fi
# javac too: Maven builds bergstream's Java on this machine.
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] || ! command -v javac >/dev/null 2>&1; then
  missing="$missing default-jdk-headless"
fi
command -v mvn >/dev/null 2>&1 || missing="$missing maven"
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
if [ -n "$image" ]; then
  command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
  command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "bergstream needs:$missing; install them and run make again" >&2
  exit 1
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
