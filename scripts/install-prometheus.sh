#!/usr/bin/env bash
# Install Debian's prometheus package (the server and promtool), idempotently, for the tests that run a real
# Prometheus (tests/upstream/test_prometheus.py) and check the chart's rules with promtool (tests/chart). The tests
# run the binary themselves, with their own config, storage folder and loopback port; the package's system service
# is never started (policy-rc.d forbids it during the install, and nothing here enables it).
#
# Usage: scripts/install-prometheus.sh        # installs if missing, then prints the version
set -euo pipefail

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    if [[ "$(id -u)" != 0 ]]; then
        echo "prometheus is not installed: run as root, or: sudo apt-get install -y prometheus" >&2
        exit 1
    fi
    policy=/usr/sbin/policy-rc.d
    created_policy=""
    if [[ ! -e "${policy}" ]]; then
        printf '#!/bin/sh\nexit 101\n' > "${policy}" && chmod +x "${policy}" && created_policy=1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
    [[ -n "${created_policy}" ]] && rm -f "${policy}"
fi
prometheus --version 2>&1 | head -n 1
