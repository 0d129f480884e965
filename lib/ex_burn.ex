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
  The device new tensors go to when no `:device` option is given: `config :ex_burn, device: ...`,
  else the `EXBURN_DEVICE` environment variable (`cpu`, `vulkan`, `vulkan:1`, ...), else
  `{:cpu, 0}`.
  """
  def default_device do
    case Application.get_env(:ex_burn, :device) || System.get_env("EXBURN_DEVICE") do
      nil -> {:cpu, 0}
      "" -> {:cpu, 0}
      spec -> parse_device(spec)
    end
  end

  @kinds ~w(cpu vulkan metal cuda rocm)a

  defp parse_device(kind) when kind in @kinds, do: {kind, 0}

  defp parse_device({kind, index} = device) when kind in @kinds and is_integer(index) and index >= 0,
    do: device

  defp parse_device(spec) when is_binary(spec) do
    with [kind | rest] <- String.split(String.trim(spec), ":"),
         kind when kind in @kinds <- Enum.find(@kinds, &(Atom.to_string(&1) == kind)),
         {index, ""} <- Integer.parse(List.first(rest) || "0") do
      parse_device({kind, index})
    else
      _ -> invalid_device(spec)
    end
  end

  defp parse_device(spec), do: invalid_device(spec)

  defp invalid_device(spec) do
    raise ExBurn.Error,
      op: :default_device,
      reason: "invalid device (expected cpu, vulkan, metal, cuda or rocm, optionally :index)",
      details: %{device: spec}
  end
end
