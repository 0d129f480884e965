defmodule ExBurn do
  @moduledoc """
  ExBurn puts the [Burn](https://burn.dev) deep-learning framework (Rust) behind Elixir: tensors
  on Burn devices (CPU through Burn's `flex` backend; Vulkan/Metal/CUDA/ROCm when compiled in),
  on the way to an Nx backend and native training.

  * `ExBurn.Tensor` - tensors and operations (Nx names and semantics)
  * `ExBurn.Type` - numeric types and promotion
  * `ExBurn.Error` - the exception every failure raises
  * `ExBurn.Native` - the raw NIFs
  """

  @doc """
  Devices the native library can use, as maps:
  `%{kind: :cpu, index: 0, name: "...", dtypes: [type, ...]}`.
  """
  def devices, do: ExBurn.Error.unwrap!(ExBurn.Native.devices())

  @doc "True when `device` (`:cpu` or `{kind, index}`) can hold tensors of `type`."
  def supports_type?(device, type) do
    device = ExBurn.Tensor.Util.device!(:supports_type, device)
    ExBurn.Error.unwrap!(ExBurn.Native.supports_type(device, ExBurn.Type.normalize(type)))
  end

  @doc """
  The device new tensors go to when no `:device` option is given. See `ExBurn.Device.default/0`:
  `configure!/1`, else `EXBURN_DEVICE`, else `config :ex_burn, device: ...`, else `:auto`.
  """
  defdelegate default_device, to: ExBurn.Device, as: :default

  @doc """
  Sets the default device: `configure!(device: :auto | :cpu | :vulkan | :metal | :cuda | :rocm |
  {kind, index})`, and/or the f32 matrix-product precision: `configure!(matmul_precision:
  :highest | :high)`, and/or the CPU's f32 math mode: `configure!(math: :exact | :fast)`
  (`ExBurn.Precision`). Raises `ExBurn.Error` when the device is not usable here or a setting is
  not one of those.
  """
  defdelegate configure!(opts), to: ExBurn.Device

  @doc "The VM-wide f32 math mode of the CPU, `:exact` unless configured. See `ExBurn.Precision`."
  defdelegate math, to: ExBurn.Precision

  @doc """
  Runs `fun` with f32 matrix products of the calling process at `level` (`:highest` = true f32,
  `:high` = TF32 allowed on CUDA), then restores the previous level. See `ExBurn.Precision`.
  """
  defdelegate with_matmul_precision(level, fun), to: ExBurn.Precision, as: :with

  @doc "The VM-wide f32 matrix-product precision (`:highest` unless configured). See `ExBurn.Precision`."
  defdelegate matmul_precision, to: ExBurn.Precision, as: :global

  # `compiler: ExBurn` in `Nx.Defn.jit/2` or `defn` options: the module delegates to
  # `ExBurn.Defn.Compiler`, as `compiler: EXLA` does in EXLA. Defined only when Nx is loaded.
  if Code.ensure_loaded?(Nx.Defn.Compiler) do
    @behaviour Nx.Defn.Compiler

    @impl true
    defdelegate __jit__(key, vars, fun, args_list, opts), to: ExBurn.Defn.Compiler

    @impl true
    defdelegate __compile__(key, vars, fun, opts), to: ExBurn.Defn.Compiler

    @impl true
    defdelegate __partitions_options__(opts), to: ExBurn.Defn.Compiler

    @impl true
    defdelegate __to_backend__(opts), to: ExBurn.Defn.Compiler
  end
end
