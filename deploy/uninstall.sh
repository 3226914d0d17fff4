#!/usr/bin/env bash
# Removes what install.sh installed: stops and disables every agent@ instance first.
#
#   sudo /opt/agent/share/uninstall.sh [--purge]
#   uninstall.sh --root DIR [--purge]      (the same under DIR; no systemctl)
#
# Kept unless --purge: the env files in /etc/agent, the secrets in /etc/credstore/agent.*,
# drop-ins (systemctl edit agent@...) and the agents' state in /var/lib/agent. The system user
# "agent" is always kept (files it owned may remain); userdel agent removes it.
set -euo pipefail

die() { echo "uninstall.sh: $*" >&2; exit 1; }

root="" purge=0
while [ $# -gt 0 ]; do
    case "$1" in
        --root) [ $# -ge 2 ] || die "--root needs a value"; root=$2; shift 2 ;;
        --purge) purge=1; shift ;;
        -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
if [ -n "$root" ]; then
    [ -d "$root" ] || die "no directory $root"
    root=$(cd "$root" && pwd)
    [ "$root" != / ] || root=""
fi

if [ -z "$root" ]; then
    [ "$(id -u)" = 0 ] || die "run as root (or use --root DIR)"
    if dpkg-query -W -f '${Status}' agent 2>/dev/null | grep -q 'install ok installed'; then
        die "installed by the Debian package agent: apt-get remove agent (or purge) instead"
    fi
    systemctl stop 'agent@*.service' || true
fi

# Instances enabled with "systemctl enable agent@X" are symlinks in *.wants directories.
find "$root/etc/systemd/system" -path '*.wants/agent@*.service' -type l -print -delete \
    2>/dev/null || true
rm -f "$root/etc/systemd/system/agent@.service" \
    "$root/etc/sysusers.d/agent.conf" \
    "$root/etc/agent/agent.env.example"
rm -rf "$root/opt/agent"

if [ "$purge" = 1 ]; then
    rm -rf "$root/etc/agent" "$root/var/lib/agent" "$root/var/lib/private/agent" \
        "$root"/etc/systemd/system/agent@*.service.d
    rm -f "$root"/etc/credstore/agent.*
else
    rmdir "$root/etc/agent" 2>/dev/null || true
    if [ -d "$root/etc/agent" ]; then
        echo "kept $root/etc/agent (env files) and any secrets in $root/etc/credstore/agent.*"
    fi
fi

if [ -z "$root" ]; then
    systemctl daemon-reload
    systemctl reset-failed 'agent@*.service' 2>/dev/null || true
fi
echo "uninstalled"
