#!/usr/bin/env bash
# CLI smoke tests: filled in as the CLI grows.
set -euo pipefail
PALLAS=$1
"$PALLAS" --help >/dev/null
