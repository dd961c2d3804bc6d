#!/usr/bin/env bash
# The benchmark, from a fresh clone: installs what it needs (the test
# fixtures' Python and npm packages, mcpo and wrk), builds the gateway and
# the harness in release mode, and runs it. Arguments go to toolgate-bench
# (try --help). Results and how to read them: docs/performance.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tests/setup.sh
bench/mcpo/setup.sh
cargo build --release --locked --bin toolgate --bin toolgate-bench
exec target/release/toolgate-bench "$@"
