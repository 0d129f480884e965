defmodule ExBurn.Precision do
  @moduledoc """
  f32 matrix-product precision, as PyTorch's `torch.set_float32_matmul_precision` names it.

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
