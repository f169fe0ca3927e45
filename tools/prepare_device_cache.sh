#!/usr/bin/env bash
# Fills .device_cache/ (git-ignored) with what a GPU machine without internet access lacks: the
# pinned nvidia-cutlass wheel (CUTLASS headers) and Debian's googletest sources. Run it on a machine
# with internet access, then copy the folder with the checkout; tools/device_check.sh installs from it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device_cache
cd .device_cache
ls nvidia_cutlass-4.2.0.0-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d .
ls googletest_*.deb >/dev/null 2>&1 || { apt-get update -qq; apt-get download googletest libgtest-dev; }
ls -la
