if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Graph do
    @moduledoc false
    # A sharing-preserving form of Nx.Defn.Expr graphs, for anything that is copied.
    #
    # An expression graph is a DAG: a node used twice is one term referenced twice. The BEAM
    # copies terms without preserving that sharing (`:ets.insert`, messages, closures captured
    # by a spawned process), so a copy costs the size of the graph unfolded into a tree, which
    # is exponential in its depth for graphs such as SVD's or a determinant's gradient. Such a
    # copy is one BIF call that does not yield: it froze a normal scheduler for minutes,
    # aborted the VM allocating 11 GB, or filled the compile cache's ETS table with GBs.
    #
    # `pack/1` stores every expression node once, by id, in a flat map and replaces each use by
    # a reference; its size is linear in the number of distinct nodes, so it can be copied
    # freely. `unpack/1` rebuilds the shared graph in the calling process, also in linear time.

    alias Nx.Defn.Expr
    alias Nx.Tensor, as: T

    @opaque packed :: {:packed, term, %{optional(term) => Expr.t()}}

    @doc """
    Packs any term holding expressions (a container, an expression, a list of them).
    `rewrite` is applied to every expression node once, before its arguments are packed.
    """
    def pack(term, rewrite \\ & &1) do
      {root, {nodes, _rewrite}} = pack_term(term, {%{}, rewrite})
      {:packed, root, nodes}
    end

    @doc """
    A stand-in for `term` as a cache key, linear in size however much the term shares: equal
    for equal terms, expressions compared by id, and closures by their code and the values
    they capture (which Nx's jit keys often hold: a stage of `Nx.Defn.Graph` captures its
    whole expression). Hashing or copying the raw term would unfold those graphs.
    """
    def key(term) do
      {root, {nodes, _}} = pack_term(term, {%{}, :key})
      {root, nodes}
    end

    @doc "The term `pack/1` was given, with its sharing restored."
    def unpack({:packed, root, nodes}) do
      {term, _memo} = unpack_term(root, nodes, %{})
      term
    end

    # Nodes are stored by id as their Expr data; a use keeps its own tensor fields, because Nx
    # makes several views of one node (`Nx.vectorize`/`devectorize` share the data, not the
    # shape).
    defp pack_term(%T{data: %Expr{id: id}} = t, {nodes, rewrite} = acc) do
      view = %{t | data: nil}

      if Map.has_key?(nodes, id) do
        {{__MODULE__, :ref, id, view}, acc}
      else
        %T{data: %Expr{args: args} = expr} = t |> drop_metadata() |> apply_rewrite(rewrite)
        # reserve the id first: a node never reaches itself, but its arguments may share it
        {args, {nodes, rewrite}} = pack_term(args, {Map.put(nodes, id, nil), rewrite})
        {{__MODULE__, :ref, id, view}, {Map.put(nodes, id, %{expr | args: args}), rewrite}}
      end
    end

    defp pack_term(list, nodes) when is_list(list), do: map_reduce_list(list, nodes, &pack_term/2)

    defp pack_term(tuple, nodes) when is_tuple(tuple) do
      {list, nodes} = pack_term(Tuple.to_list(tuple), nodes)
      {List.to_tuple(list), nodes}
    end

    # as keys, closures are their code and their captured values; packed graphs keep closures
    # whole (the Evaluator calls them)
    defp pack_term(fun, {_nodes, :key} = acc) when is_function(fun) do
      case :erlang.fun_info(fun, :type) do
        {:type, :local} ->
          info = :erlang.fun_info(fun)
          {env, acc} = pack_term(info[:env], acc)
          {{__MODULE__, :fun, info[:module], info[:new_uniq], info[:index], env}, acc}

        {:type, :external} ->
          {fun, acc}
      end
    end

    # maps and structs alike (a struct's `__struct__` pair comes back unchanged)
    defp pack_term(%{} = map, nodes) do
      {pairs, nodes} = pack_term(Map.to_list(map), nodes)
      {Map.new(pairs), nodes}
    end

    defp pack_term(other, nodes), do: {other, nodes}

    defp apply_rewrite(t, :key), do: t
    defp apply_rewrite(t, rewrite), do: rewrite.(t)

    # A metadata node's map (custom_grad, stop_grad, ...) serves only Nx's gradient transform,
    # which has run before a graph is compiled; evaluation reads just the inner expression.
    # Its closures capture parts of the graph, which a copy would unfold, so the map goes.
    defp drop_metadata(%T{data: %Expr{op: :metadata, args: [inner, _meta]} = expr} = t),
      do: %{t | data: %{expr | args: [inner, %{}]}}

    defp drop_metadata(t), do: t

    defp unpack_term({__MODULE__, :ref, id, view}, nodes, memo) do
      case memo do
        %{^id => data} ->
          {%{view | data: data}, memo}

        %{} ->
          %Expr{args: args} = data = Map.fetch!(nodes, id)
          {args, memo} = unpack_term(args, nodes, memo)
          data = %{data | args: args}
          {%{view | data: data}, Map.put(memo, id, data)}
      end
    end

    defp unpack_term(list, nodes, memo) when is_list(list),
      do: map_reduce_list(list, memo, &unpack_term(&1, nodes, &2))

    defp unpack_term(tuple, nodes, memo) when is_tuple(tuple) do
      {list, memo} = unpack_term(Tuple.to_list(tuple), nodes, memo)
      {List.to_tuple(list), memo}
    end

    defp unpack_term(%{} = map, nodes, memo) do
      {pairs, memo} = unpack_term(Map.to_list(map), nodes, memo)
      {Map.new(pairs), memo}
    end

    defp unpack_term(other, _nodes, memo), do: {other, memo}

    # Enum.map_reduce/3 needs proper lists; expression args may hold improper ones (never in
    # practice today, but a generic walker must not crash on them).
    defp map_reduce_list([], acc, _fun), do: {[], acc}

    defp map_reduce_list([h | t], acc, fun) do
      {h, acc} = fun.(h, acc)
      {t, acc} = map_reduce_list(t, acc, fun)
      {[h | t], acc}
    end

    defp map_reduce_list(tail, acc, fun), do: fun.(tail, acc)
  end
end
