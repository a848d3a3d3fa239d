#!/usr/bin/env bash
# Makes sure the C libraries dld builds against are present: SQLite (GRDB uses the system
# library) and OpenSSL. On a Debian machine where we are root, installs what is missing.
#
# Also PostgreSQL's server programs (initdb, pg_ctl, postgres from Debian's `postgresql`): the
# tests of the PostgreSQL store start a throwaway server of their own with them. dld builds
# without them, so a failure to install them is a note, not a failed build; those tests then
# fail with a message that says PostgreSQL is missing (they are never skipped).
#
# Likewise the other programs the tests start as real parts: an HTTP proxy (tinyproxy) and a
# SOCKS5 proxy (microsocks) for the proxy tests; systemd-socket-activate and systemd-analyze
# (Debian's `systemd`) for socket activation and the units; man (man-db) and bash-completion
# for the installed manual pages and completions; ip (iproute2) for the network namespace of
# the network-awareness test and the fleet's partition harness (`make fleet-chaos`, which also
# needs nft from Debian's `nftables` and libfaketime from `faketime`); aria2c (Debian's `aria2`), which reads the Metalinks of the
# Metalink tests to show it gets the same bytes; age and age-keygen (Debian's `age`), the reference
# implementation that decrypts the files dld encrypts at rest; fuse3 and libfuse3-dev (with cc
# and pkg-config) for powercutfs (scripts/powercutfs.c), the FUSE filesystem the power-cut tests
# build and mount to cut the power under dld (they fail, saying why, without it or /dev/fuse).
# And a real browser for the dashboard's tests: Debian's chromium and chromium-driver, driven by
# Selenium (python3-selenium, for Debian's /usr/bin/python3), without their recommends.
#
# And for the HLS tests: Debian's ffmpeg (ffmpeg, ffprobe: media made at test time, and the
# frames dld's files are compared with) and nginx (the origin that serves the playlists),
# without their recommends.
#
# And Python's `jsonschema` for the python3 on PATH (pinned, from PyPI with that python3's pip;
# Debian's python3-jsonschema where pip may not install): scripts/check-openrpc.py checks real
# replies against the OpenRPC document of `rpc.discover` with it.
set -euo pipefail
jsonschema_version=4.26.0
if ! python3 -c 'import jsonschema' >/dev/null 2>&1; then
  echo "installing jsonschema==$jsonschema_version (for scripts/check-openrpc.py)" >&2
  if ! python3 -m pip install -q "jsonschema==$jsonschema_version" >&2; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-jsonschema >/dev/null || true
    fi
  fi
  python3 -c 'import jsonschema' >/dev/null 2>&1 ||
    echo "note: python3 cannot import jsonschema; the OpenRPC end-to-end test will fail until it can: python3 -m pip install jsonschema==$jsonschema_version" >&2
fi
# And aria2p, a Python client library of aria2's JSON-RPC (pinned, from PyPI): the end-to-end
# test scripts/check-aria2p.py drives dld's /jsonrpc with it, as its users drive aria2.
aria2p_version=0.12.3
if ! python3 -c 'import aria2p' >/dev/null 2>&1; then
  echo "installing aria2p==$aria2p_version (for scripts/check-aria2p.py)" >&2
  python3 -m pip install -q "aria2p==$aria2p_version" >&2 ||
    echo "note: python3 cannot import aria2p; the aria2p end-to-end test will fail until it can: python3 -m pip install aria2p==$aria2p_version" >&2
fi
missing=()
[ -f /usr/include/sqlite3.h ] || missing+=(libsqlite3-dev)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
postgres_missing=
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  postgres_missing=postgresql
fi
tools_missing=()
command -v tinyproxy >/dev/null 2>&1 || [ -x /usr/bin/tinyproxy ] || tools_missing+=(tinyproxy)
command -v microsocks >/dev/null 2>&1 || tools_missing+=(microsocks)
command -v systemd-socket-activate >/dev/null 2>&1 && command -v systemd-analyze >/dev/null 2>&1 || tools_missing+=(systemd)
command -v man >/dev/null 2>&1 || tools_missing+=(man-db)
[ -f /usr/share/bash-completion/bash_completion ] || tools_missing+=(bash-completion)
[ -x /usr/sbin/ip ] || tools_missing+=(iproute2)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || tools_missing+=(nftables)
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || tools_missing+=(faketime)
command -v age >/dev/null 2>&1 && command -v age-keygen >/dev/null 2>&1 || tools_missing+=(age)
command -v fusermount3 >/dev/null 2>&1 || tools_missing+=(fuse3)
[ -f /usr/include/fuse3/fuse.h ] || tools_missing+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || tools_missing+=(pkg-config)
command -v cc >/dev/null 2>&1 || tools_missing+=(gcc)
command -v sqlite3 >/dev/null 2>&1 || tools_missing+=(sqlite3)
[ -x /usr/bin/aria2c ] || tools_missing+=(aria2)
browser_missing=()
command -v chromium >/dev/null 2>&1 || browser_missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || browser_missing+=(chromium-driver)
/usr/bin/python3 -c 'import selenium' >/dev/null 2>&1 || browser_missing+=(python3-selenium)
media_missing=()
command -v ffmpeg >/dev/null 2>&1 && command -v ffprobe >/dev/null 2>&1 || media_missing+=(ffmpeg)
[ -x /usr/sbin/nginx ] || media_missing+=(nginx)
[ ${#missing[@]} -eq 0 ] && [ -z "$postgres_missing" ] && [ ${#tools_missing[@]} -eq 0 ] && [ ${#browser_missing[@]} -eq 0 ] \
  && [ ${#media_missing[@]} -eq 0 ] && exit 0

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
if [ ${#tools_missing[@]} -gt 0 ]; then
  if can_install && { echo "installing ${tools_missing[*]} (programs the tests start)" >&2; apt_install "${tools_missing[@]}"; }; then
    :
  else
    echo "note: ${tools_missing[*]} could not be installed here; dld builds without them, but the tests" >&2
    echo "      that start them will fail until they are: sudo apt-get install ${tools_missing[*]}" >&2
  fi
fi
if [ ${#browser_missing[@]} -gt 0 ]; then
  if can_install && { echo "installing ${browser_missing[*]} (the dashboard's browser tests)" >&2; \
      apt_install --no-install-recommends "${browser_missing[@]}"; }; then
    :
  else
    echo "note: ${browser_missing[*]} could not be installed here; the dashboard's browser tests will fail" >&2
    echo "      until they are: sudo apt-get install --no-install-recommends ${browser_missing[*]}" >&2
  fi
fi
if [ ${#media_missing[@]} -gt 0 ]; then
  if can_install && { echo "installing ${media_missing[*]} (the HLS tests)" >&2; \
      apt_install --no-install-recommends "${media_missing[@]}"; }; then
    :
  else
    echo "note: ${media_missing[*]} could not be installed here; the HLS tests will fail" >&2
    echo "      until they are: sudo apt-get install --no-install-recommends ${media_missing[*]}" >&2
  fi
fi
exit 0
