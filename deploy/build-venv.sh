#!/usr/bin/env bash
# Builds a Python virtual environment holding the agent in STAGE, made to run once it is moved
# to FINAL (a virtual environment records its own path in its scripts). install.sh builds next
# to the live one and swaps; build-deb.sh builds in a scratch directory that becomes the package.
#
#   build-venv.sh [--python PYTHON] [--lock FILE] STAGE FINAL PACKAGE...
#
# PACKAGE is anything pip installs: the source checkout (the default of the callers), a wheel,
# or a requirement such as "agent==0.2.0" from your package index. Needs Python >= 3.11 with
# the venv module (Debian: python3-venv) and access to a package index for the dependencies.
# With a lock (--lock, or the checkout's requirements.lock), the dependencies are installed
# exactly as locked, every file checked against its hash, and the packages without theirs.
set -euo pipefail

die() { echo "build-venv.sh: $*" >&2; exit 1; }

python=/usr/bin/python3
lock=
while [ $# -gt 0 ]; do
    case "$1" in
        --python) [ $# -ge 2 ] || die "--python needs a value"; python=$2; shift 2 ;;
        --python=*) python=${1#*=}; shift ;;
        --lock) [ $# -ge 2 ] || die "--lock needs a value"; lock=$2; shift 2 ;;
        --lock=*) lock=${1#*=}; shift ;;
        -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option: $1" ;;
        *) break ;;
    esac
done
[ $# -ge 3 ] || die "usage: build-venv.sh [--python PYTHON] [--lock FILE] STAGE FINAL PACKAGE..."
stage=$1 final=$2
shift 2
case "$stage" in /*) ;; *) stage=$PWD/$stage ;; esac
case "$final" in /*) ;; *) die "FINAL must be an absolute path: $final" ;; esac
stage=${stage%/} final=${final%/}

command -v "$python" >/dev/null 2>&1 || die "no Python at $python (use --python)"
# Link the environment to the versioned interpreter (python3.11, not python3): when the
# distribution's default python3 moves on, this environment keeps the Python it was built for.
python=$(readlink -f "$(command -v "$python")")
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$python is older than Python 3.11"
"$python" -c 'import ensurepip, venv' 2>/dev/null \
    || die "$python lacks the venv module (Debian: apt-get install python3-venv)"

[ ! -e "$stage" ] || die "$stage exists already"

# pip builds a source directory in place, and setuptools' build/ keeps modules that were deleted
# since: build from a clean copy instead (which also leaves the checkout untouched).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
packages=()
for package in "$@"; do
    if [ -f "$package/pyproject.toml" ]; then
        if [ -z "$lock" ] && [ -f "$package/requirements.lock" ]; then
            lock=$package/requirements.lock
        fi
        copy="$scratch/src${#packages[@]}"
        mkdir "$copy"
        tar -C "$package" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
            --exclude='*.egg-info' --exclude=__pycache__ --exclude='.*_cache' \
            --exclude=.hypothesis -cf - . | tar -C "$copy" -xf -
        package=$copy
    fi
    packages+=("$package")
done

[ -z "$lock" ] || [ -f "$lock" ] || die "no lock file at $lock"

"$python" -m venv "$stage"
# Bytecode is compiled below, for the final path.
pip=("$stage/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
if [ -n "$lock" ]; then
    # Supply chain: the dependencies are the locked files and nothing else; a dependency of
    # the agent that the lock lacks fails the check below instead of being fetched unchecked.
    "${pip[@]}" --require-hashes --no-deps -r "$lock"
    "${pip[@]}" --no-deps "${packages[@]}"
    "$stage/bin/python" -m pip check >/dev/null \
        || die "$lock does not hold what the agent needs: $("$stage/bin/python" -m pip check)"
else
    "${pip[@]}" "${packages[@]}"
fi
# The installer itself is not needed at run time: a smaller tree and nothing to patch.
"$stage/bin/python" -m pip uninstall --quiet --yes pip setuptools >/dev/null 2>&1 || true
# A local path (the checkout, a wheel file) is recorded as a file:// URL of this machine.
find "$stage/lib" -path '*.dist-info/direct_url.json' -delete

if [ "$stage" != "$final" ]; then
    # Scripts start with "#!$stage/bin/python"; activate scripts and pyvenv.cfg name $stage.
    grep -rlF --null "$stage" "$stage/bin" "$stage/pyvenv.cfg" \
        | xargs -0 -r sed -i "s|$stage|$final|g"
fi

# Hash-checked bytecode under the final path: valid whatever the file times in the package, and
# the service (which cannot write /opt) never has to compile at start-up.
"$stage/bin/python" -m compileall -q -j 0 --invalidation-mode checked-hash \
    -s "$stage" -p "$final" "$stage/lib" >/dev/null \
    || die "compiling the bytecode failed"
