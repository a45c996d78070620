#!/usr/bin/env bash
# Make sure the services the tests and the demo need are installed, and PostgreSQL is running
# where it is installed. Installs with apt-get only on Debian as root; otherwise says, in one
# line, what to install.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v sshd >/dev/null 2>&1 || [[ -x /usr/sbin/sshd ]]; } || missing+=(openssh-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)

if ((${#missing[@]})); then
  if [[ -f /etc/debian_version && $(id -u) -eq 0 ]]; then
    echo "installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "error: missing ${missing[*]}: install them (Debian: sudo apt-get install ${missing[*]}) and rerun" >&2
    exit 1
  fi
fi
mkdir -p /run/sshd 2>/dev/null || true

# PostgreSQL: start the machine's cluster when it is installed but stopped.
if command -v pg_lsclusters >/dev/null 2>&1; then
  while read -r ver name _port status _rest; do
    [[ $ver =~ ^[0-9]+$ ]] || continue
    if [[ $status != online* ]]; then
      echo "starting PostgreSQL $ver/$name"
      pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start || true
    fi
  done < <(pg_lsclusters --no-header 2>/dev/null || true)
fi
