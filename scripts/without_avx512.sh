#!/bin/sh
# Runs a command as an x86-64-v3 CPU (AVX2, FMA; no AVX-512, no AMX) would run it, on a CPU that
# has AVX-512: every CPUID the command and its children execute has the AVX-512 and AMX bits
# cleared (cpuid_mask.c, through Linux's CPUID faulting), and glibc is told the same. ExBurn's
# kernels, the gemm crate, PyTorch/oneDNN and ggml built without GGML_NATIVE pick their AVX2 code.
#
#   scripts/without_avx512.sh mix run bench/pretrained.exs embed
#
# The shim is compiled with cc into ~/.cache/ex_burn/ on first use. Benchmarks name the machine's
# tier "avx512-as-avx2" and say that AVX-512 was hidden (bench/support/machine.exs reads
# EXBURN_CPUID_MASK).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if ! grep -qw cpuid_fault /proc/cpuinfo; then
  echo "without_avx512: this CPU (or its hypervisor) has no CPUID faulting" >&2
  exit 70
fi
lib="$HOME/.cache/ex_burn/cpuid_mask.so"
if [ ! -s "$lib" ] || [ "$here/cpuid_mask.c" -nt "$lib" ]; then
  mkdir -p "$(dirname "$lib")"
  cc -O2 -shared -fPIC -o "$lib.tmp" "$here/cpuid_mask.c"
  mv "$lib.tmp" "$lib"
fi
export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
export GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"
export EXBURN_CPUID_MASK=avx512
exec "$@"
