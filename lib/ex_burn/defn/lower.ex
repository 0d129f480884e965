if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Lower do
    @moduledoc false
    # Lowers an Nx.Defn.Expr graph into the flat instruction list the native program runs:
    # `{op, operand_indices, type, shape}`, operands always earlier in the list, where `op` is
    # an atom or a tuple tagged with the op's name, in the shapes `Wire` in nif/compiler.rs
    # declares. Nodes are shared by expression id, so common subexpressions run once. Each
    # instruction runs the same native op the backend's callback calls, with the same operands
    # and result type, so programs and op-by-op evaluation agree; Nx's rules (NaN in argmax,
    # slice clamping, padding, casts to the result type) live in those native ops only.
    #
    # A top-level node with no lowering becomes a host node (see ExBurn.Defn.Host): a `:host`
    # pseudo-instruction per output, evaluated by Nx.Defn.Evaluator over the values the
    # program computed before it. A cond or while that holds such a node inside is hosted
    # whole, because its branches run only from its own instruction. What cannot be hosted
    # either (vectorized nodes) is reported as unsupported and the caller evaluates the whole
    # graph op by op.

    alias Nx.Defn.{Composite, Expr, Tree}
    alias Nx.Tensor, as: T

    @binary ExBurn.Tensor.Ops.binary_ops()
    @unary ExBurn.Tensor.Ops.unary_ops()
    @reduce [:sum, :product, :reduce_max, :reduce_min, :all, :any]
    @control_flow [:cond, :while]

    @doc """
    `{:ok, program}` with `program = %{instrs: list, outputs: [index], literals: [tensor],
    hooks: list, hosts: list}`, or `{:unsupported, ops}` naming the ops (sorted, unique) that
    could neither be lowered nor hosted. `host: false` turns hosting off (every unsupported
    node is then reported).
    """
    def lower(outputs, n_params, opts \\ []) when is_list(outputs) do
      state = %{
        ids: %{},
        conds: %{},
        instrs: [],
        count: 0,
        literals: [],
        n_params: n_params,
        scope: nil,
        bad: %{},
        hooks: [],
        depth: 0,
        host?: Keyword.get(opts, :host, true),
        hosts: [],
        foreign: MapSet.new()
      }

      {indices, state} = Enum.map_reduce(outputs, state, &node/2)

      if state.bad == %{} do
        {instrs, params} = compact_inputs(Enum.reverse(state.instrs), n_params)

        {:ok,
         %{
           instrs: instrs,
           params: params,
           outputs: indices,
           literals: Enum.reverse(state.literals),
           hooks: Enum.reverse(state.hooks),
           hosts: Enum.reverse(state.hosts)
         }}
      else
        {:unsupported, state.bad |> Map.keys() |> Enum.sort()}
      end
    end

    # The program's inputs are the parameters it reads (`params`, ascending), then the
    # literals: a parameter the graph never reads as a native value is never materialised, so
    # templates and unused lazy fields may be passed, as Nx.Defn.Evaluator allows.
    defp compact_inputs(instrs, n_params) do
      params = for({{:input, i}, [], _, _} <- instrs, i < n_params, uniq: true, do: i) |> Enum.sort()
      position = params |> Enum.with_index() |> Map.new()
      shift = length(params) - n_params

      instrs =
        Enum.map(instrs, fn
          {{:input, i}, [], type, shape} when i < n_params ->
            {{:input, Map.fetch!(position, i)}, [], type, shape}

          {{:input, i}, [], type, shape} ->
            {{:input, i + shift}, [], type, shape}

          instr ->
            instr
        end)

      {instrs, params}
    end

    defp node(%T{data: %Expr{id: id}} = t, state) do
      case state.ids do
        %{^id => index} ->
          {index, state}

        %{} ->
          {index, state} = lower_or_host(t, state)
          {index, %{state | ids: Map.put(state.ids, id, index)}}
      end
    end

    # Only top-level nodes are hosted: inside a branch or loop body the failure propagates to
    # the outermost cond/while, which is then hosted whole. A failed control-flow node rolls
    # back to the state before it (its ranges would otherwise run unguarded); any other node
    # keeps what its operands lowered.
    defp lower_or_host(%T{vectorized_axes: []} = t, %{depth: 0, host?: true} = state) do
      {index, tried} = lower_node(t, %{state | bad: %{}})

      cond do
        tried.bad == %{} -> {index, %{tried | bad: state.bad}}
        control_flow?(t) -> host(t, Map.keys(tried.bad), state)
        true -> host(t, Map.keys(tried.bad), %{tried | bad: state.bad})
      end
    end

    defp lower_or_host(t, state), do: lower_node(t, state)

    defp control_flow?(%T{data: %Expr{op: op}}) when op in @control_flow, do: true

    defp control_flow?(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: op}}, _]}})
         when op in @control_flow,
         do: true

    defp control_flow?(_), do: false

    defp emit(op, args, %T{type: type, shape: shape}, state) do
      cond do
        not ExBurn.Backend.Util.native_type?(type) ->
          unsupported({:type, type}, state)

        # a host output the program cannot hold (complex, f8, ...) only feeds other host nodes
        Enum.any?(args, &MapSet.member?(state.foreign, &1)) ->
          unsupported(:foreign_operand, state)

        true ->
          emit!(op, args, type, shape, state)
      end
    end

    defp emit!(op, args, type, shape, state) do
      instr = {op, args, type, Tuple.to_list(shape)}
      {state.count, %{state | instrs: [instr | state.instrs], count: state.count + 1}}
    end

    defp unsupported(what, state), do: {-1, %{state | bad: Map.put(state.bad, what, true)}}

    defp nodes(list, state), do: Enum.map_reduce(list, state, &node/2)

    defp lower_node(%T{vectorized_axes: [_ | _]}, state), do: unsupported(:vectorized, state)

    defp lower_node(%T{data: %Expr{op: :parameter, args: [i]}} = t, state) do
      cond do
        state.scope != nil -> {Enum.at(state.scope, i), state}
        ExBurn.Backend.Util.native_type?(t.type) -> emit({:input, i}, [], t, state)
        # a parameter the program cannot hold (complex, f8, ...) enters as a host value
        state.depth == 0 and state.host? -> host_param(i, t, state)
        true -> unsupported({:type, t.type}, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :tensor, args: [literal]}} = t, state) do
      if ExBurn.Backend.Util.native_type?(literal.type) do
        index = state.n_params + length(state.literals)
        emit({:input, index}, [], t, %{state | literals: [literal | state.literals]})
      else
        unsupported({:type, literal.type}, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :constant, args: [value]}, type: type} = t, state) do
      if is_number(value) or value in [:nan, :infinity, :neg_infinity],
        do: emit({:full, ExBurn.Tensor.Util.fit(value, type)}, [], t, state),
        else: unsupported(:constant, state)
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

    defp lower_node(%T{data: %Expr{op: :iota, args: [axis]}} = t, state),
      do: emit({:iota, axis}, [], t, state)

    defp lower_node(%T{data: %Expr{op: :eye, args: []}} = t, state), do: emit(:eye, [], t, state)

    defp lower_node(%T{data: %Expr{op: op, args: [a, b]}} = t, state) when op in @binary do
      {[ia, ib], state} = nodes([a, b], state)
      emit({:binary, op, ExBurn.Backend.Util.compute_type(op, a.type, b.type, t.type)}, [ia, ib], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a]}} = t, state) when op in @unary do
      {ia, state} = node(a, state)
      emit({:unary, op}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a]}} = t, state)
         when op in [:as_type, :reshape, :bitcast] do
      {ia, state} = node(a, state)
      emit(op, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :squeeze, args: [a, _axes]}} = t, state) do
      {ia, state} = node(a, state)
      emit(:reshape, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, axes]}} = t, state)
         when op in [:transpose, :reverse] do
      {ia, state} = node(a, state)
      emit({op, axes}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :broadcast, args: [a, _shape, axes]}} = t, state) do
      {ia, state} = node(a, state)
      emit({:broadcast, axes}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [p, x, y]}} = t, state) when op in [:select, :clip] do
      {indices, state} = nodes([p, x, y], state)
      emit(op, indices, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, opts]}} = t, state) when op in @reduce do
      {ia, state} = node(a, state)
      emit({:reduce, op, opts[:axes], opts[:keep_axes] == true}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, opts]}} = t, state) when op in [:argmax, :argmin] do
      {ia, state} = node(a, state)
      high = opts[:tie_break] == :high
      emit({:arg_reduce, op, opts[:axis], opts[:keep_axis] == true, high}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :dot, args: [a, ca, ba, b, cb, bb]}} = t, state) do
      {[ia, ib], state} = nodes([a, b], state)
      emit({:dot, ca, ba, cb, bb}, [ia, ib], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :slice, args: [a, starts, lengths, strides]}} = t, state) do
      {ia, state} = node(a, state)

      if Enum.all?(starts, &is_integer/1) do
        emit({:slice, starts, lengths, strides}, [ia], t, state)
      else
        {starts, state} = start_nodes(starts, state)
        emit({:dynamic_slice, lengths, strides}, [ia | starts], t, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :put_slice, args: [a, starts, update]}} = t, state) do
      {ia, state} = node(a, state)
      {iu, state} = node(update, state)
      {starts, state} = start_nodes(starts, state)
      emit(:put_slice, [ia, iu | starts], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :pad, args: [a, value, config]}} = t, state) do
      {[ia, iv], state} = nodes([a, value], state)
      emit({:pad, config}, [ia, iv], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :conv, args: [x, k, opts]}} = t, state) do
      spatial = tuple_size(x.shape) - 2

      # Burn has conv1d/2d/3d; the backend falls back for more spatial axes, so do we
      if spatial in 1..3 do
        {[ix, ik], state} = nodes([x, k], state)
        axes = Enum.to_list(0..(spatial + 1))

        spec =
          {opts[:strides], opts[:padding], opts[:input_dilation], opts[:kernel_dilation],
           opts[:feature_group_size], opts[:batch_group_size], opts[:input_permutation] || axes,
           opts[:kernel_permutation] || axes, opts[:output_permutation] || axes}

        emit({:conv, spec}, [ix, ik], t, state)
      else
        unsupported(:conv, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, window, opts]}} = t, state)
         when op in [:window_sum, :window_product, :window_max, :window_min] do
      {ia, state} = node(a, state)
      ones = List.duplicate(1, tuple_size(a.shape))
      spec = {Tuple.to_list(window), opts[:strides], opts[:padding], opts[:window_dilations] || ones}
      emit({:window, op, spec}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, source, init, window, opts]}} = t, state)
         when op in [:window_scatter_max, :window_scatter_min] do
      if Enum.all?(opts[:padding], fn {lo, hi} -> lo >= 0 and hi >= 0 end) do
        {indices, state} = nodes([a, source, init], state)

        select = scatter_select_type(a.type, init.type)

        scatter =
          {:window_scatter, op == :window_scatter_max, Tuple.to_list(window), opts[:strides], opts[:padding],
           select}

        emit(scatter, indices, t, state)
      else
        unsupported(op, state)
      end
    end

    defp lower_node(%T{data: %Expr{op: :sort, args: [a, opts]}} = t, state) do
      {ia, state} = node(a, state)
      emit({:sort, opts[:axis], opts[:direction] == :desc}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :argsort, args: [a, opts]}} = t, state) do
      {ia, state} = node(a, state)
      emit({:argsort, opts[:axis], opts[:direction] == :desc}, [ia], t, state)
    end

    defp lower_node(%T{data: %Expr{op: :gather, args: [a, idx, opts]}} = t, state) do
      {[ia, ii], state} = nodes([a, idx], state)
      emit({:gather, opts[:axes]}, [ia, ii], t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [a, idx, updates, opts]}} = t, state)
         when op in [:indexed_add, :indexed_put] do
      {indices, state} = nodes([a, idx, updates], state)
      axes = opts[:axes] || Enum.to_list(0..(elem(idx.shape, tuple_size(idx.shape) - 1) - 1)//1)
      emit({:indexed, if(op == :indexed_add, do: :add, else: :put), axes}, indices, t, state)
    end

    defp lower_node(%T{data: %Expr{op: op, args: [tensors, axis]}} = t, state)
         when op in [:concatenate, :stack] do
      {indices, state} = nodes(tensors, state)
      emit({op, axis}, indices, t, state)
    end

    defp lower_node(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: :hook}} = h, i]}}, state) do
      {indices, state} = hook_values(h, state)
      {Enum.at(indices, i, -1), state}
    end

    defp lower_node(%T{data: %Expr{op: :hook, args: [_, _, %T{}, _]}} = h, state) do
      {[index], state} = hook_values(h, state)
      {index, state}
    end

    defp lower_node(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: :while}} = w, i]}}, state) do
      {picks, state} = while_picks(w, state)
      {Enum.at(picks, i), state}
    end

    defp lower_node(%T{data: %Expr{op: :while}, type: type} = t, state) when elem(type, 0) != :tuple do
      {[pick], state} = while_picks(t, state)
      {pick, state}
    end

    defp lower_node(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: :cond}} = c, i]}}, state) do
      case cond_picks(c, state) do
        {:ok, picks, state} -> {Enum.at(picks, i), state}
        {:error, state} -> {-1, state}
      end
    end

    defp lower_node(%T{data: %Expr{op: :cond}, type: type} = t, state) when elem(type, 0) != :tuple do
      case cond_picks(t, state) do
        {:ok, [pick], state} -> {pick, state}
        {:ok, _, state} -> unsupported(:cond, state)
        {:error, state} -> {-1, state}
      end
    end

    # tuples only come out of while, cond, hooks and multi-output blocks: name the producer
    defp lower_node(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{op: op}}, _]}}, state),
      do: unsupported(op, state)

    defp lower_node(%T{data: %Expr{op: op}}, state), do: unsupported(op, state)

    # A cond's branches are contiguous instruction ranges that only its :cond instruction runs:
    # each predicate, then the first true clause's body (else the last). Nodes first met inside
    # a range are lowered there and forgotten after it, so nothing outside depends on a branch
    # that may not run (a node used on both sides is lowered twice). The outputs are :pick
    # instructions after the :cond.
    defp cond_picks(%T{data: %Expr{id: id, args: [clauses, last]}}, state) do
      case state.conds do
        %{^id => picks} ->
          {:ok, picks, state}

        %{} ->
          outs = flatten(last)
          bodies = Enum.map(clauses, fn {_pred, body} -> flatten(body) end)

          same? =
            Enum.all?(bodies, fn body ->
              length(body) == length(outs) and
                Enum.zip_with(body, outs, &(&1.type == &2.type and &1.shape == &2.shape)) |> Enum.all?()
            end)

          if outs == [] or not same? do
            {:error, elem(unsupported(:cond, state), 1)}
          else
            lower_cond(id, clauses, bodies, outs, state)
          end
      end
    end

    defp lower_cond(id, clauses, bodies, outs, state) do
      saved = {state.ids, state.conds}

      {clause_attrs, state} =
        clauses
        |> Enum.zip(bodies)
        |> Enum.map_reduce(state, fn {{pred, _}, body}, state ->
          {pred_range, state} = range(state, &nodes([pred], &1))
          {body_range, state} = range(state, &nodes(body, &1))
          {{pred_range, body_range}, restore(state, saved)}
        end)

      {last_range, state} = range(state, &nodes(outs, &1))
      state = restore(state, saved)
      {cond, state} = emit({:cond, clause_attrs, last_range}, [], Nx.template({}, {:u, 8}), state)

      {picks, state} =
        outs
        |> Enum.with_index()
        |> Enum.map_reduce(state, fn {out, j}, state -> emit({:pick, cond, j}, [], out, state) end)

      {:ok, picks, %{state | conds: Map.put(state.conds, id, picks)}}
    end

    # A while's condition and body are ranges run by its :while instruction, over :loop_var
    # slots that hold the loop state (the Evaluator binds every parameter inside them to it).
    defp while_picks(%T{data: %Expr{id: id, args: [initial, arg, condition, body]}}, state) do
      case state.conds do
        %{^id => picks} ->
          {picks, state}

        %{} ->
          {inits, state} = nodes(flatten(initial), state)
          saved = {state.ids, state.conds}
          outer_scope = state.scope
          {vars, state} = Enum.map_reduce(flatten(arg), state, &emit(:loop_var, [], &1, &2))
          state = %{state | scope: vars}
          {cond_range, state} = range(state, &nodes([condition], &1))
          {body_range, state} = range(state, &nodes(flatten(body), &1))
          state = %{restore(state, saved) | scope: outer_scope}
          {w, state} = emit({:while, vars, cond_range, body_range}, inits, Nx.template({}, {:u, 8}), state)

          {picks, state} =
            flatten(arg)
            |> Enum.with_index()
            |> Enum.map_reduce(state, fn {out, j}, state -> emit({:pick, w, j}, [], out, state) end)

          {picks, %{state | conds: Map.put(state.conds, id, picks)}}
      end
    end

    defp range(state, fun) do
      start = state.count
      {outs, inner} = fun.(%{state | depth: state.depth + 1})
      inner = %{inner | depth: state.depth}

      # a branch may yield an outer value as is; the program cannot yield a host-only one
      inner =
        if Enum.any?(outs, &MapSet.member?(inner.foreign, &1)),
          do: elem(unsupported(:foreign_operand, inner), 1),
          else: inner

      {{start, inner.count, outs}, inner}
    end

    ## Host nodes

    # The host expression is `t` (or, for an element of a tuple, its whole producer) with
    # every operand the program computes replaced by a parameter; the Evaluator runs it with
    # those values. Operands are lowered first, except inside a cond's branches: there only
    # values already computed are reused, so an untaken branch still costs nothing.
    defp host(%T{data: %Expr{op: :elem, args: [%T{data: %Expr{id: pid}} = producer, i]}} = t, reasons, state) do
      case state.conds do
        %{^pid => indices} ->
          {Enum.at(indices, i, -1), state}

        %{} ->
          case tuple_leaves(producer) do
            nil ->
              unsupported(t.data.op, state)

            leaves ->
              {indices, state} = host_node(producer, leaves, reasons, state)
              {Enum.at(indices, i, -1), %{state | conds: Map.put(state.conds, pid, indices)}}
          end
      end
    end

    defp host(%T{type: {:tuple, _}} = t, _reasons, state), do: unsupported(t.data.op, state)

    defp host(t, reasons, state) do
      {[index], state} = host_node(t, [t], reasons, state)
      {index, state}
    end

    defp host_node(%T{data: %Expr{op: op}} = root, leaves, reasons, state) do
      mode = if op == :cond, do: :reuse, else: :lower
      acc = {%{}, [], state}
      {args, {_memo, params, state}} = Tree.apply_args(root, :scope, acc, &host_arg(&1, &2, mode))
      root = %{root | data: %{root.data | args: args}}
      expr = if match?({:tuple, _}, root.type), do: Expr.tuple(root, leaves), else: root
      params = Enum.reverse(params)
      args = Enum.map(params, &elem(&1, 0))
      id = length(state.hosts)
      entry = %{expr: expr, params: Enum.map(params, &elem(&1, 1)), op: op, reasons: reasons}
      state = %{state | hosts: [entry | state.hosts]}

      leaves
      |> Enum.with_index()
      |> Enum.map_reduce(state, fn {%T{type: type, shape: shape}, k}, state ->
        {index, state} = emit!({:host, id, k}, args, type, shape, state)

        foreign =
          if ExBurn.Backend.Util.native_type?(type), do: state.foreign, else: MapSet.put(state.foreign, index)

        {index, %{state | foreign: foreign}}
      end)
    end

    defp host_param(i, %T{type: type, shape: shape}, state) do
      id = length(state.hosts)
      entry = %{param: i, op: :parameter, reasons: [{:type, type}]}
      {index, state} = emit!({:host, id, 0}, [], type, shape, %{state | hosts: [entry | state.hosts]})
      {index, %{state | foreign: MapSet.put(state.foreign, index)}}
    end

    # an Elixir function given to reduce/window_reduce is the Evaluator's to run
    defp host_arg(%T{data: %Expr{op: :fun}} = u, acc, _mode), do: {u, acc}

    defp host_arg(%T{data: %Expr{id: id}} = u, {memo, _params, _state} = acc, mode) do
      case memo do
        %{^id => v} ->
          {v, acc}

        %{} ->
          {v, {memo, params, state}} = host_value(u, acc, mode)
          {v, {Map.put(memo, id, v), params, state}}
      end
    end

    defp host_value(u, {memo, params, state}, :lower) do
      case node(u, state) do
        {index, state} when index >= 0 -> param(u, index, {memo, params, state})
        {_, state} -> {u, {memo, params, elem(unsupported(:host_operand, state), 1)}}
      end
    end

    defp host_value(%T{data: %Expr{id: id, op: op, args: args}} = u, {memo, params, state}, :reuse) do
      {known, state} =
        case {state.ids, op, args} do
          {%{^id => index}, _, _} -> {index, state}
          # a parameter costs nothing to lower: it is an input or a loop/block slot
          {_, :parameter, _} -> node(u, state)
          {_, :elem, [%T{data: %Expr{id: pid}}, i]} -> {state.conds |> Map.get(pid, []) |> Enum.at(i), state}
          _ -> {nil, state}
        end

      if is_integer(known) and known >= 0 do
        param(u, known, {memo, params, state})
      else
        {args, acc} = Tree.apply_args(u, :scope, {memo, params, state}, &host_arg(&1, &2, :reuse))
        {%{u | data: %{u.data | args: args}}, acc}
      end
    end

    defp param(u, index, {memo, params, state}) do
      case List.keyfind(params, index, 0) do
        {_, p} ->
          {p, {memo, params, state}}

        nil ->
          p = Expr.parameter(u, :root, length(params))
          {p, {memo, [{index, p} | params], state}}
      end
    end

    # The leaves of a tuple-valued node, in the order of its `elem` indices.
    defp tuple_leaves(%T{data: %Expr{op: op, args: args}}) do
      case {op, args} do
        {:cond, [_clauses, last]} -> flatten(last)
        {:while, [_initial, arg, _cond, _body]} -> flatten(arg)
        {:block, [_struct, _in, default, _fun]} -> flatten(default)
        {:metadata, [inner, _meta]} -> flatten(inner)
        {:runtime_call, [_in, _fun, template, _opts]} -> flatten(template)
        _ -> nil
      end
    end

    # A hook passes its value through; the values it shows its callback become extra program
    # outputs, and the caller runs the callbacks (in lowering order) after the program. Inside
    # a cond or while a hook would have to run per execution, so those graphs fall back.
    # Each hook is `{id, spec, template, indices}`: the id lets a run fire it once even when
    # a hosted cond holds it too (see ExBurn.Defn.Hooks).
    defp hook_values(%T{data: %Expr{id: id, args: [tensor_expr, spec, template, _ref]}}, state) do
      case state.conds do
        %{^id => indices} ->
          {indices, state}

        %{} when state.depth > 0 ->
          {_, state} = unsupported(:hook, state)
          {[-1], state}

        %{} ->
          {indices, state} = nodes(flatten(tensor_expr), state)

          {hook, state} =
            case spec do
              {:token_hook, hooked, inner} ->
                {shown, state} = nodes(flatten(hooked), state)
                {{id, inner, Composite.traverse(hooked, &Nx.to_template/1), shown}, state}

              spec ->
                {{id, spec, template, indices}, state}
            end

          {indices, %{state | hooks: [hook | state.hooks], conds: Map.put(state.conds, id, indices)}}
      end
    end

    defp restore(state, {ids, conds}), do: %{state | ids: ids, conds: conds}

    # The backend's compare type for window scatters (see ExBurn.Backend).
    defp scatter_select_type(type, init_type) do
      cond do
        Nx.Type.float?(type) -> type
        Nx.Type.float?(init_type) -> {:f, 32}
        true -> Nx.Type.merge(type, init_type)
      end
    end

    # Start indices: integers become s64 constants so every start is an operand read at run time.
    defp start_nodes(starts, state) do
      Enum.map_reduce(starts, state, fn
        s, state when is_integer(s) -> emit({:full, s}, [], Nx.template({}, {:s, 64}), state)
        %T{} = s, state -> node(s, state)
      end)
    end

    @doc "The output tensors of a container, in `Composite` order."
    def flatten(container), do: Composite.flatten_list([container])
  end
end
