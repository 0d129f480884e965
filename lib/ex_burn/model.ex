defmodule ExBurn.Model do
  @moduledoc """
  Native training with Burn: an Axon-like layer builder, then `compile/2`, `fit/3`,
  `evaluate/3`, `predict/3`, `summary/1`, `save/2`, `load/1,2`.

      model =
        ExBurn.Model.input({nil, 2})
        |> ExBurn.Model.dense(8, activation: :tanh)
        |> ExBurn.Model.dense(2)
        |> ExBurn.Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05)

      model = ExBurn.Model.fit(model, {[[0, 0], [0, 1], [1, 0], [1, 1]], [0, 1, 1, 0]}, epochs: 200, batch_size: 4)
      ExBurn.Model.predict(model, [[0, 1]])

  Autodiff, the optimizers, learning-rate schedulers and gradient clipping are Burn's, run inside
  the NIF: one `fit` epoch is one dirty-scheduler NIF call. See `guides/training.md`.

  A compiled model is `%ExBurn.Model{}`: `ref` (the native model, mutable: `fit` updates it in
  place and returns the struct with fresh `summary`, `epochs`, `history`, `halted`), `spec`
  (`ExBurn.Model.Spec`), `config` (the training configuration), `device` and `seed`.

  The native model is freed when the last reference to it is garbage collected, or at once by
  `free/1`, which answers like `ExBurn.Tensor.deallocate/1` and Nx's `Nx.backend_deallocate/1`:
  `:ok` the first time, `:already_deallocated` after.

  Inputs (`x`) and targets (`y`) may be `ExBurn.Tensor`s, `{binary, type, shape}` tuples, nested
  lists of numbers, or Nx tensors when Nx is loaded. With `loss: :cross_entropy`, targets are class
  indices (a flat list of integers or an integer tensor `{n}`) or float probabilities `{n, classes}`.
  """

  alias ExBurn.Model.{Data, Options, Spec}
  alias ExBurn.{Error, Native}
  import Options, only: [keyword!: 3, fail!: 3, one_of!: 4, number!: 4]

  defstruct [:ref, :spec, :config, :device, :seed, :summary, epochs: 0, history: [], halted: nil]

  @type t :: %__MODULE__{
          ref: reference,
          spec: Spec.t(),
          config: map,
          device: {atom, non_neg_integer},
          seed: non_neg_integer,
          summary: map,
          epochs: non_neg_integer,
          history: [map],
          halted: nil | :cancelled | :early_stopping | term
        }

  ## Builder (delegated to ExBurn.Model.Spec)

  @doc """
  Starts a model. `shape` is Axon-style with a `nil` batch dimension: `{nil, 784}`,
  `{nil, 28, 28, 1}` (channels last), `{nil, timesteps, features}`. Option `type: :s64` declares
  integer token inputs (for an `embedding/3` first layer).
  """
  defdelegate input(shape, opts \\ []), to: Spec

  @doc "A fully connected layer. Options: `:activation` (adds an activation layer), `:use_bias` (true)."
  defdelegate dense(model, units, opts \\ []), to: Spec

  @doc """
  1-D convolution over `{n, t, c}`. Options: `:kernel_size` (3), `:strides` (1), `:padding`
  (`:valid` | `:same`), `:activation`.
  """
  defdelegate conv1d(model, filters, opts \\ []), to: Spec

  @doc """
  2-D convolution over `{n, h, w, c}`. Options: `:kernel_size` (3 or `{kh, kw}`), `:strides`,
  `:padding` (`:valid` | `:same`), `:activation`.
  """
  defdelegate conv2d(model, filters, opts \\ []), to: Spec

  @doc "Max pooling (1-D on `{n, t, c}`, 2-D on `{n, h, w, c}`). Options: `:kernel_size` (2), `:strides` (= kernel)."
  defdelegate max_pool(model, opts \\ []), to: Spec

  @doc "Average pooling; options as `max_pool/2`."
  defdelegate avg_pool(model, opts \\ []), to: Spec

  @doc "Mean over the spatial/time axes: `{n, h, w, c}` or `{n, t, c}` to `{n, c}`."
  defdelegate global_avg_pool(model), to: Spec

  @doc "Flattens everything but the batch axis."
  defdelegate flatten(model), to: Spec

  @doc "Dropout (training only). Options: `:rate` (0.5)."
  defdelegate dropout(model, opts \\ []), to: Spec

  @doc "Batch normalization over the last (channel) axis. Options: `:epsilon`, `:momentum`."
  defdelegate batch_norm(model, opts \\ []), to: Spec

  @doc "Layer normalization over the last axis. Options: `:epsilon`."
  defdelegate layer_norm(model, opts \\ []), to: Spec

  @doc "Token embedding; must be the first layer of an `input(shape, type: :s64)` model."
  defdelegate embedding(model, vocab_size, embedding_size), to: Spec

  @doc "LSTM over `{n, t, f}`. Options: `:return_sequences` (true: `{n, t, units}`; false: `{n, units}`)."
  defdelegate lstm(model, units, opts \\ []), to: Spec

  @doc "GRU; options as `lstm/3`."
  defdelegate gru(model, units, opts \\ []), to: Spec

  @doc """
  An activation layer: `:relu`, `:gelu`, `:sigmoid`, `:tanh`, `:softmax`, `:log_softmax`,
  `:leaky_relu` (option `:alpha`, 0.01) or `:silu`.
  """
  defdelegate activation(model, name, opts \\ []), to: Spec

  for name <- [:relu, :gelu, :sigmoid, :tanh, :softmax, :log_softmax, :silu] do
    @doc "Shorthand for `activation(model, #{inspect(name)})`."
    def unquote(name)(model), do: Spec.activation(model, unquote(name))
  end

  @doc "Shorthand for `activation(model, :leaky_relu, opts)`."
  def leaky_relu(model, opts \\ []), do: Spec.activation(model, :leaky_relu, opts)

  ## Compile

  @compile_opts [:loss, :optimizer, :learning_rate, :weight_decay, :momentum, :beta1, :beta2, :epsilon] ++
                  [:decay, :clip_norm, :clip_value, :device, :seed]

  @doc """
  Builds the Burn module, its optimizer and initial weights.

  `model` is an `ExBurn.Model.Spec` (from the builder), an `%Axon{}` when Axon is loaded (see
  `ExBurn.Model.Axon`), or a compiled `%ExBurn.Model{}` (recompiled from scratch with new
  options, fresh weights).

  Options:

    * `:loss` - `:cross_entropy`, `:mse` (default) or `:binary_cross_entropy`. Cross-entropy
      reads the output as probabilities after a final `:softmax`, as log-probabilities after
      `:log_softmax`, otherwise as logits; binary cross-entropy reads probabilities after
      `:sigmoid`, otherwise logits. `:categorical_cross_entropy` (the Keras and `Axon.Losses`
      name) is accepted as an alias of `:cross_entropy`, which the compiled model's `config`
      then records.
    * `:optimizer` - `:adam` (default), `:adamw`, `:sgd` or `:rmsprop`
    * `:learning_rate` (1.0e-3)
    * `:weight_decay` - none by default, except 1.0e-4 for `:adamw` (give 0 to turn it off)
    * `:momentum` - SGD and RMSprop; none by default
    * `:beta1` (0.9), `:beta2` (0.999), `:epsilon` (1.0e-8) for Adam/AdamW; `:decay` is
      RMSprop's smoothing constant (default `:beta1`'s, 0.9)
    * `:clip_norm`, `:clip_value` - gradient clipping (also settable per `fit/3`); none by default
    * `:device` - `:cpu` or `{kind, index}` (default `ExBurn.default_device/0`)
    * `:seed` - weight initialisation, dropout and shuffling seed (default 42)

  An option given as `nil` takes its default. These defaults are the only ones: the native
  side receives every setting filled in.
  """
  def compile(model, opts \\ [])

  def compile(%__MODULE__{spec: spec} = model, opts),
    do: compile(spec, Keyword.merge([device: model.device, seed: model.seed], opts))

  def compile(%Spec{} = spec, opts) do
    op = :compile
    opts = keyword!(op, opts, @compile_opts)

    if spec.layers == [],
      do: fail!(op, "the model has no layers", %{})

    device = ExBurn.Tensor.Util.device!(op, opts[:device])

    seed =
      case Keyword.get(opts, :seed) do
        nil -> 42
        s when is_integer(s) and s >= 0 -> s
        s -> Options.bad!(op, :seed, s, "a non-negative integer")
      end

    build!(op, spec, config!(opts), device, seed)
  end

  def compile(other, opts) do
    if axon?(other),
      do: compile(apply(ExBurn.Model.Axon, :to_spec, [other]), opts),
      else:
        fail!(
          :compile,
          "expected a model from ExBurn.Model.input/2 (or an Axon model when Axon is loaded)",
          %{got: other}
        )
  end

  defp axon?(%{__struct__: Axon}), do: Code.ensure_loaded?(ExBurn.Model.Axon)
  defp axon?(_), do: false

  @losses [:cross_entropy, :mse, :binary_cross_entropy]
  @loss_aliases %{categorical_cross_entropy: :cross_entropy}
  @optimizers [:adam, :adamw, :sgd, :rmsprop]

  @doc false
  # The training configuration the NIF decodes (`TrainConfig`), every key filled in: the defaults
  # of `compile/2` live here and nowhere else. Also re-reads a saved model's configuration.
  def config!(op \\ :compile, opts) do
    value = fn key, default ->
      case Keyword.get(opts, key) do
        nil -> default
        v -> v
      end
    end

    optimizer = one_of!(op, :optimizer, value.(:optimizer, :adam), @optimizers)

    if opts[:decay] != nil and optimizer != :rmsprop,
      do: fail!(op, "option :decay is only for optimizer: :rmsprop", %{option: :decay, optimizer: optimizer})

    loss = one_of!(op, :loss, value.(:loss, :mse), @losses ++ Map.keys(@loss_aliases))
    num = fn key, default -> number!(op, key, value.(key, default), min: 0, nullable: default == nil) end

    positive = fn key ->
      if (v = num.(key, nil)) == 0.0, do: Options.bad!(op, key, v, "a number > 0"), else: v
    end

    %{
      loss: Map.get(@loss_aliases, loss, loss),
      optimizer: optimizer,
      learning_rate: num.(:learning_rate, 1.0e-3),
      weight_decay: num.(:weight_decay, if(optimizer == :adamw, do: 1.0e-4)),
      momentum: num.(:momentum, nil),
      # RMSprop's smoothing constant travels as beta1
      beta1: num.(:decay, nil) || num.(:beta1, 0.9),
      beta2: num.(:beta2, 0.999),
      epsilon: num.(:epsilon, 1.0e-8),
      clip_norm: positive.(:clip_norm),
      clip_value: positive.(:clip_value)
    }
  end

  @doc false
  # Creates the native model; op names the public operation for errors.
  def build!(op, %Spec{} = spec, config, device, seed) do
    int_input = spec.input_type == {:s, 64}

    case Native.model_new(Spec.native_layers(spec), spec.input_shape, int_input, config, device, seed) do
      {:ok, {ref, info}} ->
        model = %__MODULE__{ref: ref, spec: spec, config: config, device: device, seed: seed}
        with_info(model, info)

      {:error, {_nif_op, reason, details}} ->
        raise Error, op: op, reason: reason, details: details
    end
  end

  @doc false
  def with_info(model, {layers, total, epochs}) do
    %{model | summary: ExBurn.Model.Summary.build(model.spec, layers, total), epochs: epochs}
  end

  @doc false
  # Re-reads the layer table; `epochs` is kept (Elixir counts them across rebuilds).
  def refresh(%__MODULE__{} = model) do
    {layers, total, _epochs} = Error.unwrap!(Native.model_summary(model.ref))
    %{model | summary: ExBurn.Model.Summary.build(model.spec, layers, total)}
  end

  ## Training

  @doc """
  Trains `model` on `{x, y}` and returns it (the native model is updated in place). Blocks the
  caller; every epoch is one dirty-scheduler NIF call, and between epochs `fit` evaluates the
  validation data, runs the callbacks and emits telemetry.

  Options:

    * `:epochs` (1), `:batch_size` (32), `:shuffle` (true)
    * `:validation_data` - `{x, y}` evaluated after every epoch (`val_loss` in the history)
    * `:callbacks` - functions of one argument, see `ExBurn.Model.Callbacks`
    * `:lr_schedule` - `{:step, base, step_epochs, gamma}`, `{:exponential, base, gamma}` or
      `{:cosine, base, min}` (annealed over this fit's epochs); stepped once per epoch
    * `:clip_norm`, `:clip_value` - gradient clipping, changed on the live model when they differ
      from the compiled model's (removing norm clipping resets the optimizer's moments)
    * `:verbose` - prints one line per epoch (false)

  The returned model's `history` is `[%{epoch: 1, loss: .., val_loss: ..}, ...]` (`val_loss` is
  nil without validation data); `halted` is nil, `:cancelled` (see `cancel/1` and `free/1`),
  `:early_stopping` or the reason a callback gave, and the last history entry then carries
  `halted: reason` too. A callback that raises stops the fit and the exception reaches the
  caller; the native model keeps the last completed epoch.
  """
  def fit(model, data, opts \\ []) do
    {model, _history} = ExBurn.Model.Fit.run(model, data, opts)
    model
  end

  @doc """
  Like `fit/3` but returns `{model, history}`, the history of this fit alone (the same list as
  the returned `model.history`).
  """
  def fit_with_history(model, data, opts \\ []), do: ExBurn.Model.Fit.run(model, data, opts)

  @doc """
  Asks a running `fit` of `model` to stop (from any process): training stops before the next
  batch, the interrupted epoch is discarded and `fit` returns the model as of its last completed
  epoch with `halted: :cancelled`. A `fit` started later clears the request.
  """
  def cancel(%__MODULE__{ref: ref}), do: Error.unwrap!(Native.model_cancel(ref, true))
  def cancel(other), do: fail!(:cancel, "expected an ExBurn.Model", %{got: other})

  ## Inference

  @doc "Mean loss over `{x, y}` in inference mode (dropout off). Options: `:batch_size` (256)."
  def evaluate(model, data, opts \\ [])

  def evaluate(%__MODULE__{} = model, data, opts) do
    op = :evaluate
    opts = keyword!(op, opts, [:batch_size])
    {x, y} = Data.pair!(op, data)
    x = Data.inputs!(op, x, model)
    y = Data.targets!(op, y, model)
    bs = Options.pos_int!(op, :batch_size, Keyword.get(opts, :batch_size, 256))
    Error.unwrap!(Native.model_evaluate(model.ref, x.ref, y.ref, bs))
  end

  def evaluate(other, _data, _opts), do: fail!(:evaluate, "expected an ExBurn.Model", %{got: other})

  @doc """
  The model's outputs for `x` as an f32 `ExBurn.Tensor` (`{n | output_shape}`), in inference
  mode. Options: `:batch_size` (256).
  """
  def predict(model, x, opts \\ [])

  def predict(%__MODULE__{} = model, x, opts) do
    op = :predict
    opts = keyword!(op, opts, [:batch_size])
    x = Data.inputs!(op, x, model)
    bs = Options.pos_int!(op, :batch_size, Keyword.get(opts, :batch_size, 256))
    ExBurn.Tensor.Util.wrap(Native.model_predict(model.ref, x.ref, bs))
  end

  def predict(other, _x, _opts), do: fail!(:predict, "expected an ExBurn.Model", %{got: other})

  ## Summary, persistence, memory

  @doc """
  `%{params: n, trainable: n, non_trainable: n, epochs: n, input_shape: {nil, ...}, layers: [row]}`
  with rows `%{name: "dense_0", layer: :dense, output_shape: {nil, 256}, params: n}`.
  Non-trainable parameters are batch-norm running statistics.
  """
  def summary(%__MODULE__{} = model), do: refresh(model).summary
  def summary(other), do: fail!(:summary, "expected an ExBurn.Model", %{got: other})

  @doc "The summary as a printable box (see `summary/1`)."
  def summary_string(model), do: ExBurn.Model.Summary.format(summary(model))

  @doc """
  Writes the model (architecture, configuration and weights) to `path` atomically: a temporary
  file in the same directory, then a rename. Returns `:ok` or `{:error, %ExBurn.Error{}}`.
  """
  defdelegate save(model, path), to: ExBurn.Model.Store

  @doc "Like `save/2`, raising `ExBurn.Error`."
  defdelegate save!(model, path), to: ExBurn.Model.Store

  @doc """
  `load(path, opts \\\\ [])` rebuilds a model saved by `save/2` (options: `:device`);
  `load(model, path)` loads the weights of `path` into a compatible compiled `model` (same
  architecture). Returns `{:ok, model}` or `{:error, %ExBurn.Error{}}` for a missing, corrupt,
  truncated or mismatched file.
  """
  defdelegate load(path_or_model, path_or_opts \\ []), to: ExBurn.Model.Store

  @doc "Like `load/2`, raising `ExBurn.Error`."
  defdelegate load!(path_or_model, path_or_opts \\ []), to: ExBurn.Model.Store

  @doc """
  Frees the model's weights and optimizer state now, instead of when the last reference to the
  native model is garbage collected.

  Returns `:ok`, and `:already_deallocated` when the model was already freed: the answers of
  `ExBurn.Tensor.deallocate/1` and of Nx's `Nx.backend_deallocate/1`. Every copy of the struct
  (and every model `fit/3` returned from it) shares the one native model, so freeing any of
  them frees it for all.

  A running `fit/3` of the model is cancelled: `free/1` waits for the batch in progress, and
  `fit` returns with `halted: :cancelled`, the interrupted epoch discarded. Afterwards
  `summary/1` still answers (it reads the layer table kept in Elixir and beside the native
  model); `fit/3`, `evaluate/3`, `predict/3`, `save!/2` and `load!/2` raise `ExBurn.Error`
  with reason `"model was freed"` (details `%{kind: :freed}`), which `save/2` and `load/2`
  return as `{:error, error}`.
  """
  def free(%__MODULE__{ref: ref}) when is_reference(ref), do: Error.unwrap!(Native.model_free(ref))

  def free(other), do: fail!(:free, "expected an ExBurn.Model", %{got: other})

  defimpl Inspect do
    def inspect(%{summary: summary, device: {kind, index}, epochs: epochs}, _opts) do
      layers = Enum.map_join(summary.layers, ", ", & &1.name)
      "#ExBurn.Model<#{layers}; #{summary.params} params, #{epochs} epochs, #{kind}:#{index}>"
    end
  end
end
