defmodule ExBurn.Device do
  @moduledoc """
  Devices, picked at load time from the backends compiled into the native library.

  A device is `{kind, index}` with kind `:cpu` (Burn's `flex` backend, always present),
  `:vulkan`, `:metal`, `:cuda` or `:rocm` (each a cargo feature, see the README). Specs accepted
  wherever a device is asked for: `:auto`, a kind (index 0), `{kind, index}`, or a string such as
  `"vulkan:1"` (the form `EXBURN_DEVICE` takes).

  `:auto` tries CUDA, ROCm, Metal, Vulkan, then the CPU, among the kinds compiled in. It skips
  software adapters (lavapipe, llvmpipe: they enumerate as Vulkan devices but are slower than the
  CPU backend and crash on some kernels) and any device that fails a one-element test upload, and
  logs what it chose and why, once per VM.
  """

  require Logger

  @kinds ~w(cpu vulkan metal cuda rocm)a
  @default_key {__MODULE__, :default}
  @auto_key {__MODULE__, :auto}

  @type t :: {:cpu | :vulkan | :metal | :cuda | :rocm, non_neg_integer}

  @doc "Device kinds compiled into the native library."
  def compiled_kinds, do: ExBurn.Error.unwrap!(ExBurn.Native.compiled_kinds())

  @doc """
  What `:auto` picks on this machine, as `{device, reason}`; computed once per VM.
  """
  def auto do
    case :persistent_term.get(@auto_key, nil) do
      nil -> :global.trans({@auto_key, self()}, &probe_once/0, [node()])
      cached -> cached
    end
  end

  # Under the lock, so concurrent first callers probe (and log) once.
  defp probe_once do
    case :persistent_term.get(@auto_key, nil) do
      nil ->
        {device, reason} = ExBurn.Error.unwrap!(ExBurn.Native.auto_device())
        Logger.info("ExBurn picked #{format(device)} automatically: #{reason}")
        :persistent_term.put(@auto_key, {device, reason})
        {device, reason}

      cached ->
        cached
    end
  end

  @doc """
  The default device: the one given to `configure!/1`, else the `EXBURN_DEVICE` environment
  variable, else `config :ex_burn, device: ...`, else `:auto` (`ExBurn.Env`'s order).
  """
  def default do
    case :persistent_term.get(@default_key, nil) do
      nil ->
        device = resolve(ExBurn.Env.get(:device))
        :persistent_term.put(@default_key, device)
        device

      device ->
        device
    end
  end

  @doc """
  Makes `device` the default: `configure!(device: spec)`. The device must exist here; asking for
  one that does not raises `ExBurn.Error` and leaves the default as it was.

  `matmul_precision: :highest | :high` sets the VM-wide f32 matrix-product precision and
  `math: :exact | :fast` the CPU's f32 math mode (`ExBurn.Precision`); given without `:device`
  they leave the default device as it is. A bad value of any option raises before anything
  changes.
  """
  def configure!(opts) do
    opts = options!(opts)
    settings_only? = opts != [] and not Keyword.has_key?(opts, :device)
    device = if settings_only?, do: default(), else: available!(resolve(Keyword.get(opts, :device, :auto)))
    # first, as the native side validates it: a bad mode raises with nothing changed yet
    if Keyword.has_key?(opts, :math), do: ExBurn.Precision.set_math!(opts[:math])
    if Keyword.has_key?(opts, :matmul_precision), do: ExBurn.Precision.set_global!(opts[:matmul_precision])
    unless settings_only?, do: :persistent_term.put(@default_key, device)
    device
  end

  defp available!(device) do
    unless available?(device) do
      raise ExBurn.Error,
        op: :configure,
        reason: "device is not available (not compiled in or not present)",
        details: %{device: device, available: Enum.map(ExBurn.devices(), &{&1.kind, &1.index})}
    end

    device
  end

  @doc "Forgets the cached default, so the next `default/0` reads the configuration again."
  def reset_default, do: :persistent_term.erase(@default_key)

  @doc "True when `device` (any spec `resolve/1` takes) is one of `ExBurn.devices/0`."
  def available?({kind, index}), do: Enum.any?(ExBurn.devices(), &(&1.kind == kind and &1.index == index))
  def available?(spec), do: spec |> resolve() |> available?()

  @doc "Turns a device spec into `{kind, index}`; `:auto` is resolved with `auto/0`."
  def resolve(:auto), do: elem(auto(), 0)
  def resolve("auto"), do: resolve(:auto)
  def resolve(kind) when kind in @kinds, do: {kind, 0}
  def resolve({kind, index} = device) when kind in @kinds and is_integer(index) and index >= 0, do: device

  def resolve(spec) when is_binary(spec) do
    with [kind | rest] <- String.split(String.trim(spec), ":"),
         kind when kind in @kinds <- Enum.find(@kinds, &(Atom.to_string(&1) == kind)),
         {index, ""} when index >= 0 <- Integer.parse(List.first(rest) || "0") do
      {kind, index}
    else
      _ -> invalid(spec)
    end
  end

  def resolve(spec), do: invalid(spec)

  defp invalid(spec) do
    raise ExBurn.Error,
      op: :device,
      reason: "invalid device (expected :auto, cpu, vulkan, metal, cuda or rocm, optionally with an index)",
      details: %{device: spec}
  end

  @doc ~S|`{:vulkan, 0}` as `"vulkan:0"` (any device spec `resolve/1` takes).|
  def format({kind, index}) when kind in @kinds and is_integer(index), do: "#{kind}:#{index}"
  def format(spec), do: spec |> resolve() |> format()

  defp options!(opts) do
    opts = Keyword.validate!(opts, [:device, :matmul_precision, :math])
    if Keyword.has_key?(opts, :matmul_precision), do: ExBurn.Precision.validate!(opts[:matmul_precision])
    opts
  rescue
    e in [ArgumentError, FunctionClauseError] ->
      reraise ExBurn.Error,
              [
                op: :configure,
                reason: "expected a keyword list of :device, :matmul_precision and :math",
                details: %{got: opts, message: Exception.message(e)}
              ],
              __STACKTRACE__
  end
end
