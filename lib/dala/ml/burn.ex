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

  ## Tensors come back in the caller's representation

  Every function here that returns tensors for tensor input (`predict/3`,
  `Dala.ML.Burn.Serving.run/2` and `Dala.ML.Burn.Serving.batched_run/2`) answers Nx input (an
  `Nx.Tensor` or `Nx.Batch`) with Nx tensors on `ExBurn.Backend`, and any other input
  (`ExBurn.Tensor`s, nested lists, numbers) with `ExBurn.Tensor`s. The Nx results wrap the Burn
  tensors the model computed (no copy), so `Nx.argmax(predictions, axis: 1)` and the rest of Nx
  work on them directly. `zeros/2` and `ones/2` create `ExBurn.Tensor`s; `from_nx/1` and
  `to_nx/1` convert explicitly.
  """

  alias ExBurn.Model
  alias Dala.ML.Burn.Repr

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

  @doc """
  `{:ok, %ExBurn.Tensor{}}` from an Nx tensor (`{:error, reason}` without Nx or for a
  non-tensor). A tensor on `ExBurn.Backend` is not copied: the result is a new reference to its
  Burn tensor, so freeing one leaves the other usable.
  """
  def from_nx(tensor) do
    if nx_tensor?(tensor),
      do: {:ok, tensor |> Repr.to_et() |> Repr.own()},
      else: {:error, not_nx(tensor)}
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  @doc """
  `{:ok, %Nx.Tensor{}}` on `ExBurn.Backend` (on the tensor's device) from an ExBurn tensor,
  without a copy: a new reference to the same Burn tensor, so freeing one leaves the other
  usable. `{:error, reason}` without Nx. `Nx.backend_transfer/2` moves it to another backend.
  """
  def to_nx(%ExBurn.Tensor{} = t) do
    {:ok, t |> Repr.own() |> Repr.to_nx()}
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  def to_nx(other),
    do: {:error, %ExBurn.Error{op: :to_nx, reason: "expected an ExBurn.Tensor", details: %{got: other}}}

  defp nx_tensor?(%{__struct__: Nx.Tensor} = t), do: Repr.nx?(t)
  defp nx_tensor?(_), do: false

  defp not_nx(tensor) do
    reason = if Code.ensure_loaded?(Nx), do: "expected an Nx tensor", else: "Nx is not loaded"
    %ExBurn.Error{op: :from_nx, reason: reason, details: %{got: tensor}}
  end

  @doc """
  Compiles a model (see `ExBurn.Model.compile/2`); returns `%ExBurn.Model{}`. As the Dala guide's
  optimizer table says, `optimizer: :sgd` uses momentum 0.9 unless `:momentum` is given
  (`ExBurn.Model.compile/2` itself defaults to plain SGD).
  """
  def compile(model, opts \\ []) do
    opts = if opts[:optimizer] == :sgd, do: Keyword.put_new(opts, :momentum, 0.9), else: opts

    Model.compile(model, opts)
  end

  @doc "Trains (see `ExBurn.Model.fit/3`); returns the trained model."
  defdelegate fit(model, data, opts \\ []), to: Model

  @doc """
  `{:ok, predictions}` or `{:error, %ExBurn.Error{}}`. The predictions (f32, `{n | output_shape}`)
  are an Nx tensor on `ExBurn.Backend` when `input` is an Nx tensor, else an `ExBurn.Tensor`
  (`input` may be an `ExBurn.Tensor`, a nested list or `{binary, type, shape}`). Options as
  `ExBurn.Model.predict/3` (`:batch_size`).
  """
  def predict(model, input, opts \\ []) do
    {:ok, model |> Model.predict(input, opts) |> Repr.like(input)}
  rescue
    e in ExBurn.Error -> {:error, e}
  end

  @doc """
  The average loss over `{x, y}` (a float); `x` and `y` may be Nx tensors, `ExBurn.Tensor`s or
  lists. Options as `ExBurn.Model.evaluate/3` (`:batch_size`).
  """
  def evaluate(model, data, opts \\ []), do: Model.evaluate(model, data, opts)

  @doc "The model summary as a printable string."
  def summary(model), do: Model.summary_string(model)

  @doc "Saves the model atomically: `:ok` or `{:error, %ExBurn.Error{}}`."
  defdelegate save(model, path), to: Model

  @doc """
  `load(model, path)` loads weights into a compatible model; `load(path, opts)` rebuilds the
  saved model. `{:ok, model}` or `{:error, %ExBurn.Error{}}`.
  """
  defdelegate load(model_or_path, path_or_opts \\ []), to: Model

  @doc """
  Releases a model (`ExBurn.Model.free/1`), an `ExBurn.Tensor` (`ExBurn.Tensor.deallocate/1`) or
  an Nx tensor (`Nx.backend_deallocate/1`); `:ok`.
  """
  def free(%Model{} = model), do: Model.free(model)
  def free(tensor), do: Repr.deallocate(tensor)
end
