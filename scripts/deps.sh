#!/usr/bin/env bash
# Makes sure the C libraries dld builds against are present: SQLite (GRDB uses the system
# library) and OpenSSL. On a Debian machine where we are root, installs what is missing.
#
# Also PostgreSQL's server programs (initdb, pg_ctl, postgres from Debian's `postgresql`): the
# tests of the PostgreSQL store start a throwaway server of their own with them. dld builds
# without them, so a failure to install them is a note, not a failed build; those tests then
# fail with a message that says PostgreSQL is missing (they are never skipped).
set -euo pipefail
missing=()
[ -f /usr/include/sqlite3.h ] || missing+=(libsqlite3-dev)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
postgres_missing=
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  postgres_missing=postgresql
fi
[ ${#missing[@]} -eq 0 ] && [ -z "$postgres_missing" ] && exit 0

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
updated=
apt_install() {
  if [ -z "$updated" ]; then apt-get update -qq && updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ ${#missing[@]} -gt 0 ]; then
  if can_install; then
    echo "installing ${missing[*]}" >&2
    apt_install "${missing[@]}"
  else
    echo "dld needs these packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

if [ -n "$postgres_missing" ]; then
  if can_install && { echo "installing postgresql (for the tests of the PostgreSQL store)" >&2; apt_install postgresql; }; then
    :
  else
    echo "note: PostgreSQL is not installed, and could not be installed here; dld builds without it, but" >&2
    echo "      the tests of the PostgreSQL store will fail until it is: sudo apt-get install postgresql" >&2
  fi
fi
exit 0
