if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Compiler do
    @moduledoc """
    An `Nx.Defn.Compiler` on Burn: the whole `defn` expression is lowered into one native
    program that the NIF runs in a single call.

        Nx.Defn.jit(&MyMod.step/2, compiler: ExBurn.Defn.Compiler).(params, batch)

        # or for every defn
        Nx.Defn.default_options(compiler: ExBurn.Defn.Compiler)

    Compiled programs are cached by the function, the argument templates (type, shape, names,
    container structure) and the options: a repeated call with new data skips tracing and
    lowering and goes straight to the NIF.

    Graphs with nodes that have no native lowering (hooks inside `cond`/`while`, `reduce`
    and `window_reduce` with Elixir functions, ...) are evaluated node by node by
    `Nx.Defn.Evaluator` on `ExBurn.Backend` instead: same results, one NIF call per node. Which
    path a graph took is logged at debug level and counted in `stats/0`. Results are always
    `ExBurn.Backend` tensors.

    ## Options

      * `:device` - `:cpu` or `{kind, index}` (default `ExBurn.default_device/0`).
      * `:devices` - a list of devices; `__partitions_options__/1` gives one partition each
        (used by `Nx.Serving`).
      * `:native` - `false` to force node-by-node evaluation (default `true`).
      * `:hooks` - overrides for named hooks, as with `Nx.Defn.Evaluator`.
    """

    @behaviour Nx.Defn.Compiler

    require Logger

    alias ExBurn.Defn.{Cache, Lower}
    alias Nx.Defn.Composite

    @doc """
    Counters since start (or `reset_stats/0`): `:native` and `:fallback` compilations,
    `{:fallback_op, op}` per unsupported op, `:native_runs`, `:fallback_runs`, `:cache_hits`,
    `:cache_misses`.
    """
    def stats, do: Cache.counts()

    @doc "Zeroes `stats/0`."
    def reset_stats, do: Cache.reset_counts()

    @doc "Drops every cached program (they are rebuilt on next use)."
    def clear_cache, do: Cache.clear()

    @impl true
    def __partitions_options__(opts) do
      case Keyword.pop(opts, :devices) do
        {nil, opts} -> [opts]
        {devices, opts} -> Enum.map(devices, &Keyword.put(opts, :device, &1))
      end
    end

    @impl true
    def __to_backend__(opts), do: {ExBurn.Backend, device: device(opts)}

    @impl true
    def __jit__(key, vars, fun, args_list, opts), do: __compile__(key, vars, fun, opts).(args_list)

    @impl true
    def __compile__(key, vars, fun, opts) do
      device = device(opts)
      templates = Enum.map(vars, &Composite.traverse(&1, fn t -> Nx.to_template(t) end))
      cache_key = {key, templates, Keyword.put(opts, :device, device)}
      entry = Cache.fetch(cache_key, fn -> build(key, vars, fun, opts, device) end)
      fn args_list -> Enum.map(args_list, &run(entry, &1, device)) end
    end

    defp device(opts), do: ExBurn.Tensor.Util.device!(:compiler, opts[:device])

    ## Building

    defp build(key, vars, fun, opts, device) do
      expr = fun.(vars)
      n_params = length(Composite.flatten_list(vars))
      outputs = Lower.flatten(expr)

      lowered =
        cond do
          opts[:native] == false ->
            {:unsupported, [:native_disabled]}

          Enum.any?(Composite.flatten_list(vars), &(&1.vectorized_axes != [])) ->
            {:unsupported, [:vectorized]}

          true ->
            Lower.lower(outputs, n_params)
        end

      case lowered do
        {:ok, program} ->
          native_entry(program, expr, n_params, device, opts[:hooks] || %{})

        {:unsupported, ops} ->
          Cache.bump(:fallback)
          Enum.each(ops, &Cache.bump({:fallback_op, &1}))

          Logger.debug(fn ->
            "ExBurn.Defn.Compiler: #{inspect(key)} runs node by node (no native lowering for #{inspect(ops)})"
          end)

          evaluator_opts = Keyword.take(opts, [:hooks, :garbage_collect])
          eval = Nx.Defn.Evaluator.__compile__(key, vars, fn _ -> expr end, evaluator_opts)
          {:evaluator, eval, template(expr)}
      end
    end

    defp native_entry(program, expr, n_params, device, overrides) do
      %{instrs: instrs, outputs: outputs, literals: literals, hooks: hooks} = program
      Cache.bump(:native)
      literal_refs = Enum.map(literals, &ExBurn.Backend.et(&1, device).ref)
      # hooked values are extra outputs after the results
      hooks =
        Enum.map(hooks, fn {spec, template, indices} -> {resolve_hook(spec, overrides), template, indices} end)
      outputs = outputs ++ Enum.flat_map(hooks, &elem(&1, 2))

      program =
        ExBurn.Error.unwrap!(ExBurn.Native.program_new(instrs, outputs, n_params + length(literals), device))

      Logger.debug(fn ->
        "ExBurn.Defn.Compiler: native program of #{length(instrs)} instructions, #{length(outputs)} outputs"
      end)

      hooks = Enum.map(hooks, fn {fun, template, indices} -> {fun, template, length(indices)} end)
      {:native, program, literal_refs, template(expr), hooks}
    end

    # As Nx.Defn.Evaluator: a `:hooks` override by name wins over the hook's own callback.
    defp resolve_hook({:fn, fun}, _overrides), do: fun
    defp resolve_hook({:named, name, callback}, overrides), do: overrides[name] || callback
    defp resolve_hook(nil, _overrides), do: nil

    # Keeps only what results need (types, shapes, names): dropping the expression lets the
    # graph be garbage collected while the entry stays cached.
    defp template(expr), do: Composite.traverse(expr, fn t -> Nx.to_template(t) end)

    ## Running

    defp run({:native, program, literal_refs, template, hooks}, params, device) do
      Cache.bump(:native_runs)
      refs = Enum.map(params, fn param -> ExBurn.Backend.et(param.(), device).ref end)
      answers = ExBurn.Error.unwrap!(ExBurn.Native.program_run(program, refs ++ literal_refs))
      {result, hooked} = fill(template, answers)

      Enum.reduce(hooks, hooked, fn {fun, hook_template, _count}, answers ->
        {value, rest} = fill(hook_template, answers)
        if fun, do: fun.(value)
        rest
      end)

      result
    end


    defp run({:evaluator, eval, _template}, params, device) do
      Cache.bump(:fallback_runs)
      backend = {ExBurn.Backend, device: device}
      params = Enum.map(params, fn param -> fn -> to_backend(param.(), backend) end end)
      previous = Nx.default_backend(backend)

      try do
        [result] = eval.([params])
        Composite.traverse(result, &to_backend(&1, backend))
      after
        Nx.default_backend(previous)
      end
    end

    defp fill(template, answers) do
      Composite.traverse(template, answers, fn out, [answer | rest] ->
        {ExBurn.Backend.put(out, ExBurn.Tensor.Util.wrap({:ok, answer})), rest}
      end)
    end

    defp to_backend(%Nx.Tensor{data: %ExBurn.Backend{device: d}} = t, {_, device: d}), do: t
    defp to_backend(%Nx.Tensor{} = t, backend), do: Nx.backend_copy(t, backend)
    defp to_backend(other, _backend), do: other
  end
end
