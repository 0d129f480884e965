#!/usr/bin/env bash
# Where a CUDA step's time goes: the same loops through PyTorch and through the crate from one
# Rust thread (`burn_bench steps`), timed plainly and then under Nsight Compute for each kernel's
# GPU time, all on one card in one invocation.
#
#     bench/cuda_kernel_profile.sh BURN_BENCH [OUTDIR]
#
# BURN_BENCH is the example built with `--no-default-features --features cuda`. Needs python3
# with torch and Nsight Compute (`ncu`, in the CUDA toolkit). `--clock-control none` keeps the
# clocks a normal run gets (ncu otherwise locks them to base, which slows the products).
# The BEAM cannot be profiled this way (ncu's injection stops its erl_child_setup helper), which
# is why the crate's side runs from Rust; bench/cuda_precision.exs times the NIF path.
set -uo pipefail
bin=${1:?burn_bench binary}; out=${2:-/tmp/cuda-kernel-profile}; dir=$out/inputs
mkdir -p "$dir"
[ -f "$dir/y.bin" ] || python3 bench/cuda_precision.py prepare "$dir"
ncu=(ncu --metrics gpu__time_duration.sum --csv --print-units base --clock-control none)
for case in bf16 add; do
  echo "== plain $case, load $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 300 python3 bench/cuda_precision.py steps "$dir" $case
  timeout 300 "$bin" steps "$dir" $case
  timeout 600 "${ncu[@]}" python3 bench/cuda_precision.py steps "$dir" $case > "$out/ncu_torch_$case.csv" 2> "$out/ncu_torch_$case.err"
  timeout 600 "${ncu[@]}" "$bin" steps "$dir" $case > "$out/ncu_burn_$case.csv" 2> "$out/ncu_burn_$case.err"
  python3 bench/ncu_summary.py "$out/ncu_torch_$case.csv" "$out/ncu_burn_$case.csv"
done
