#!/usr/bin/env bash
# hack/apt-install.sh PACKAGE...: `apt-get update` and `apt-get install` of Debian packages,
# one installer at a time on this machine. Two checkouts' scripts (a clean clone's CI run
# and a developer's cluster) once installed at the same moment, and the second failed
# "Could not get lock /var/lib/apt/lists/lock"; so every install of hack/ goes through here:
# a machine-wide flock, and apt's own wait for a lock held by anything else (DPkg::Lock::Timeout).
set -euo pipefail
(($#)) || { echo "usage: hack/apt-install.sh PACKAGE..." >&2; exit 2; }
if [[ $(id -u) != 0 ]]; then exec sudo "$0" "$@"; fi
exec 9>/var/lock/vworkspace-apt.lock
flock -w 900 9 || { echo "hack/apt-install.sh: another install held the lock for 15 minutes" >&2; exit 1; }
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]})) || exit 0   # installed by whoever held the lock before us
apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
