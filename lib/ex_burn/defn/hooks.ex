if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Hooks do
    @moduledoc false
    # Hooks fire exactly as under Nx.Defn.Evaluator: once per evaluation of the hook node.
    #
    # The native program shows hooked values as extra outputs and their callbacks run after it
    # (ExBurn.Defn.Compiler.finish/3); a hosted cond runs its own hooks in the Evaluator. One
    # hook node can be in both places (used inside an `if` and after it), where the Evaluator
    # fires it once. So during a run with host nodes, hosted copies of natively fired hooks
    # call back through `fire/3`, which records the hook's id, and the native callbacks after
    # the program skip the ids already fired. Hooks that only hosted nodes hold (inside a
    # hosted while, say) are left to the Evaluator: they fire on every iteration, as they must.

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
    For `ExBurn.Defn.Graph.pack/2`: a hosted hook node whose id is in `native_ids` gets a
    callback that goes through `fire/3` (named hooks resolved against `overrides` first, as
    the Evaluator would).
    """
    def guard(
          %T{data: %Expr{op: :hook, id: id, args: [value, spec, template, ref]} = expr} = t,
          native_ids,
          overrides
        ) do
      if MapSet.member?(native_ids, id) do
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

    def guard(t, _native_ids, _overrides), do: t

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
