#!/usr/bin/env bash
# Installs the system programs the tests need, where they are missing:
# a PostgreSQL server (initdb, pg_ctl: the Postgres store's tests start a
# throwaway cluster) and Chromium (the web UI's browser tests). Debian's
# packages, through apt-get; run as root (CI is root). Prints one line.
set -euo pipefail

need=()
pg_bin() {
  command -v initdb >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
pg_bin || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: missing ${need[*]}; install them (Debian: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]} (apt-get, once)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
