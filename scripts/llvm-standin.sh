#!/usr/bin/env bash
# Prepare Debian's LLVM 22 as the stand-in for the LLVM 23 bundle that cubecl's
# `tracel-llvm-bundler` (23.1.0-4) downloads from GitHub when the `cuda` (or `rocm`)
# feature is built. With the stand-in in place the bundler finds its "installed" marker,
# skips the download, and cubecl-llvm links against Debian's LLVM: the build works offline.
#
# What the bundler looks for (tracel-llvm-bundler-23.1.0-4, src/config.rs):
#   $XDG_DATA_HOME/tracel/tracel-llvm-23.1.0-4        (XDG default: ~/.local/share)
#     .tracel-llvm-installed                           marker: skip the download
#     bin/llvm-config                                  run as `llvm-config --link-static --<arg>`
#     include/, lib/                                   (llvm-config reports Debian's own dirs)
#
# Usage:  scripts/llvm-standin.sh [--install] [--rocm] [--check] [--remove]
#   --install  apt-get install the missing Debian packages (needs root or sudo)
#   --rocm     also require what the `rocm` feature needs (LLD 22 libraries)
#   --check    only report whether the stand-in is in place (exit 1 if not); with --rocm,
#              also whether LLD's headers and libraries are there
#   --remove   delete the stand-in directory (the bundler then downloads again)
# Idempotent: running it again rewrites the same files.
set -euo pipefail

LLVM_MAJOR=22
BUNDLE_VERSION=23.1.0-4
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
DEST="$DATA_HOME/tracel/tracel-llvm-$BUNDLE_VERSION"
# where Debian installs LLVM 22; EXBURN_LLVM_PREFIX points elsewhere (another layout, or tests)
LLVM_PREFIX=${EXBURN_LLVM_PREFIX:-/usr/lib/llvm-$LLVM_MAJOR}
PKGS=(llvm-$LLVM_MAJOR-dev libpolly-$LLVM_MAJOR-dev libzstd-dev)
# what the `rocm` feature needs of LLD (liblld-22-dev): cubecl-llvm's AMDGPU shim compiles
# against its headers and links its libraries
LLD_FILES=(include/lld/Common/Driver.h lib/liblldCommon.a lib/liblldELF.a)

# prints the first of LLD_FILES missing under LLVM_PREFIX; fails when none is
missing_lld() {
  for f in "${LLD_FILES[@]}"; do
    [ -e "$LLVM_PREFIX/$f" ] || { echo "$LLVM_PREFIX/$f"; return 0; }
  done
  return 1
}

install=0 rocm=0 check=0 remove=0
for a in "$@"; do
  case "$a" in
    --install) install=1 ;;
    --rocm) rocm=1 ;;
    --check) check=1 ;;
    --remove) remove=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option: $a (see --help)" >&2; exit 2 ;;
  esac
done
[ "$rocm" = 1 ] && PKGS+=(liblld-$LLVM_MAJOR-dev)

if [ "$remove" = 1 ]; then
  rm -rf "$DEST"; echo "removed $DEST"; exit 0
fi

if [ "$check" = 1 ]; then
  if ! [ -f "$DEST/.tracel-llvm-installed" ] || ! "$DEST/bin/llvm-config" --version >/dev/null 2>&1; then
    echo "stand-in missing or broken: $DEST" >&2; exit 1
  fi
  # with --rocm the stand-in alone is not enough
  if [ "$rocm" = 1 ] && f=$(missing_lld); then
    echo "stand-in ready but $f is missing (rocm needs liblld-$LLVM_MAJOR-dev)" >&2; exit 1
  fi
  echo "stand-in ready: $DEST (LLVM $("$DEST/bin/llvm-config" --version))"; exit 0
fi

# The bundler ships LLVM 23; a different one must never be mistaken for it silently.
if [ -d "$DEST" ] && [ ! -L "$DEST/lib" ] && [ -f "$DEST/.tracel-llvm-installed" ]; then
  echo "$DEST holds a real downloaded LLVM bundle: nothing to do (use --remove first to replace it)."
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$install" = 1 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
  else
    cat >&2 <<MSG
Missing Debian packages: ${missing[*]}
LLVM $LLVM_MAJOR is in Debian 12 (bookworm) through bookworm-security, and in Debian 13 (trixie).
Install them with
    sudo apt-get install ${missing[*]}
or run this script again with --install.
MSG
    exit 1
  fi
fi

REAL="$(command -v llvm-config-$LLVM_MAJOR || true)"
[ -n "$REAL" ] || REAL="$LLVM_PREFIX/bin/llvm-config"
if [ ! -x "$REAL" ]; then
  echo "llvm-config for LLVM $LLVM_MAJOR not found (looked for llvm-config-$LLVM_MAJOR and $REAL)" >&2
  exit 1
fi
ver="$("$REAL" --version)"
case "$ver" in
  "$LLVM_MAJOR".*) ;;
  *) echo "expected LLVM $LLVM_MAJOR.x from $REAL, got $ver" >&2; exit 1 ;;
esac
# the static libraries the bundler links (llvm-config --link-static --libs)
LLVM_LIBS=(libLLVMCore.a libLLVMNVPTXCodeGen.a)
[ "$rocm" = 1 ] && LLVM_LIBS+=(libLLVMAMDGPUCodeGen.a)
for lib in "${LLVM_LIBS[@]}"; do
  [ -f "$LLVM_PREFIX/lib/$lib" ] || { echo "missing $LLVM_PREFIX/lib/$lib (is llvm-$LLVM_MAJOR-dev complete?)" >&2; exit 1; }
done
if [ "$rocm" = 1 ] && f=$(missing_lld); then
  echo "missing $f (rocm needs liblld-$LLVM_MAJOR-dev)" >&2; exit 1
fi

mkdir -p "$DEST/bin"
ln -sfn "$LLVM_PREFIX/include" "$DEST/include"
ln -sfn "$LLVM_PREFIX/lib" "$DEST/lib"
# Debian's llvm-config prints Z3 as an absolute path (/usr/lib/.../libz3.so); the bundler
# turns every token into a bare library name, so hand it `-lz3` instead.
cat > "$DEST/bin/llvm-config" <<WRAP
#!/bin/sh
# written by ExBurn scripts/llvm-standin.sh: Debian LLVM $LLVM_MAJOR standing in for tracel-llvm $BUNDLE_VERSION
"$REAL" "\$@" | sed -E 's#(^| )/[^ ]*/libz3\.so[^ ]*#\1-lz3#g'
WRAP
chmod +x "$DEST/bin/llvm-config"
: > "$DEST/.tracel-llvm-installed"

echo "stand-in ready: $DEST -> LLVM $ver ($REAL)"
echo "system libs: $("$DEST/bin/llvm-config" --link-static --system-libs)"
echo "now build with:  EXBURN_FEATURES=cuda mix compile"
