defmodule ExBurn.Precision do
  @moduledoc """
  f32 precision settings: the matrix-product precision, as PyTorch's
  `torch.set_float32_matmul_precision` names it, and the CPU's math mode (below).

    * `:highest` (the default) — true f32: f32 inputs, f32 accumulation. What an f32 tensor
      promises.
    * `:high` — f32 inputs may be rounded to TF32 (10-bit mantissa) on GPUs with tensor cores:
      several times faster on CUDA, about 1e-3 relative error instead of about 1e-6.

  The level applies to `Nx.dot/2,4,6` (and so to `Nx.Defn` code built on it) on CUDA devices,
  where ExBurn runs f32/f16/bf16/f64 products on cuBLAS. flex (CPU) and Vulkan always compute f32
  products in f32, so the option is accepted there and changes nothing; f16/bf16/f64 products are
  never affected.

  Set it for the whole VM with `ExBurn.configure!(matmul_precision: :high)`, or for the calls one
  process makes inside a function with `ExBurn.with_matmul_precision(:high, fn -> ... end)`.
  Programs compiled with `compiler: ExBurn` follow the VM-wide level only: the per-process one
  reaches `ExBurn.Backend` and `ExBurn.Tensor` calls.

  Limits (Burn 0.22.1): convolutions and the dense layers of `ExBurn.Model` training run Burn's
  own CUDA kernels, which round f32 to TF32 whatever this level says.

  ## Math mode

  The CPU's other precision setting: how f32 `exp`, `log`, `tanh`, `erf`, `sigmoid` and the
  softmax the compiler fuses are computed.

    * `:exact` (the default) — glibc's results bit for bit (libm's for `erf`), the digits
      Nx.BinaryBackend and PyTorch's CPU build print.
    * `:fast` — kernels in f32 vector lanes, within 2 ulp of the correctly rounded result on
      every f32 input, with the same results at ±0, ±Inf, NaN and past the overflow and
      underflow thresholds; the fused softmax multiplies by the reciprocal of the sum.

  Set it for the VM with `ExBurn.configure!(math: :fast)`; the VM starts in the mode the
  `EXBURN_MATH` environment variable names (`exact` or `fast`), else `:exact`. Other types
  (f16, bf16, f64), other devices, `ExBurn.Model` and the pre-trained models are unaffected.
  `guides/configuration.md` lists what changes.
  """

  alias ExBurn.Native

  @levels [:highest, :high]
  @key {__MODULE__, :matmul_precision}

  @doc "The accepted levels."
  def levels, do: @levels

  @doc "Raises `ExBurn.Error` unless `level` is one of `levels/0`; answers `level`."
  def validate!(level, op \\ :configure)
  def validate!(level, _op) when level in @levels, do: level

  def validate!(level, op) do
    raise ExBurn.Error,
      op: op,
      reason: "matmul_precision must be :highest or :high",
      details: %{got: level}
  end

  @doc "Sets the VM-wide level; answers the previous one."
  def set_global!(level) do
    level |> validate!() |> Native.set_matmul_precision() |> ExBurn.Error.unwrap!()
  end

  @doc "The VM-wide level."
  def global, do: ExBurn.Error.unwrap!(Native.matmul_precision())

  @doc "The VM-wide math mode, `:exact` or `:fast`."
  def math, do: ExBurn.Error.unwrap!(Native.math_mode())

  @doc """
  Sets the VM-wide math mode (`:exact` or `:fast`); answers the previous one. Any other value
  raises `ExBurn.Error` and changes nothing.
  """
  def set_math!(mode), do: ExBurn.Error.unwrap!(Native.set_math_mode(mode))

  @doc "The level the calling process asked for with `with/2`, or nil (then the VM-wide level applies)."
  def current, do: Process.get(@key)

  @doc "The level the next product of this process runs at."
  def effective, do: current() || global()

  @doc "Runs `fun` with `level` for the products this process makes; restores the previous level."
  def with(level, fun) do
    validate!(level, :with_matmul_precision)

    unless is_function(fun, 0) do
      raise ExBurn.Error,
        op: :with_matmul_precision,
        reason: "expected a function of arity 0",
        details: %{got: fun}
    end

    previous = Process.put(@key, level)

    try do
      fun.()
    after
      if previous, do: Process.put(@key, previous), else: Process.delete(@key)
    end
  end
end
