if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Lower do
    @moduledoc false
    # Lowers an Nx.Defn.Expr graph into the flat instruction list the native program runs:
    # `{op, operand_indices, attrs, type, shape}`, operands always earlier in the list. Nodes are
    # shared by expression id, so common subexpressions run once. Each op mirrors what
    # ExBurn.Backend does for the same callback (compute types, casts, clamped slice starts), so
    # the program and op-by-op evaluation give the same answers. Anything not mirrored here is
    # reported as unsupported and the caller evaluates the whole graph op by op instead.

    alias Nx.Defn.{Composite, Expr}
    alias Nx.Tensor, as: T

    @binary ExBurn.Tensor.Ops.binary_ops() -- [:left_shift, :right_shift]
    @merged_compute [:equal, :not_equal, :greater, :less, :greater_equal, :less_equal] ++
                      [:logical_and, :logical_or, :logical_xor]
    @unary ExBurn.Tensor.Ops.unary_ops()
    @reduce [:sum, :product, :reduce_max, :reduce_min, :all, :any]

    @doc """
    `{:ok, program}` with `program = %{instrs: list, outputs: [index], literals: [tensor]}`, or
    `{:unsupported, ops}` naming the ops (sorted, unique) that have no lowering.
    """
    def lower(outputs, n_params) when is_list(outputs) do
      state = %{ids: %{}, instrs: [], count: 0, literals: [], n_params: n_params, scope: nil, bad: %{}}
      {indices, state} = Enum.map_reduce(outputs, state, &node/2)

      if state.bad == %{} do
        {:ok,
         %{
           instrs: Enum.reverse(state.instrs),
           outputs: indices,
           literals: Enum.reverse(state.literals)
         }}
      else
        {:unsupported, state.bad |> Map.keys() |> Enum.sort()}
      end
    end

    defp node(%T{data: %Expr{id: id}} = t, state) do
      case state.ids do
        %{^id => index} ->
          {index, state}

        %{} ->
          {index, state} = lower_node(t, state)
          {index, %{state | ids: Map.put(state.ids, id, index)}}
      end
    end

    defp emit(op, args, attrs, %T{type: type, shape: shape}, state) do
      if ExBurn.Backend.native_type?(type) do
        instr = {op, args, attrs, type, Tuple.to_list(shape)}
        {state.count, %{state | instrs: [instr | state.instrs], count: state.count + 1}}
      else
        unsupported({:type, type}, state)
      end
    end

    defp unsupported(what, state), do: {-1, %{state | bad: Map.put(state.bad, what, true)}}

    defp nodes(list, state), do: Enum.map_reduce(list, state, &node/2)

    defp lower_node(%T{vectorized_axes: [_ | _]}, state), do: unsupported(:vectorized, state)

    defp lower_node(%T{data: %Expr{op: :parameter, args: [i]}} = t, state) do
      case state.scope do
        nil -> emit(:input, [], i, t, state)
        scope -> {Enum.at(scope, i), state}
      end
    end

    defp lower_node(%T{data: %Expr{op: :tensor, args: [literal]}} = t, state) do
      if ExBurn.Backend.native_type?(literal.type) do
        index = state.n_params + length(state.literals)
        emit(:input, [], index, t, %{state | literals: [literal | state.literals]})
      else
        unsupported({:type, literal.type}, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :constant, args: [value]}, type: type} = t, state) do
      case constant_value(value, type) do
        {:ok, v} -> emit(:full, [], v, t, state)
        :error -> unsupported(:constant, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :metadata, args: [%T{} = inner, _meta]}}, state) do
      node(inner, state)
    end

    # A block's default expression is written over its own parameters: lower it with those
    # bound to the block's operands.
    defp lower_node(%T{data: %Expr{op: :block, args: [_struct, in_args, %T{} = default, _fun]}}, state) do
      {tensors, _opts} = Enum.split_while(in_args, &(not is_list(&1)))
      {indices, state} = nodes(tensors, state)
      outer = state.scope
      {index, state} = node(default, %{state | scope: indices})
      {index, %{state | scope: outer}}
    end

    defp lower_node(%T{data: %Expr{op: :iota, args: [axis]}} = t, state), do: emit(:iota, [], axis, t, state)
    defp lower_node(%T{data: %Expr{op: :eye, args: []}} = t, state), do: emit(:eye, [], nil, t, state)

    defp lower_node(%T{data: %Expr{op: op, args: [a, b]}} = t, state) when op in @binary do
      {[ia, ib], state} = nodes([a, b], state)
      compute = if op in @merged_compute, do: Nx.Type.merge(a.type, b.type), else: t.type
      emit(:binary, [ia, ib], {op, compute}, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a]}} = t, state) when op in @unary do
      {ia, state} = node(a, state)
      emit(:unary, [ia], op, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a]}} = t, state) when op in [:as_type, :reshape] do
      {ia, state} = node(a, state)
      emit(op, [ia], nil, t, state)
    end

    defp lower_node(%T{data: %Expr{op: :squeeze, args: [a, _axes]}} = t, state) do
      {ia, state} = node(a, state)
      emit(:reshape, [ia], nil, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, axes]}} = t, state)
         when op in [:transpose, :reverse] do
      {ia, state} = node(a, state)
      emit(op, [ia], axes, t, state)
    end

    defp lower_node(%T{data: %Expr{op: :broadcast, args: [a, _shape, axes]}} = t, state) do
      {ia, state} = node(a, state)
      emit(:broadcast, [ia], axes, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [p, x, y]}} = t, state) when op in [:select, :clip] do
      {indices, state} = nodes([p, x, y], state)
      emit(op, indices, nil, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, opts]}} = t, state) when op in @reduce do
      {ia, state} = node(a, state)
      emit(:reduce, [ia], {op, opts[:axes], opts[:keep_axes] == true}, t, state)
    end

    # Burn's comparisons do not see NaN the way Nx ranks it; the backend patches float inputs
    # with an extra pass, so only integer inputs lower here.
    defp lower_node(%T{data: %Expr{op: op, args: [a, opts]}} = t, state) when op in [:argmax, :argmin] do
      if Nx.Type.float?(a.type) do
        unsupported(op, state)
      else
        {ia, state} = node(a, state)
        attrs = {op, opts[:axis], opts[:keep_axis] == true, opts[:tie_break] == :high}
        emit(:arg_reduce, [ia], attrs, t, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :dot, args: [a, ca, ba, b, cb, bb]}} = t, state) do
      {[ia, ib], state} = nodes([a, b], state)
      emit(:dot, [ia, ib], {ca, ba, cb, bb}, t, state)
    end

    defp lower_node(%T{data: %Expr{op: :slice, args: [a, starts, lengths, strides]}} = t, state) do
      if Enum.all?(starts, &is_integer/1) do
        {ia, state} = node(a, state)

        starts =
          [starts, Tuple.to_list(a.shape), lengths]
          |> Enum.zip_with(fn [s, dim, len] -> s |> max(0) |> min(dim - len) end)

        emit(:slice, [ia], {starts, lengths, strides}, t, state)
      else
        unsupported(:dynamic_slice, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: op, args: [tensors, axis]}} = t, state)
         when op in [:concatenate, :stack] do
      {indices, state} = nodes(tensors, state)
      emit(op, indices, axis, t, state)
    end

    # tuples only come out of while, cond, hooks and multi-output blocks: name the producer
    defp lower_node(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: op}}, _]}}, state),
      do: unsupported(op, state)

    defp lower_node(%T{data: %Expr{op: op}}, state), do: unsupported(op, state)

    # The backend's constant/3 rules: integers wrap into the type, floats fill as f64; the top
    # half of u64 and non-real values are not lowered.
    defp constant_value(v, {kind, bits}) when kind in [:s, :u] and is_number(v) do
      bin = <<trunc(v)::size(bits)>>
      <<signed::signed-size(bits)>> = bin
      <<unsigned::unsigned-size(bits)>> = bin
      value = if kind == :s, do: signed, else: unsigned
      if value > 0x7FFFFFFFFFFFFFFF, do: :error, else: {:ok, value}
    end

    defp constant_value(v, {kind, _}) when kind in [:f, :bf] and is_number(v), do: {:ok, v * 1.0}

    defp constant_value(v, {kind, _}) when kind in [:f, :bf] and v in [:nan, :infinity, :neg_infinity],
      do: {:ok, v}

    defp constant_value(_v, _type), do: :error

    @doc "The output tensors of a container, in `Composite` order."
    def flatten(container), do: Composite.flatten_list([container])
  end
end
