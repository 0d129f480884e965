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

    A node with no native lowering (`reduce`/`window_reduce` with an Elixir function,
    `Nx.runtime_call`, fft, complex values, ...) becomes a host node: `Nx.Defn.Evaluator` runs
    that node alone on `ExBurn.Backend`, between native segments of the program. A `cond` or
    `while` holding such a node (a hook inside a loop, say) is hosted whole. Only vectorized
    tensors send the whole graph through the Evaluator. Hosted nodes are logged at debug level
    and counted in `stats/0`. Results are always `ExBurn.Backend` tensors.

    `__shard_jit__/6` (SPMD sharding over a mesh) is not supported and raises.

    ## Options

      * `:device` - `:cpu` or `{kind, index}` (default `ExBurn.default_device/0`).
      * `:devices` - a list of devices; `__partitions_options__/1` gives one partition each
        (used by `Nx.Serving`).
      * `:native` - `false` to force node-by-node evaluation (default `true`).
      * `:hooks` - overrides for named hooks, as with `Nx.Defn.Evaluator`.
    """

    @behaviour Nx.Defn.Compiler

    require Logger

    alias ExBurn.Defn.{Cache, Graph, Hooks, Host, Lower}
    alias Nx.Defn.Composite

    @doc """
    Counters since start (or `reset_stats/0`): `:native` compilations and `:fallback` ones
    (whole graph through the Evaluator), `:hosted` nodes and `{:hosted_op, op}` per hosted
    node's op, `{:fallback_op, reason}` per reason a node was not lowered, `:native_segments`,
    `:native_runs`, `:host_runs`, `:fallback_runs`, `:cache_hits`, `:cache_misses`,
    `:evictions`.
    """
    def stats, do: Cache.counts()

    @doc "Zeroes `stats/0`."
    def reset_stats, do: Cache.reset_counts()

    @doc "Drops every cached program (they are rebuilt on next use)."
    def clear_cache, do: Cache.clear()

    @doc """
    How many compiled programs are cached. At most `Application.get_env(:ex_burn,
    :defn_cache_size, 256)` are kept; a new one beyond that evicts the least recently used.
    """
    def cache_size, do: Cache.size()

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
    def __shard_jit__(_key, _mesh, _vars, _fun, _args_list, _opts) do
      raise ArgumentError,
            "ExBurn.Defn.Compiler does not support sharding (Nx.Defn.shard_jit); " <>
              "use :devices with Nx.Serving partitions for data parallelism"
    end

    @impl true
    def __jit__(key, vars, fun, args_list, opts), do: __compile__(key, vars, fun, opts).(args_list)

    @impl true
    def __compile__(key, vars, fun, opts) do
      device = device(opts)
      templates = Enum.map(vars, &template/1)
      cache_key = Graph.key({key, templates, Keyword.put(opts, :device, device)})
      entry = Cache.fetch(cache_key, fn -> build(key, vars, templates, fun, opts, device) end)
      fn args_list -> Enum.map(args_list, &run(entry, &1, device)) end
    end

    defp device(opts), do: ExBurn.Tensor.Util.device!(:compiler, opts[:device])

    ## Building

    # Entries are cached in ETS and captured by the returned closure (which Nx.Serving may
    # hand to other processes), so they never hold an expression graph as such: graphs are
    # kept packed (ExBurn.Defn.Graph), whose copies cost their size, not their unfolded size.
    defp build(key, vars, templates, fun, opts, device) do
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
        {:ok, %{hosts: []} = program} ->
          native_entry(program, expr, device, opts[:hooks] || %{})

        {:ok, program} ->
          Host.entry(key, program, template(expr), device, opts)

        {:unsupported, ops} ->
          Cache.bump(:fallback)
          Enum.each(ops, &Cache.bump({:fallback_op, &1}))

          Logger.debug(fn ->
            "ExBurn.Defn.Compiler: #{inspect(key)} runs node by node (no native lowering for #{inspect(ops)})"
          end)

          {:evaluator, {templates, Graph.pack(expr), evaluator_opts(opts)}}
      end
    end

    defp native_entry(program, expr, device, overrides) do
      Cache.bump(:native)
      {outputs, literal_refs, hooks} = prepare(program, device, overrides)
      n_inputs = length(program.params) + length(literal_refs)
      native = ExBurn.Error.unwrap!(ExBurn.Native.program_new(program.instrs, outputs, n_inputs, device))

      Logger.debug(fn ->
        "ExBurn.Defn.Compiler: native program of #{length(program.instrs)} instructions, #{length(outputs)} outputs"
      end)

      {:native, native, program.params, literal_refs, template(expr), hooks}
    end

    @doc false
    # What every native entry needs from a lowered program: the outputs (hooked values are extra
    # outputs after the results), the literal tensors uploaded once, and each hook as
    # `{id, callback, template, value_count}` for `finish/3`.
    def prepare(%{outputs: outputs, literals: literals, hooks: hooks}, device, overrides) do
      literal_refs = Enum.map(literals, &ExBurn.Backend.Util.et(&1, device).ref)
      outputs = outputs ++ Enum.flat_map(hooks, &elem(&1, 3))

      hooks =
        Enum.map(hooks, fn {id, spec, t, indices} ->
          {id, Hooks.resolve(spec, overrides), t, length(indices)}
        end)

      {outputs, literal_refs, hooks}
    end

    @doc false
    def evaluator_opts(opts), do: Keyword.take(opts, [:hooks, :garbage_collect])

    @doc false
    # The native refs of the parameters a program reads (`used`, ascending indices): only
    # those are materialised, so templates and unused lazy fields are never touched.
    def param_refs(params, used, device) do
      params = List.to_tuple(params)
      Enum.map(used, fn i -> ExBurn.Backend.Util.et(elem(params, i).(), device).ref end)
    end

    # Keeps only what results need (types, shapes, names): dropping the expression lets the
    # graph be garbage collected while the entry stays cached.
    defp template(expr), do: Composite.traverse(expr, fn t -> Nx.to_template(t) end)

    ## Running

    defp run({:staged, _, _, _, _} = entry, params, device) do
      Cache.bump(:native_runs)
      entry |> Host.run(params, device) |> dealias()
    end

    defp run({:native, program, used, literal_refs, template, hooks}, params, device) do
      Cache.bump(:native_runs)
      refs = param_refs(params, used, device)
      answers = ExBurn.Error.unwrap!(ExBurn.Native.program_run(program, refs ++ literal_refs))
      finish(template, hooks, answers)
    end

    defp run({:evaluator, {templates, packed, eval_opts}}, params, device) do
      Cache.bump(:fallback_runs)
      expr = Graph.unpack(packed)
      # the Evaluator ignores its key; entries never hold jit keys (see Graph.key/1)
      eval = Nx.Defn.Evaluator.__compile__(nil, templates, fn _ -> expr end, eval_opts)
      backend = {ExBurn.Backend, device: device}
      # each input the Evaluator reads enters under a reference of its own (a new reference to
      # the same buffer where it is already on the device), so a result that is an input as it
      # came is not the caller's tensor
      params = Enum.map(params, fn param -> fn -> copy_in(param.(), backend) end end)
      previous = Nx.default_backend(backend)

      try do
        [result] = eval.([params])
        Composite.traverse(result, &to_backend(&1, backend))
      after
        Nx.default_backend(previous)
      end
      |> dealias()
    end

    defp copy_in(%Nx.Tensor{} = t, backend), do: Nx.backend_copy(t, backend)
    defp copy_in(other, _backend), do: other

    # Every result must be a reference of its own, so that Nx.backend_transfer/1 or
    # Nx.backend_deallocate/1 on one result frees nothing another result still holds. Native
    # programs answer fresh references; the Evaluator and host nodes can hand back one tensor
    # twice (the two gradients of x + y). The repeats get a new reference to the same buffer
    # (to_device on the tensor's own device: no copy).
    defp dealias(result) do
      {result, _} =
        Composite.traverse(result, MapSet.new(), fn
          %Nx.Tensor{data: %ExBurn.Backend{ref: ref, device: device}} = t, seen when is_reference(ref) ->
            if MapSet.member?(seen, ref),
              do: {Nx.backend_copy(t, {ExBurn.Backend, device: device}), seen},
              else: {t, MapSet.put(seen, ref)}

          other, seen ->
            {other, seen}
        end)

      result
    end

    @doc false
    # Results from the program's answers, then the hooks (in lowering order) with theirs.
    def finish(template, hooks, answers) do
      {result, hooked} = fill(template, answers)

      Enum.reduce(hooks, hooked, fn {id, fun, hook_template, _count}, answers ->
        {value, rest} = fill(hook_template, answers)
        Hooks.fire(id, fun, value)
        rest
      end)

      result
    end

    @doc false
    # answers are tensor refs, or (from host nodes) tensors the program cannot hold
    def fill(template, answers) do
      Composite.traverse(template, answers, fn
        _out, [%Nx.Tensor{} = answer | rest] -> {answer, rest}
        out, [answer | rest] -> {ExBurn.Backend.Util.put(out, ExBurn.Tensor.Util.wrap({:ok, answer})), rest}
      end)
    end

    defp to_backend(%Nx.Tensor{data: %ExBurn.Backend{device: d}} = t, {_, device: d}), do: t
    defp to_backend(%Nx.Tensor{} = t, backend), do: Nx.backend_copy(t, backend)
    defp to_backend(other, _backend), do: other
  end
end
