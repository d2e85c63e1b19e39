#!/bin/sh
# Installs a JDK (17 or newer) and Maven from Debian's packages when they are missing.
set -eu
if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "bergstream needs java (17 or newer) and mvn on PATH; install them and run make again" >&2
  exit 1
fi
apt-get update -q
apt-get install -y -q openjdk-17-jdk-headless maven
