# Source this (`source scripts/python-env.sh [BUILD_DIR]`) to import the Python package built
# by `./run.sh build` (build/release by default) with Debian's python3: it puts
# BUILD_DIR/python on PYTHONPATH and points `python3` at /usr/bin/python3 for this shell (a
# pyenv or venv interpreter earlier on the PATH has no Debian NumPy).
_tessel_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
_tessel_build="${1:-$_tessel_root/build/release}"
if [ ! -d "$_tessel_build/python/tessel" ]; then
  echo "python-env: no Python package under $_tessel_build/python (run ./run.sh build first)" >&2
else
  export PYTHONPATH="$_tessel_build/python${PYTHONPATH:+:$PYTHONPATH}"
  [ -x /usr/bin/python3 ] && alias python3=/usr/bin/python3
  echo "python-env: PYTHONPATH has $_tessel_build/python; python3 is $(command -v /usr/bin/python3 || command -v python3)"
fi
unset _tessel_root _tessel_build
