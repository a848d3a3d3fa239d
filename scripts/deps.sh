#!/usr/bin/env bash
# Makes sure the C libraries dld builds against are present: SQLite (GRDB uses the system
# library) and OpenSSL. On a Debian machine where we are root, installs what is missing.
set -euo pipefail
missing=()
[ -f /usr/include/sqlite3.h ] || missing+=(libsqlite3-dev)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "dld needs these packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
