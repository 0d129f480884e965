#!/usr/bin/env bash
# A CUDA 13.0 toolkit for building Candle's CUDA engine (the `candle-cuda` feature) offline,
# assembled from NVIDIA's PyPI wheels: nvcc (with its crt headers and NVVM), the runtime and CCCL
# headers, and the libraries candle's cudarc links at build time (`dynamic-linking`): cuBLAS,
# cuBLASLt, cuRAND, NVRTC and the CUDA runtime. The driver (libcuda) comes with the GPU's
# driver; for the link a stub is generated from the wheel's cuda.h, as the toolkit's own
# lib/stubs/libcuda.so is. No GPU and no system CUDA are needed to build.
#
# Layout (EXBURN_CUDA_HOME, default ~/.cache/ex_burn/cuda-13.0):
#   wheels/          the downloaded wheels (kept: a second run downloads nothing)
#   root/            the wheels unpacked
#   bin include lib nvvm   links into root/nvidia/cu13, as a toolkit lays them out
#   lib/lib*.so      link names for the versioned libraries; lib/stubs/libcuda.so the stub
#
# Usage:  scripts/cuda-toolkit.sh [--env] [--check]
#   (none)   download what is missing, lay the toolkit out and check that nvcc makes PTX
#   --env    the same, then print the environment a build needs (eval "$(... --env)")
#   --check  only report whether the toolkit is in place (exit 1 if not)
# The build's GPU generation comes from CUDA_COMPUTE_CAP (default 90: H100/H200); the PTX is
# ISA 9.0, which drivers of CUDA 13.0 (580) and later load. Idempotent.
set -euo pipefail

DEST=${EXBURN_CUDA_HOME:-$HOME/.cache/ex_burn/cuda-13.0}
WHEELS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14 nvidia-curand==10.4.5.25
)
# link name -> the versioned file the wheels hold (relative to root/nvidia)
LINKS=(
  libcublas.so:cu13/lib/libcublas.so.13 libcublasLt.so:cu13/lib/libcublasLt.so.13
  libcurand.so:cu13/lib/libcurand.so.10 libnvrtc.so:cu13/lib/libnvrtc.so.13
  libcudart.so:cu13/lib/libcudart.so.13
)

env_only=0 check=0
for a in "$@"; do
  case "$a" in
    --env) env_only=1 ;;
    --check) check=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown option: $a (see --help)" >&2; exit 2 ;;
  esac
done

ready() {
  [ -x "$DEST/bin/nvcc" ] && [ -f "$DEST/lib/stubs/libcuda.so" ] && [ -e "$DEST/include/crt/host_config.h" ] &&
    "$DEST/bin/nvcc" --version >/dev/null 2>&1
}

if [ "$check" = 1 ]; then
  if ready; then echo "CUDA toolkit in place: $DEST"; exit 0; fi
  echo "CUDA toolkit missing or incomplete: $DEST (run scripts/cuda-toolkit.sh)" >&2
  exit 1
fi

say() { [ "$env_only" = 1 ] && echo "$*" >&2 || echo "$*"; }

if ! ready; then
  mkdir -p "$DEST/wheels" "$DEST/root"
  missing=()
  for w in "${WHEELS[@]}"; do
    file=$(echo "${w%%==*}" | tr - _)-${w##*==}-
    ls "$DEST/wheels/$file"*.whl >/dev/null 2>&1 || missing+=("$w")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "downloading ${missing[*]}"
    python3 -m pip download --quiet --no-deps -d "$DEST/wheels" "${missing[@]}" >&2
  fi
  for whl in "$DEST"/wheels/*.whl; do
    python3 -m zipfile -e "$whl" "$DEST/root"
  done
  chmod +x "$DEST"/root/nvidia/cu13/bin/* "$DEST"/root/nvidia/cu13/nvvm/bin/* 2>/dev/null || true
  for d in bin include nvvm; do ln -sfn "root/nvidia/cu13/$d" "$DEST/$d"; done
  mkdir -p "$DEST/lib/stubs"
  for f in "$DEST"/root/nvidia/cu13/lib/*; do ln -sfn "$f" "$DEST/lib/$(basename "$f")"; done
  for l in "${LINKS[@]}"; do ln -sfn "$DEST/root/nvidia/${l#*:}" "$DEST/lib/${l%%:*}"; done
  # the driver stub: every function cuda.h declares (after its versioning macros), failing
  stub=$(mktemp -d)
  echo '#include <cuda.h>' | gcc -E -I"$DEST/include" -x c - |
    grep -oE '\bCUresult +(__attribute__\(\(\w+\)\) +)?cu[A-Za-z0-9_]+ *\(' | grep -oE 'cu[A-Za-z0-9_]+ *\($' | tr -d ' (' | sort -u |
    sed 's/.*/int &(void) { return 999; }/' >"$stub/libcuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$DEST/lib/stubs/libcuda.so" "$stub/libcuda.c"
  rm -rf "$stub"
  # nvcc makes PTX for the asked generation
  probe=$(mktemp -d)
  printf '#include <cuda_fp16.h>\n#include <cuda_bf16.h>\nextern "C" __global__ void k(__half *a, float *o) { o[threadIdx.x] = __half2float(a[threadIdx.x]); }\n' >"$probe/k.cu"
  "$DEST/bin/nvcc" --ptx -arch="sm_${CUDA_COMPUTE_CAP:-90}" "$probe/k.cu" -o "$probe/k.ptx" >&2
  rm -rf "$probe"
  ready || { echo "the toolkit in $DEST is incomplete" >&2; exit 1; }
  say "CUDA toolkit ready: $DEST ($(grep -c '' <(ls "$DEST/lib")) libraries, $(nm -D "$DEST/lib/stubs/libcuda.so" | grep -c ' T cu') driver functions stubbed)"
fi

if [ "$env_only" = 1 ]; then
  cat <<EOF
export PATH="$DEST/bin:\$PATH"
export CUDA_PATH="$DEST"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDARC_CUDA_VERSION=13000
export LIBRARY_PATH="$DEST/lib:$DEST/lib/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
EOF
fi
