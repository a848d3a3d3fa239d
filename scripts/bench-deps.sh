#!/usr/bin/env bash
# The programs `make bench` compares dld with or serves from: nginx, curl, aria2c, wget and
# openssl (the wan part's certificate). On Debian as root, installs what is missing; elsewhere
# says what is, and the parts that need it print that they were skipped.
set -euo pipefail
missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v aria2c >/dev/null 2>&1 || missing+=(aria2)
command -v wget >/dev/null 2>&1 || missing+=(wget)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} (for make bench)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "note: make bench compares dld with programs that are missing here: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
fi
