if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Host do
    @moduledoc false
    # Graphs with host nodes (see ExBurn.Defn.Lower): native segments and host nodes run in
    # turn. Values cross between them as the NIF's `{ref, shape, type, device}`; a host output
    # the program cannot hold (complex, f8, ...) stays an Nx tensor and only ever feeds later
    # host nodes or results.

    require Logger

    alias ExBurn.Defn.{Cache, Compiler, Plan}
    alias Nx.Defn.Composite

    def entry(key, program, template, n_params, device, opts) do
      {outputs, literal_refs, hooks} = Compiler.prepare(program, device, opts[:hooks] || %{})
      n_global = n_params + length(literal_refs)
      hosts = List.to_tuple(program.hosts)

      steps =
        program.instrs
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
            eval = Nx.Defn.Evaluator.__compile__(key, params, fn _ -> expr end, Compiler.evaluator_opts(opts))
            [{:host, eval, Enum.zip(args, Enum.map(params, &Nx.to_template/1)), outs}]
        end)

      natives = Enum.count(steps, &(elem(&1, 0) == :native))
      Cache.bump(:native)
      Cache.bump(:hosted, tuple_size(hosts))
      Cache.bump(:native_segments, natives)

      for %{op: op, reasons: reasons} <- program.hosts do
        Cache.bump({:hosted_op, op})
        Enum.each(reasons, &Cache.bump({:fallback_op, &1}))
      end

      Logger.debug(fn ->
        ops = Enum.map(program.hosts, &{&1.op, &1.reasons})

        "ExBurn.Defn.Compiler: #{inspect(key)} runs as #{natives} native segments around host nodes #{inspect(ops)}"
      end)

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
          {value, []} = Compiler.fill(template, [Map.fetch!(slots, index)])
          fn -> value end
        end)

      [result] = eval.([params])

      result
      |> then(&Composite.flatten_list([&1]))
      |> Enum.map(&slot(&1, device))
      |> then(&Enum.zip(outs, &1))
      |> Enum.into(slots)
    end

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
