#!/usr/bin/env bash
# The crate's timing tests, which `cargo test` skips (#[ignore]): Winograd against im2col, MiniLM
# embedding latency per batch size, SmolLM2 prefill and decode speed (the last two need the
# models of `mix ex_burn.models.fetch`). Prints the machine's load with the figures.
#
#     bench/rust_timings.sh [FILTER]      # FILTER narrows the tests (default: every *timing test)
set -euo pipefail
cd "$(dirname "$0")/.."
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
cargo test --release -p ex_burn --no-default-features -- --ignored --nocapture --test-threads 1 "${1:-timing}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
