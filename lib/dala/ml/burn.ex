defmodule Dala.ML.Burn do
  @moduledoc """
  The Dala-facing facade over ExBurn: device checks, Burn tensors, and native training with
  `ExBurn.Model` (Burn autodiff and optimizers inside the NIF).

      model =
        ExBurn.Model.input({nil, 2})
        |> ExBurn.Model.dense(8, activation: :tanh)
        |> ExBurn.Model.dense(2)

      compiled = Dala.ML.Burn.compile(model, loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05)
      trained = Dala.ML.Burn.fit(compiled, {x, y}, epochs: 200, batch_size: 4)
      {:ok, predictions} = Dala.ML.Burn.predict(trained, x)

  `compile/2` takes an `ExBurn.Model` builder pipeline, or an `%Axon{}` model when Axon is
  loaded. Options of `compile/2` and `fit/3` are those of `ExBurn.Model.compile/2` and
  `ExBurn.Model.fit/3`; an unknown option raises `ExBurn.Error` naming it. Callbacks and history:
  `Dala.ML.Burn.Training`.
  """

  alias ExBurn.Model

  @doc "True when the ExBurn native library is loaded."
  def available?, do: ExBurn.Native.loaded?()

  @doc "True when a non-CPU (GPU) device is available."
  def gpu?, do: available?() and Enum.any?(ExBurn.devices(), &(&1.kind != :cpu))

  @doc "`:gpu` when the default ExBurn device is a GPU, else `:cpu`."
  def default_device do
    case ExBurn.default_device() do
      {:cpu, _} -> :cpu
      _ -> :gpu
    end
  end

  @doc """
  Sets the default ExBurn device (`device: :gpu | :cpu | {kind, index}`; without it the device
  is picked automatically) and, when Nx and `ExBurn.Backend` are loaded, makes
  `{ExBurn.Backend, device: device}` Nx's global default backend. Returns `:ok`; raises
  `ExBurn.Error` for an unavailable device or an unknown option.
  """
  def configure!(opts \\ []) do
    opts = ExBurn.Model.Options.keyword!(:configure, opts, [:device])
    device = set_device!(device!(Keyword.get(opts, :device, :auto)))

    if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(ExBurn.Backend),
      do: apply(Nx, :global_default_backend, [{ExBurn.Backend, device: device}])

    :ok
  end

  defp device!(:gpu) do
    case Enum.find(ExBurn.devices(), &(&1.kind != :cpu)) do
      %{kind: kind, index: index} ->
        {kind, index}

      nil ->
        raise ExBurn.Error, op: :configure, reason: "no GPU device is available", details: %{device: :gpu}
    end
  end

  defp device!(spec), do: spec

  # ExBurn.configure!/1 validates and records the default device.
  defp set_device!(spec) do
    if function_exported?(ExBurn, :configure!, 1) do
      apply(ExBurn, :configure!, [[device: spec]])
    else
      device = ExBurn.Tensor.Util.device!(:configure, spec)
      Application.put_env(:ex_burn, :device, device)
      device
    end
  end

  @doc "A Burn tensor of zeros: `zeros([3, 3], :f32)`."
  def zeros(shape, type), do: ExBurn.Tensor.zeros(shape, type)

  @doc "A Burn tensor of ones: `ones([2, 4], :f32)`."
  def ones(shape, type), do: ExBurn.Tensor.ones(shape, type)

  @doc "`{:ok, %ExBurn.Tensor{}}` from an Nx tensor (`{:error, reason}` without Nx or for a non-tensor)."
  def from_nx(tensor) do
    if nx_tensor?(tensor) do
      {:ok,
       ExBurn.Tensor.from_binary(apply(Nx, :to_binary, [tensor]), apply(Nx, :type, [tensor]),
         shape: apply(Nx, :shape, [tensor])
       )}
    else
      {:error, not_nx(tensor)}
    end
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  @doc "`{:ok, %Nx.Tensor{}}` (on Nx's default backend) from an ExBurn tensor; `{:error, reason}` without Nx."
  def to_nx(%ExBurn.Tensor{} = t) do
    if Code.ensure_loaded?(Nx) do
      {:ok,
       apply(Nx, :from_binary, [ExBurn.Tensor.to_binary(t), t.type])
       |> then(&apply(Nx, :reshape, [&1, t.shape]))}
    else
      {:error, %ExBurn.Error{op: :to_nx, reason: "Nx is not loaded", details: %{}}}
    end
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  def to_nx(other),
    do: {:error, %ExBurn.Error{op: :to_nx, reason: "expected an ExBurn.Tensor", details: %{got: other}}}

  defp nx_tensor?(%{__struct__: Nx.Tensor}), do: Code.ensure_loaded?(Nx)
  defp nx_tensor?(_), do: false

  defp not_nx(tensor) do
    reason = if Code.ensure_loaded?(Nx), do: "expected an Nx tensor", else: "Nx is not loaded"
    %ExBurn.Error{op: :from_nx, reason: reason, details: %{got: tensor}}
  end

  @doc "Compiles a model (see `ExBurn.Model.compile/2`); returns `%ExBurn.Model{}`."
  defdelegate compile(model, opts \\ []), to: Model

  @doc "Trains (see `ExBurn.Model.fit/3`); returns the trained model."
  defdelegate fit(model, data, opts \\ []), to: Model

  @doc "`{:ok, predictions}` (an `ExBurn.Tensor`) or `{:error, %ExBurn.Error{}}`."
  def predict(model, input) do
    {:ok, Model.predict(model, input)}
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  @doc "The average loss over `{x, y}` (a float)."
  def evaluate(model, data), do: Model.evaluate(model, data)

  @doc "The model summary as a printable string."
  def summary(model), do: Model.summary_string(model)

  @doc "Saves the model atomically: `:ok` or `{:error, %ExBurn.Error{}}`."
  defdelegate save(model, path), to: Model

  @doc """
  `load(model, path)` loads weights into a compatible model; `load(path, opts)` rebuilds the
  saved model. `{:ok, model}` or `{:error, %ExBurn.Error{}}`.
  """
  defdelegate load(model_or_path, path_or_opts \\ []), to: Model

  @doc "Releases a model (`ExBurn.Model.free/1`) or a tensor (`ExBurn.Tensor.deallocate/1`); `:ok`."
  def free(%Model{} = model), do: Model.free(model)

  def free(%ExBurn.Tensor{} = t) do
    _ = ExBurn.Tensor.deallocate(t)
    :ok
  end
end
