if Code.ensure_loaded?(Axon) do
  defmodule ExBurn.Model.Axon do
    @moduledoc """
    Converts an `%Axon{}` model into an `ExBurn.Model.Spec` (what `ExBurn.Model.compile/2` does
    when given an Axon model). Compiled only when Axon is loaded.

    Supported: sequential graphs (one input, every layer with one parent) of `Axon.input`
    (channels-last shapes), `dense`, `conv` (1-D/2-D, channels last, no dilation or feature
    groups, `:valid`/`:same` padding), `max_pool`/`avg_pool` (`:valid` padding),
    `global_avg_pool`, `flatten`, `dropout`, `batch_norm`, `layer_norm`, `embedding` (first
    layer; the model then takes integer tokens) and the activations relu, gelu, sigmoid, tanh,
    softmax, log_softmax, leaky_relu and silu. Branch/merge graphs (`Axon.add`,
    `Axon.concatenate`, several inputs), recurrent layers and every other layer are rejected with
    an `ExBurn.Error` naming the layer. Only the architecture is converted: Burn initialises its
    own weights.
    """

    alias ExBurn.Model.Spec

    @activations [:relu, :gelu, :sigmoid, :tanh, :softmax, :log_softmax, :silu]

    @doc "The `ExBurn.Model.Spec` of a sequential Axon model; raises `ExBurn.Error`."
    def to_spec(%Axon{output: output, nodes: nodes} = model) do
      chain = chain!(nodes, output, [])
      [input | layers] = chain

      shape =
        case input.opts[:shape] do
          shape when is_tuple(shape) ->
            shape

          other ->
            fail!("the Axon input needs a static shape such as {nil, 784}", %{layer: input.name, shape: other})
        end

      tokens? = match?([%{op_name: :embedding} | _], layers)
      type = if tokens?, do: {:s, 64}, else: {:f, 32}
      template = Nx.template(put_elem(shape, 0, 1), type)
      params = params(model, template)

      {spec, _counts} =
        Enum.reduce(
          layers,
          {Spec.input(shape, type: if(tokens?, do: :s64, else: :f32)), %{input: 1}},
          fn node, {spec, counts} ->
            # Axon names layers lazily (`node.name` is a function of the per-op counts so far), the
            # way its compiler walks the graph: that name keys the initialised parameters.
            name = layer_name(node, counts)
            out_shape = output_shape(%Axon{output: node.id, nodes: nodes}, template)

            {layer(node, spec, out_shape, Map.get(params, name, %{})),
             Map.update(counts, node.op_name, 1, &(&1 + 1))}
          end
        )

      spec
    end

    defp layer_name(%{name: name}, _counts) when is_binary(name), do: name

    defp layer_name(%{name: name_fn, op_name: op}, counts) when is_function(name_fn, 2),
      do: name_fn.(op, counts)

    # Axon >= 0.6 answers with a template tensor, earlier versions with a shape.
    defp output_shape(model, template) do
      case Axon.get_output_shape(model, template) do
        %Nx.Tensor{} = t -> Nx.shape(t)
        shape when is_tuple(shape) -> shape
      end
    end

    # Walks from the output to the input; every node must have exactly one parent.
    defp chain!(nodes, id, acc) do
      node = Map.fetch!(nodes, id)

      case {node.op_name, node.parent} do
        {:input, []} ->
          [node | acc]

        # Merges (add, concatenate, ...) take their inputs through a container node.
        {op, [parent]} when op != :container ->
          chain!(nodes, parent, [node | acc])

        {_, parents} ->
          consumer = List.first(acc, node)
          fail!("only sequential Axon graphs are supported", %{op: consumer.op_name, inputs: length(parents)})
      end
    end

    defp params(model, template) do
      {init_fn, _predict_fn} = Axon.build(model)

      state =
        if Code.ensure_loaded?(Axon.ModelState),
          do: init_fn.(template, apply(Axon.ModelState, :empty, [])),
          else: init_fn.(template, %{})

      data = if is_map_key(state, :data) and is_map(state.data), do: state.data, else: state
      Map.new(data, fn {layer, ps} -> {layer, Map.new(ps, fn {k, t} -> {k, Nx.shape(t)} end)} end)
    end

    defp layer(%{op_name: :dense} = node, spec, out, _params),
      do: Spec.dense(spec, last(out), use_bias: length(node.parameters) > 1)

    defp layer(%{op_name: :conv, opts: opts} = node, spec, out, params) do
      unsupported_unless(
        node,
        opts[:channels] in [nil, :last] and all_ones?(opts[:input_dilation]) and
          all_ones?(opts[:kernel_dilation]) and opts[:feature_group_size] in [nil, 1] and
          opts[:padding] in [:valid, :same]
      )

      kernel = params |> Map.fetch!("kernel") |> Tuple.to_list() |> Enum.drop(-2)
      conv = if length(kernel) == 1, do: :conv1d, else: :conv2d
      unsupported_unless(node, length(kernel) in [1, 2] and length(node.parameters) == 2)

      apply(Spec, conv, [
        spec,
        last(out),
        [kernel_size: kernel, padding: opts[:padding]] ++ given(opts, [:strides])
      ])
    end

    defp layer(%{op_name: pool, opts: opts} = node, spec, _out, _params)
         when pool in [:max_pool, :avg_pool] do
      unsupported_unless(
        node,
        opts[:padding] in [nil, :valid] and opts[:channels] in [nil, :last] and
          all_ones?(opts[:window_dilations])
      )

      apply(Spec, pool, [spec, [kernel_size: opts[:kernel_size]] ++ given(opts, [:strides])])
    end

    defp layer(%{op_name: :global_avg_pool, opts: opts} = node, spec, _out, _params) do
      unsupported_unless(node, !opts[:keep_axes] and opts[:channels] in [nil, :last])
      Spec.global_avg_pool(spec)
    end

    defp layer(%{op_name: :flatten}, spec, _out, _params), do: Spec.flatten(spec)

    defp layer(%{op_name: :dropout, opts: opts}, spec, _out, _params),
      do: Spec.dropout(spec, given(opts, [:rate]))

    defp layer(%{op_name: :batch_norm, opts: opts}, spec, _out, _params),
      do: Spec.batch_norm(spec, given(opts, [:epsilon, :momentum]))

    defp layer(%{op_name: :layer_norm, opts: opts}, spec, _out, _params),
      do: Spec.layer_norm(spec, given(opts, [:epsilon]))

    defp layer(%{op_name: :embedding}, spec, _out, params) do
      {vocab, dim} = Map.fetch!(params, "kernel")
      Spec.embedding(spec, vocab, dim)
    end

    defp layer(%{op_name: :leaky_relu, opts: opts}, spec, _out, _params),
      do: Spec.activation(spec, :leaky_relu, given(opts, [:alpha]))

    defp layer(%{op_name: name}, spec, _out, _params) when name in @activations,
      do: Spec.activation(spec, name)

    defp layer(node, _spec, _out, _params), do: unsupported!(node)

    defp unsupported_unless(_node, true), do: :ok
    defp unsupported_unless(node, _), do: unsupported!(node)

    defp unsupported!(node),
      do: fail!("unsupported Axon layer #{inspect(node.op_name)}", %{op: node.op_name, opts: node.opts})

    # The options of `keys` the Axon node sets; the others take ExBurn.Model.Spec's defaults.
    defp given(opts, keys), do: for(key <- keys, opts[key] != nil, do: {key, opts[key]})

    defp all_ones?(nil), do: true
    defp all_ones?(1), do: true
    defp all_ones?(t) when is_tuple(t), do: Enum.all?(Tuple.to_list(t), &(&1 == 1))
    defp all_ones?(l) when is_list(l), do: Enum.all?(l, &(&1 == 1))
    defp all_ones?(_), do: false

    defp last(shape), do: elem(shape, tuple_size(shape) - 1)

    defp fail!(reason, details), do: raise(ExBurn.Error, op: :compile, reason: reason, details: details)
  end
end
