if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Plan do
    @moduledoc false
    # Cuts a lowered instruction list at its host nodes into steps run in order:
    #
    #   * `{:native, instrs, imports, exports, outputs}` - a program over the global inputs
    #     followed by `imports` (values of earlier steps, by global index); it yields `exports`
    #     (global indices of the values later steps or the results need) at its own `outputs`.
    #   * `{:host, id, args, outs}` - host node `id` reads `args` and yields `outs`.
    #
    # Host nodes are only ever top-level, so a cut never splits a cond's or a while's ranges.
    # Each native step is renumbered from 0: its imports become `:input` instructions after
    # the global inputs, and the indices inside cond/while/pick attributes move with it.

    @doc "The steps for `instrs` whose results are `outputs`, with `n_global` global inputs."
    def split(instrs, outputs, n_global) do
      instrs = instrs |> Enum.with_index() |> List.to_tuple()

      steps =
        instrs
        |> Tuple.to_list()
        |> Enum.chunk_by(fn
          {{{:host, id, _}, _, _, _}, _} -> {:host, id}
          _ -> :native
        end)
        |> Enum.map(fn
          [{{{:host, id, _}, args, _, _}, _} | _] = chunk ->
            {:host, id, args, Enum.map(chunk, &elem(&1, 1))}

          chunk ->
            {:segment, Enum.map(chunk, &elem(&1, 1))}
        end)

      # what each step reads, to know what each segment must export
      reads = Enum.map(steps, &step_reads(&1, instrs))

      later =
        reads
        |> Enum.reverse()
        |> Enum.scan(MapSet.new(outputs), &MapSet.union(MapSet.new(&1), &2))
        |> Enum.reverse()

      needed_after = tl(later) ++ [MapSet.new(outputs)]

      Enum.zip_with([steps, reads, needed_after], fn
        [{:host, _, _, _} = step, _, _] -> step
        [{:segment, indices}, reads, after_set] -> segment(indices, reads, after_set, instrs, n_global)
      end)
    end

    defp step_reads({:host, _id, args, _outs}, _instrs), do: args
    defp step_reads({:segment, indices}, instrs), do: Enum.flat_map(indices, &refs(elem(elem(instrs, &1), 0)))

    defp segment([first | _] = indices, reads, after_set, instrs, n_global) do
      own = MapSet.new(indices)
      imports = reads |> Enum.reject(&MapSet.member?(own, &1)) |> Enum.uniq() |> Enum.sort()
      exports = Enum.filter(indices, &MapSet.member?(after_set, &1))
      # the imports' :input instructions come first (positions 0..n-1, reading global inputs
      # n_global..), then the segment's own instructions
      import_pos = imports |> Enum.with_index() |> Map.new()
      shift = map_size(import_pos) - first
      map = fn i -> if i >= first, do: i + shift, else: Map.fetch!(import_pos, i) end

      head =
        Enum.map(imports, fn i ->
          {_op, _args, type, shape} = elem(elem(instrs, i), 0)
          {{:input, n_global + Map.fetch!(import_pos, i)}, [], type, shape}
        end)

      body = Enum.map(indices, fn i -> remap(elem(elem(instrs, i), 0), map) end)
      {:native, head ++ body, imports, exports, Enum.map(exports, map)}
    end

    defp refs({{:cond, clauses, last}, args, _, _}),
      do: args ++ Enum.flat_map(clauses, fn {p, b} -> outs(p) ++ outs(b) end) ++ outs(last)

    defp refs({{:while, vars, c, b}, args, _, _}), do: args ++ vars ++ outs(c) ++ outs(b)
    defp refs({{:pick, cond, _}, args, _, _}), do: [cond | args]
    defp refs({_op, args, _, _}), do: args

    defp outs({_start, _end, outs}), do: outs

    defp remap({op, args, type, shape}, map) do
      op =
        case op do
          {:cond, clauses, last} ->
            {:cond, Enum.map(clauses, fn {p, b} -> {range(p, map), range(b, map)} end), range(last, map)}

          {:while, vars, c, b} ->
            {:while, Enum.map(vars, map), range(c, map), range(b, map)}

          {:pick, cond, j} ->
            {:pick, map.(cond), j}

          op ->
            op
        end

      {op, Enum.map(args, map), type, shape}
    end

    # start/end are positions inside the segment; outputs may be imported values
    defp range({start, stop, outs}, map), do: {map.(start), map.(stop), Enum.map(outs, map)}
  end
end
