defmodule ExBurn.Model.Spec do
  @moduledoc """
  An uncompiled model: the input shape and type and the layer list, built with the Axon-like
  functions of `ExBurn.Model` (`input/2`, `dense/3`, ...) and turned into a Burn module by
  `ExBurn.Model.compile/2`.

  `input_shape` excludes the batch dimension (`[784]`, `[28, 28, 1]`); `input_type` is `{:f, 32}`
  or `{:s, 64}` (token inputs for an `embedding` first layer); `layers` is a list of
  `{kind, keyword_options}` with every default filled in. Tensors are channels-last as in Axon:
  images `{n, h, w, c}`, sequences `{n, t, f}`.
  """

  import ExBurn.Model.Options

  defstruct input_shape: [], input_type: {:f, 32}, layers: []

  @type layer :: {atom, keyword}
  @type t :: %__MODULE__{input_shape: [pos_integer], input_type: {:f, 32} | {:s, 64}, layers: [layer]}

  @activations [:relu, :gelu, :sigmoid, :tanh, :softmax, :log_softmax, :leaky_relu, :silu]

  @doc "The activation names `activation/3` accepts."
  def activations, do: @activations

  @doc "See `ExBurn.Model.input/2`."
  def input(shape, opts \\ []) do
    op = :input
    opts = keyword!(op, opts, [:type])

    dims =
      case shape do
        shape when is_tuple(shape) -> Tuple.to_list(shape)
        shape when is_list(shape) -> shape
        other -> fail!(op, "expected a shape tuple such as {nil, 784}", %{shape: other})
      end

    dims = if match?([nil | _], dims), do: tl(dims), else: dims

    unless dims != [] and Enum.all?(dims, &(is_integer(&1) and &1 > 0)),
      do: fail!(op, "invalid input shape: expected {nil, d1, ...} with positive dimensions", %{shape: shape})

    type =
      case Keyword.get(opts, :type, :f32) do
        t when t in [:f32, {:f, 32}] -> {:f, 32}
        t when t in [:s64, {:s, 64}, :s32, {:s, 32}] -> {:s, 64}
        t -> bad!(op, :type, t, ":f32, or :s64 for token inputs")
      end

    %__MODULE__{input_shape: dims, input_type: type}
  end

  @doc "See `ExBurn.Model.dense/3`."
  def dense(spec, units, opts \\ []) do
    opts = keyword!(:dense, opts, [:activation, :use_bias])

    layer =
      {:dense,
       units: pos_int!(:dense, :units, units),
       use_bias: boolean!(:dense, :use_bias, Keyword.get(opts, :use_bias, true))}

    spec |> add(:dense, layer) |> with_activation(:dense, opts[:activation])
  end

  @doc "See `ExBurn.Model.conv1d/3`."
  def conv1d(spec, filters, opts \\ []), do: conv(:conv1d, spec, filters, opts)

  @doc "See `ExBurn.Model.conv2d/3`."
  def conv2d(spec, filters, opts \\ []), do: conv(:conv2d, spec, filters, opts)

  defp conv(op, spec, filters, opts) do
    opts = keyword!(op, opts, [:kernel_size, :strides, :padding, :activation])

    layer =
      {op,
       filters: pos_int!(op, :filters, filters),
       kernel_size: sizes!(op, :kernel_size, Keyword.get(opts, :kernel_size, 3)),
       strides: sizes!(op, :strides, Keyword.get(opts, :strides, 1)),
       padding: one_of!(op, :padding, Keyword.get(opts, :padding, :valid), [:valid, :same])}

    spec |> add(op, layer) |> with_activation(op, opts[:activation])
  end

  @doc "See `ExBurn.Model.max_pool/2`."
  def max_pool(spec, opts \\ []), do: pool(:max_pool, spec, opts)

  @doc "See `ExBurn.Model.avg_pool/2`."
  def avg_pool(spec, opts \\ []), do: pool(:avg_pool, spec, opts)

  defp pool(op, spec, opts) do
    opts = keyword!(op, opts, [:kernel_size, :strides])
    kernel = sizes!(op, :kernel_size, Keyword.get(opts, :kernel_size, 2))

    add(
      spec,
      op,
      {op, kernel_size: kernel, strides: sizes!(op, :strides, Keyword.get(opts, :strides, kernel))}
    )
  end

  @doc "See `ExBurn.Model.global_avg_pool/1`."
  def global_avg_pool(spec), do: add(spec, :global_avg_pool, {:global_avg_pool, []})

  @doc "See `ExBurn.Model.flatten/1`."
  def flatten(spec), do: add(spec, :flatten, {:flatten, []})

  @doc "See `ExBurn.Model.dropout/2`."
  def dropout(spec, opts \\ []) do
    opts = keyword!(:dropout, opts, [:rate])
    rate = number!(:dropout, :rate, Keyword.get(opts, :rate, 0.5), min: 0, max: 1)
    add(spec, :dropout, {:dropout, rate: rate})
  end

  @doc "See `ExBurn.Model.batch_norm/2`."
  def batch_norm(spec, opts \\ []) do
    opts = keyword!(:batch_norm, opts, [:epsilon, :momentum])

    add(
      spec,
      :batch_norm,
      {:batch_norm,
       epsilon: number!(:batch_norm, :epsilon, Keyword.get(opts, :epsilon, 1.0e-5), min: 0),
       momentum: number!(:batch_norm, :momentum, Keyword.get(opts, :momentum, 0.1), min: 0)}
    )
  end

  @doc "See `ExBurn.Model.layer_norm/2`."
  def layer_norm(spec, opts \\ []) do
    opts = keyword!(:layer_norm, opts, [:epsilon])

    add(
      spec,
      :layer_norm,
      {:layer_norm, epsilon: number!(:layer_norm, :epsilon, Keyword.get(opts, :epsilon, 1.0e-5), min: 0)}
    )
  end

  @doc "See `ExBurn.Model.embedding/3`."
  def embedding(spec, vocab_size, embedding_size) do
    op = :embedding

    unless match?(%__MODULE__{layers: [], input_type: {:s, 64}}, spec),
      do: fail!(op, "embedding must be the first layer, after input(shape, type: :s64)", %{})

    add(
      spec,
      op,
      {op,
       vocab_size: pos_int!(op, :vocab_size, vocab_size),
       embedding_size: pos_int!(op, :embedding_size, embedding_size)}
    )
  end

  @doc "See `ExBurn.Model.lstm/3`."
  def lstm(spec, units, opts \\ []), do: recurrent(:lstm, spec, units, opts)

  @doc "See `ExBurn.Model.gru/3`."
  def gru(spec, units, opts \\ []), do: recurrent(:gru, spec, units, opts)

  defp recurrent(op, spec, units, opts) do
    opts = keyword!(op, opts, [:return_sequences])
    seq = boolean!(op, :return_sequences, Keyword.get(opts, :return_sequences, true))
    add(spec, op, {op, units: pos_int!(op, :units, units), return_sequences: seq})
  end

  @doc "See `ExBurn.Model.activation/3`."
  def activation(spec, name, opts \\ []) do
    op = :activation
    name = one_of!(op, :activation, name, @activations)

    case name do
      :leaky_relu ->
        opts = keyword!(op, opts, [:alpha])
        add(spec, op, {:leaky_relu, alpha: number!(op, :alpha, Keyword.get(opts, :alpha, 0.01))})

      _ ->
        keyword!(op, opts, [])
        add(spec, op, {name, []})
    end
  end

  @doc false
  # The layers as the NIF decodes them (`LayerSpec`): `{kind, %{option => value}}` with sizes as
  # lists, `{:activation, name}` (`{:activation, {:leaky_relu, alpha}}`), and layers without
  # options as their bare name. Anything else is passed on for the NIF to reject.
  def native_layers(%__MODULE__{layers: layers}), do: Enum.map(layers, &native_layer/1)

  defp native_layer({:leaky_relu, [alpha: alpha]}), do: {:activation, {:leaky_relu, alpha}}
  defp native_layer({name, []}) when name in @activations, do: {:activation, name}
  defp native_layer({kind, []}) when kind in [:global_avg_pool, :flatten], do: kind

  defp native_layer({kind, opts}) when is_list(opts) and opts != [] do
    if Keyword.keyword?(opts), do: {kind, Map.new(opts, &native_option/1)}, else: {kind, opts}
  end

  defp native_layer(other), do: other

  defp native_option({key, size}) when key in [:kernel_size, :strides], do: {key, List.wrap(size)}
  defp native_option(option), do: option

  defp with_activation(spec, _op, nil), do: spec
  defp with_activation(spec, _op, name), do: activation(spec, name)

  defp add(%__MODULE__{layers: layers} = spec, _op, layer), do: %{spec | layers: layers ++ [layer]}

  defp add(other, op, _layer),
    do: fail!(op, "expected a model built from ExBurn.Model.input/2", %{got: other})
end
