#!/usr/bin/env bash
# Installs the agent on this gateway from a source checkout, or upgrades it in place.
#
#   sudo deploy/install.sh [--line ID [--enable]] [--package SPEC] [--python PYTHON]
#   deploy/install.sh --root DIR ...     (everything under DIR; no systemctl, no user)
#
#   --line ID      also create /etc/agent/ID.env for the line ID from the example (a bus of
#                  devices ID-t01@1 ... to edit; an existing file is kept)
#   --device ID    the same for a single device on a line of its own, named ID
#   --enable       with --line or --device: systemctl enable --now agent@ID (edit first!)
#   --package SPEC what to install: default this checkout; or a wheel, or "agent==X.Y"
#   --python PATH  the Python to build on (default /usr/bin/python3, 3.11 or newer)
#   --root DIR     install into DIR as if it were /, for images and tests
#
# Installs /opt/agent/venv (a virtual environment built beside the old one and swapped in),
# /etc/systemd/system/agent@.service, /etc/sysusers.d/agent.conf (the "agent" user),
# /etc/agent/agent.env.example and /opt/agent/share/ (udev rule example, uninstall.sh).
# Running agents are restarted on the new version. Needs python3-venv and a package index.
set -euo pipefail

die() { echo "install.sh: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
checkout=$(dirname "$here")
prefix=/opt/agent
root="" line="" single=0 enable=0 package="" python=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --root|--line|--device|--package|--python)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --root) root=$2 ;;
                --line) line=$2; single=0 ;;
                --device) line=$2; single=1 ;;
                --package) package=$2 ;;
                --python) python=$2 ;;
            esac
            shift 2 ;;
        --enable) enable=1; shift ;;
        -h|--help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

if [ -n "$root" ]; then
    mkdir -p "$root"
    root=$(cd "$root" && pwd)
    [ "$root" != / ] || root=""
fi
what=$([ "$single" = 1 ] && echo device || echo line)
if [ -n "$line" ] && ! [[ $line =~ ^[A-Za-z0-9][A-Za-z0-9._:-]*$ ]]; then
    die "$what id '$line': use letters, digits and . _ : - (starting with a letter or digit)"
fi
[ "$enable" = 0 ] || [ -n "$line" ] || die "--enable needs --line or --device"
if [ -z "$package" ]; then
    [ -f "$checkout/pyproject.toml" ] || die "no checkout at $checkout: use --package"
    package=$checkout
fi

live=$([ -z "$root" ] && echo 1 || echo 0)
if [ "$live" = 1 ]; then
    [ "$(id -u)" = 0 ] || die "run as root (or use --root DIR)"
    if dpkg-query -W -f '${Status}' agent 2>/dev/null | grep -q 'install ok installed'; then
        die "the Debian package agent is installed: upgrade that instead (apt-get install agent)"
    fi
fi

# 1. The virtual environment, built beside the live one and swapped in: a failed build leaves
#    the running version alone.
mkdir -p "$root$prefix"
rm -rf "$root$prefix/venv.new" "$root$prefix/venv.old"
"$here/build-venv.sh" --python "$python" "$root$prefix/venv.new" "$prefix/venv" "$package"
if [ -d "$root$prefix/venv" ]; then
    mv "$root$prefix/venv" "$root$prefix/venv.old"
fi
mv "$root$prefix/venv.new" "$root$prefix/venv"
rm -rf "$root$prefix/venv.old"

# 2. The unit, the user, the examples.
install -D -m 0644 "$checkout/systemd/agent@.service" "$root/etc/systemd/system/agent@.service"
install -D -m 0644 "$here/agent.sysusers" "$root/etc/sysusers.d/agent.conf"
install -d -m 0755 "$root/etc/agent"
install -m 0644 "$here/agent.env.example" "$root/etc/agent/agent.env.example"
install -d -m 0700 "$root/etc/credstore"
install -D -m 0644 "$here/99-agent-serial.rules" "$root$prefix/share/99-agent-serial.rules"
install -D -m 0755 "$here/uninstall.sh" "$root$prefix/share/uninstall.sh"

# 3. The line's env file: the example, made about this line (or this single device). Never
#    overwritten.
if [ -n "$line" ]; then
    env_file="$root/etc/agent/$line.env"
    if [ -e "$env_file" ]; then
        echo "keeping $env_file"
    elif [ "$single" = 1 ]; then
        (umask 077 && sed -e 's/^AGENT_DEVICES=/#AGENT_DEVICES=/' \
            -e "s/^#AGENT_DEVICE_ID=thermostat-1\$/AGENT_DEVICE_ID=$line/" \
            -e "s/floor3/$line/g" "$here/agent.env.example" >"$env_file")
        echo "created $env_file: set the broker and the serial line in it"
    else
        (umask 077 && sed "s/floor3/$line/g" "$here/agent.env.example" >"$env_file")
        echo "created $env_file: set the broker, the serial line and its devices in it"
    fi
fi

if [ "$live" = 0 ]; then
    echo "installed under $root"
    exit 0
fi

# 4. Tell systemd, and move running agents to the new version (the standby of each pair takes
#    over for the second or two this takes).
systemd-sysusers /etc/sysusers.d/agent.conf
systemctl daemon-reload
systemctl try-restart 'agent@*.service' || echo "install.sh: an agent did not restart: see systemctl --failed" >&2
if [ "$enable" = 1 ]; then
    systemctl enable --now "agent@$line.service"
    systemctl --no-pager status "agent@$line.service" || true
elif [ -n "$line" ]; then
    echo "then: systemctl enable --now agent@$line"
fi
echo "installed: $("$prefix/venv/bin/python" -c 'from importlib.metadata import version; print("agent", version("agent"))')"
