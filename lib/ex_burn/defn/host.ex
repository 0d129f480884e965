if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Host do
    @moduledoc false
    # Graphs with host nodes (see ExBurn.Defn.Lower): native segments and host nodes run in
    # turn. Values cross between them as the NIF's `{ref, shape, type, device}`; a host output the program cannot hold
    # (complex, f8, ...) stays an Nx tensor and only ever feeds later host nodes or results.

    require Logger

    alias ExBurn.Defn.{Cache, Compiler, Plan}
    alias Nx.Defn.Composite

    def entry(key, program, template, n_params, device, opts) do
      %{instrs: instrs, outputs: outputs, literals: literals, hooks: hooks, hosts: hosts} = program
      overrides = opts[:hooks] || %{}
      evaluator_opts = Keyword.take(opts, [:hooks, :garbage_collect])
      n_global = n_params + length(literals)

      hooks =
        Enum.map(hooks, fn {spec, t, indices} -> {Compiler.resolve_hook(spec, overrides), t, indices} end)

      outputs = outputs ++ Enum.flat_map(hooks, &elem(&1, 2))
      hosts = List.to_tuple(hosts)

      steps =
        instrs
        |> Plan.split(outputs, n_global)
        |> Enum.flat_map(fn
          {:native, _instrs, _imports, [], _outs} ->
            []

          {:native, instrs, imports, exports, outs} ->
            n_inputs = n_global + length(imports)
            program = ExBurn.Error.unwrap!(ExBurn.Native.program_new(instrs, outs, n_inputs, device))
            [{:native, program, imports, exports}]

          {:host, id, args, outs} ->
            %{expr: expr, params: params} = elem(hosts, id)
            eval = Nx.Defn.Evaluator.__compile__(key, params, fn _ -> expr end, evaluator_opts)
            [{:host, eval, Enum.zip(args, Enum.map(params, &Nx.to_template/1)), outs}]
        end)

      Cache.bump(:native)
      Cache.bump(:hosted, tuple_size(hosts))
      Cache.bump(:native_segments, Enum.count(steps, &(elem(&1, 0) == :native)))

      for %{op: op, reasons: reasons} <- Tuple.to_list(hosts), reason <- reasons do
        Cache.bump({:fallback_op, reason})
        Cache.bump({:hosted_op, op})
      end

      Logger.debug(fn ->
        natives = Enum.count(steps, &(elem(&1, 0) == :native))
        ops = hosts |> Tuple.to_list() |> Enum.map(&{&1.op, &1.reasons})

        "ExBurn.Defn.Compiler: #{inspect(key)} runs as #{natives} native segments around host nodes #{inspect(ops)}"
      end)

      literal_refs = Enum.map(literals, &ExBurn.Backend.et(&1, device).ref)
      hooks = Enum.map(hooks, fn {fun, t, indices} -> {fun, t, length(indices)} end)
      {:staged, steps, literal_refs, {template, outputs}, hooks}
    end

    def run({:staged, steps, literal_refs, {template, outputs}, hooks}, params, device) do
      backend = {ExBurn.Backend, device: device}
      globals = Enum.map(params, fn param -> ExBurn.Backend.et(param.(), device).ref end) ++ literal_refs
      previous = Nx.default_backend(backend)

      slots =
        try do
          Enum.reduce(steps, %{}, &step(&1, &2, globals, device))
        after
          Nx.default_backend(previous)
        end

      Compiler.finish(template, hooks, Enum.map(outputs, &Map.fetch!(slots, &1)))
    end

    defp step({:native, program, imports, exports}, slots, globals, _device) do
      inputs = globals ++ Enum.map(imports, &(slots |> Map.fetch!(&1) |> elem(0)))
      answers = ExBurn.Error.unwrap!(ExBurn.Native.program_run(program, inputs))
      exports |> Enum.zip(answers) |> Enum.into(slots)
    end

    defp step({:host, eval, args, outs}, slots, _globals, device) do
      Cache.bump(:host_runs)

      params =
        Enum.map(args, fn {index, template} ->
          value = as_tensor(Map.fetch!(slots, index), template)
          fn -> value end
        end)

      [result] = eval.([params])

      result
      |> then(&Composite.flatten_list([&1]))
      |> Enum.map(&slot(&1, device))
      |> then(&Enum.zip(outs, &1))
      |> Enum.into(slots)
    end

    defp as_tensor(%Nx.Tensor{} = t, _template), do: t
    defp as_tensor(answer, template), do: ExBurn.Backend.put(template, ExBurn.Tensor.Util.wrap({:ok, answer}))

    defp slot(%Nx.Tensor{type: type} = t, device) do
      if ExBurn.Backend.native_type?(type) do
        et = ExBurn.Backend.et(t, device)
        {et.ref, et.shape, et.type, et.device}
      else
        Nx.backend_transfer(t, {ExBurn.Backend, device: device})
      end
    end
  end
end
