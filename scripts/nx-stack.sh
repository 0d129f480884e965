#!/usr/bin/env bash
# Prepares the Nx stack from pinned source tarballs, for machines without Hex: checks them against
# SHA256SUMS, unpacks them into a cache outside the clone and builds Elixir there (once per
# version), so Nx's and Axon's suites can run against ExBurn with the packages as path deps.
#
#   scripts/nx-stack.sh [--check]     # prepare (idempotent); --check only says whether it is ready
#   eval "$(scripts/nx-stack.sh --env)"  # prepare, then print the exports that select it
#
# EXBURN_DEPS_DIR names the folder of tarballs (default: ../shared/deps beside the clone);
# EXBURN_NX_STACK_DIR the cache (default: ~/.cache/ex_burn/nx-stack). Exits 3 when the tarballs
# are not there, so a caller can fall back to Hex.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps=${EXBURN_DEPS_DIR:-$root/../shared/deps}
cache=${EXBURN_NX_STACK_DIR:-$HOME/.cache/ex_burn/nx-stack}
mode=${1:-prepare}

# name -> tarball stem; the unpacked folder is the stem, nx's Mix project is its nx/ subfolder
declare -A stems=(
  [elixir]=elixir-1.18.4 [nx]=nx-0.13.1 [complex]=complex-0.6.0
  [telemetry]=telemetry-1.2.1 [axon]=axon-0.8.1 [polaris]=polaris-0.1.0
)

say() { printf 'nx-stack: %s\n' "$*" >&2; }

project_dir() {
  case $1 in
    nx) echo "$cache/${stems[nx]}/nx" ;;
    *) echo "$cache/${stems[$1]}" ;;
  esac
}

ready() {
  [ -x "$cache/${stems[elixir]}/bin/elixir" ] && [ -f "$cache/${stems[elixir]}/.built" ] || return 1
  for name in "${!stems[@]}"; do [ -f "$cache/${stems[$name]}/.unpacked" ] || return 1; done
}

prepare() {
  ready && return 0
  if [ ! -f "$deps/SHA256SUMS" ]; then
    say "no pinned tarballs in $deps (set EXBURN_DEPS_DIR)"
    exit 3
  fi
  mkdir -p "$cache"
  (cd "$deps" && sha256sum --quiet -c SHA256SUMS) || { say "checksums differ in $deps"; exit 1; }
  for name in "${!stems[@]}"; do
    stem=${stems[$name]}
    [ -f "$cache/$stem/.unpacked" ] && continue
    rm -rf "${cache:?}/$stem"
    tar xzf "$deps/$stem.tar.gz" -C "$cache"
    touch "$cache/$stem/.unpacked"
  done
  local ex="$cache/${stems[elixir]}"
  if [ ! -f "$ex/.built" ]; then
    say "building ${stems[elixir]} (a few minutes, once)"
    make -C "$ex" compile >"$cache/elixir-build.log" 2>&1 || {
      tail -30 "$cache/elixir-build.log" >&2
      exit 1
    }
    touch "$ex/.built"
  fi
}

exports() {
  local local_deps="" name
  for name in nx complex telemetry axon polaris; do
    local_deps+="${local_deps:+,}$name=$(project_dir "$name")"
  done
  cat <<EOF
export PATH="$cache/${stems[elixir]}/bin:\$PATH"
export EXBURN_LOCAL_DEPS="$local_deps"
export EXBURN_NX_PATH="$(project_dir nx)"
export EXBURN_AXON_PATH="$(project_dir axon)"
export EXBURN_NO_HEX=1
EOF
}

case $mode in
  prepare) prepare ;;
  --env) prepare && exports ;;
  --check)
    if ready; then say "ready in $cache"; else say "not prepared in $cache"; exit 1; fi
    ;;
  *)
    say "usage: scripts/nx-stack.sh [--check|--env]"
    exit 2
    ;;
esac
