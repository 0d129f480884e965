if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Hooks do
    @moduledoc false
    # Hooks fire exactly as under Nx.Defn.Evaluator: once per evaluation of the hook node.
    #
    # The native program shows hooked values as extra outputs and their callbacks run after it
    # (ExBurn.Defn.Compiler.finish/3); each hosted node runs its own hooks in its own Evaluator
    # call. One hook node can be in several of those places (used in two hosted `if`s, or in one
    # and after it), where the single Evaluator of the whole graph fires it once. So during a run
    # with host nodes every hook outside loop bodies calls back through `fire/3`, which records
    # the hook's id and skips ids already fired. Hooks inside a loop body are left to the
    # Evaluator: they fire on every iteration, as they must.

    alias Nx.Defn.Expr
    alias Nx.Tensor, as: T

    @fired {__MODULE__, :fired}

    @doc "Runs `fun` as one evaluation: each guarded hook fires at most once inside it."
    def run(fun) do
      previous = Process.put(@fired, MapSet.new())

      try do
        fun.()
      after
        if previous, do: Process.put(@fired, previous), else: Process.delete(@fired)
      end
    end

    @doc "Calls `callback` (if any) with `value` unless hook `id` already fired in this run."
    def fire(id, callback, value) do
      case Process.get(@fired) do
        nil ->
          if callback, do: callback.(value)

        fired ->
          unless MapSet.member?(fired, id) do
            Process.put(@fired, MapSet.put(fired, id))
            if callback, do: callback.(value)
          end
      end

      :ok
    end

    @doc """
    The ids of the hook nodes in `term` (expressions, in any container) that the Evaluator
    runs at most once per evaluation: every hook outside `while` bodies and anonymous
    functions (a cond's branches run at most once).
    """
    def once_ids(term), do: term |> once_ids({MapSet.new(), MapSet.new()}) |> elem(1)

    defp once_ids(%T{data: %Expr{id: id, op: op, args: args}}, {seen, hooks} = acc) do
      cond do
        MapSet.member?(seen, id) -> acc
        # only the initial state is evaluated once; condition and body run per iteration
        op == :while -> once_ids(hd(args), {MapSet.put(seen, id), hooks})
        op == :fun -> {MapSet.put(seen, id), hooks}
        op == :hook -> once_ids(args, {MapSet.put(seen, id), MapSet.put(hooks, id)})
        true -> once_ids(args, {MapSet.put(seen, id), hooks})
      end
    end

    defp once_ids(list, acc) when is_list(list), do: Enum.reduce(list, acc, &once_ids/2)
    defp once_ids(tuple, acc) when is_tuple(tuple), do: once_ids(Tuple.to_list(tuple), acc)
    defp once_ids(%{} = map, acc), do: map |> Map.values() |> once_ids(acc)
    defp once_ids(_other, acc), do: acc

    @doc """
    For `ExBurn.Defn.Graph.pack/2`: a hosted hook node whose id is in `once` gets a callback
    that goes through `fire/3` (named hooks resolved against `overrides` first, as the
    Evaluator would).
    """
    def guard(
          %T{data: %Expr{op: :hook, id: id, args: [value, spec, template, ref]} = expr} = t,
          once,
          overrides
        ) do
      if MapSet.member?(once, id) do
        spec =
          case spec do
            {:token_hook, hooked, inner} -> {:token_hook, hooked, guarded(id, inner, overrides)}
            spec -> guarded(id, spec, overrides)
          end

        %{t | data: %{expr | args: [value, spec, template, ref]}}
      else
        t
      end
    end

    def guard(t, _once, _overrides), do: t

    defp guarded(id, spec, overrides) do
      callback = resolve(spec, overrides)
      {:fn, fn value -> fire(id, callback, value) end}
    end

    @doc "The callback of a hook spec, a `:hooks` override by name winning (as in the Evaluator)."
    def resolve({:fn, fun}, _overrides), do: fun
    def resolve({:named, name, callback}, overrides), do: overrides[name] || callback
    def resolve(nil, _overrides), do: nil
  end
end
