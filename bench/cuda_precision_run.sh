#!/usr/bin/env bash
# The CUDA precision/speed run on a GPU machine, everything in one invocation so PyTorch and
# ExBurn share the card and the run. Expects, under $BUNDLE (default .gpu):
#   bins.tar.xz   burn_bench (cuda), the cargo test binary (cuda, no NIF) as ex_burn_tests,
#                 optionally burn_bench_vulkan
#   nif.tar.xz    priv/native/libex_burn.so built with EXBURN_FEATURES=cuda
#   beam.tar.xz   /usr/lib/erlang and /usr/lib/elixir (Debian's), if the machine has no Elixir
# Usage: bench/cuda_precision_run.sh rust|nif [OUTDIR]
set -uo pipefail
mode=${1:?rust|nif}; out=${2:-/tmp/cuda-precision-out}; bundle=${BUNDLE:-.gpu}
mkdir -p "$out" /tmp/xb /tmp/pd
nv=$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "lib"))))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${nv}:${LD_LIBRARY_PATH:-}
nvidia-smi -L
python3 bench/cuda_precision.py prepare /tmp/pd
timeout 300 python3 bench/cuda_precision.py torch /tmp/pd | tee "$out/torch.txt"
case $mode in
rust)
  tar -xJf "$bundle/bins.tar.xz" -C /tmp/xb
  timeout 400 /tmp/xb/burn_bench precision /tmp/pd cuda 2>&1 | tee "$out/burn.txt"
  python3 bench/cuda_precision.py errors /tmp/pd | tee "$out/errors.txt"
  # the crate's device-parameterised tests, one process (.ci/isolated-tests runs one per test)
  EXBURN_TEST_DEVICE=cuda timeout 400 /tmp/xb/ex_burn_tests --test-threads 4 ops:: tensor:: model::train device:: compiler:: precision:: 2>&1 | tee "$out/tests.txt" | grep -E "FAILED|panicked|test result" | head -40
  # the precision test must catch Burn's own (TF32) kernel: expected to FAIL with cuBLAS off
  EXBURN_CUBLAS=0 EXBURN_TEST_DEVICE=cuda timeout 120 /tmp/xb/ex_burn_tests f32_products_are_true_f32 2>&1 | grep -E "relative error|test result" | tee "$out/negative.txt"
  if [ -x /tmp/xb/burn_bench_vulkan ] && [ -d .gl ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    timeout 300 /tmp/xb/burn_bench_vulkan device vulkan 2>&1 | tee "$out/vulkan.txt"
  fi
  ;;
nif)
  command -v elixir >/dev/null || tar -xJf "$bundle/beam.tar.xz" -C /
  export PATH=/usr/lib/erlang/bin:/usr/lib/elixir/bin:$PATH HOME=${HOME:-/root} LANG=C.UTF-8
  tar -xJf "$bundle/nif.tar.xz" -C .
  echo cuda > priv/native/ex_burn.features
  export EXBURN_SKIP_NATIVE=1
  MIX_ENV=test timeout 400 mix run bench/cuda_precision.exs /tmp/pd cuda 2>&1 | tee "$out/nif.txt"
  python3 bench/cuda_precision.py errors /tmp/pd | tee "$out/errors.txt"
  EXBURN_DEVICE=cuda MIX_ENV=test timeout 400 mix test ${EXS_TESTS:-test/ex_burn} 2>&1 | tee "$out/mix_test_cuda.txt" | tail -60
  ;;
esac
