#!/usr/bin/env bash
# Installs tessel's build, test and (with --bench) benchmark dependencies from Debian 12's
# archive. Idempotent: packages already present are skipped and apt is not touched at all
# when nothing is missing. Uses sudo when not run as root.
set -euo pipefail

want_bench=0
want_test=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    --test) want_test=1 ;;
    -h|--help) echo "usage: scripts/install-deps.sh [--test] [--bench]   (both add PyTorch 1.13: --test for the test that loads a Hugging Face export in it, --bench for side-by-side benchmarks)"; exit 0 ;;
    *) echo "error: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev libgloo-dev libyaml-cpp-dev libcli11-dev libfmt-dev libhwloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  iproute2 procps python3 strace
  python3-dev python3-numpy pybind11-dev
)
if [ "$want_test" = 1 ]; then
  packages+=(python3-torch python3-numpy python3-pytest)
fi
if [ "$want_bench" = 1 ]; then
  packages+=(python3-torch python3-numpy hyperfine)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
