#!/usr/bin/env bash
# Install the Debian packages a make target needs (real peers and checkers:
# nginx, wrk, prometheus/promtool), only those missing, only where we can.
# Never fails the build: tests and benchmarks that need a missing binary skip
# or report it with the reason printed here.
#   usage: scripts/sysdeps.sh <command>=<package> ...
set -u
missing=()
for pair in "$@"; do
    cmd=${pair%%=*}; pkg=${pair#*=}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sysdeps: cannot install ${missing[*]} (needs root and apt-get); dependent checks will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
install() { timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }
if ! install; then
    timeout 600 apt-get update -qq >/dev/null 2>&1
    install || echo "sysdeps: apt-get could not install ${missing[*]}; dependent checks will skip" >&2
fi
exit 0
