if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Host do
    @moduledoc false
    # Graphs with host nodes (see ExBurn.Defn.Lower): native segments and host nodes run in
    # turn. Values cross between them as the NIF's `{ref, shape, type, device}`; a host output
    # the program cannot hold (complex, f8, ...) stays an Nx tensor and only ever feeds later
    # host nodes or results.

    require Logger

    alias ExBurn.Defn.{Cache, Compiler, Graph, Hooks, Plan}
    alias Nx.Defn.Composite

    def entry(key, program, template, device, opts) do
      overrides = opts[:hooks] || %{}
      {outputs, literal_refs, hooks} = Compiler.prepare(program, device, overrides)
      n_global = length(program.params) + length(literal_refs)

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
            [{:host, id, args, outs}]
        end)

      natives = Enum.count(steps, &(elem(&1, 0) == :native))
      Cache.bump(:native)
      Cache.bump(:hosted, length(program.hosts))
      Cache.bump(:native_segments, natives)

      for %{op: op, reasons: reasons} <- program.hosts do
        Cache.bump({:hosted_op, op})
        Enum.each(reasons, &Cache.bump({:fallback_op, &1}))
      end

      Logger.debug(fn ->
        ops = Enum.map(program.hosts, &{&1.op, &1.reasons})

        "ExBurn.Defn.Compiler: #{inspect(key)} runs as #{natives} native segments around host nodes #{inspect(ops)}"
      end)

      # Host nodes are Nx expressions, each packed on its own so the entry copies in linear
      # size. Not together: a node hosted on its own and a hosted cond's copy of it keep the
      # node's id with different operands (each made a parameter of its own host), and packing
      # shares nodes by id, so one version replaced the other and a host's parameters received
      # another host's values (the complex LU gradient: a complex matrix reached a reshape
      # expecting the s32 pivots). Hooks outside loop bodies fire once per run
      # (ExBurn.Defn.Hooks), which goes by the hook node's id across hosts.
      hosts = Enum.map(program.hosts, &Map.drop(&1, [:op, :reasons]))
      once = Hooks.once_ids(hosts)
      packed = Enum.map(hosts, &Graph.pack(&1, fn t -> Hooks.guard(t, once, overrides) end))
      eval_opts = Compiler.evaluator_opts(opts)

      {:staged, steps, {program.params, literal_refs}, {packed, eval_opts}, {template, outputs, hooks}}
    end

    def run(
          {:staged, steps, {used, literal_refs}, {packed, eval_opts}, {template, outputs, hooks}},
          params,
          device
        ) do
      backend = {ExBurn.Backend, device: device}
      globals = Compiler.param_refs(params, used, device) ++ literal_refs
      hosts = packed |> Enum.map(&Graph.unpack/1) |> List.to_tuple()

      context = %{globals: globals, hosts: hosts, params: params, eval_opts: eval_opts, device: device}

      Hooks.run(fn ->
        previous = Nx.default_backend(backend)

        slots =
          try do
            Enum.reduce(steps, %{}, &step(&1, &2, context))
          after
            Nx.default_backend(previous)
          end

        Compiler.finish(template, hooks, Enum.map(outputs, &Map.fetch!(slots, &1)))
      end)
    end

    defp step({:native, program, imports, exports}, slots, %{globals: globals}) do
      inputs = globals ++ Enum.map(imports, &(slots |> Map.fetch!(&1) |> elem(0)))
      answers = ExBurn.Error.unwrap!(ExBurn.Native.program_run(program, inputs))
      exports |> Enum.zip(answers) |> Enum.into(slots)
    end

    # a parameter the program cannot hold, read only by host nodes
    defp step({:host, id, [], [out]}, slots, %{hosts: hosts, params: params} = context)
         when is_map_key(elem(hosts, id), :param) do
      %{param: i} = elem(hosts, id)
      Map.put(slots, out, slot(Enum.at(params, i).(), context.device))
    end

    defp step({:host, id, args, outs}, slots, context) do
      Cache.bump(:host_runs)
      %{expr: expr, params: templates} = elem(context.hosts, id)
      # the Evaluator ignores its key; entries never hold jit keys (see Graph.key/1)
      eval = Nx.Defn.Evaluator.__compile__(nil, templates, fn _ -> expr end, context.eval_opts)

      params =
        Enum.zip_with(args, templates, fn index, template ->
          {value, []} = Compiler.fill(Nx.to_template(template), [Map.fetch!(slots, index)])
          fn -> value end
        end)

      [result] = eval.([params])

      result
      |> then(&Composite.flatten_list([&1]))
      |> Enum.map(&slot(&1, context.device))
      |> then(&Enum.zip(outs, &1))
      |> Enum.into(slots)
    end

    defp slot(%Nx.Tensor{type: type} = t, device) do
      if ExBurn.Backend.Util.native_type?(type) do
        et = ExBurn.Backend.Util.et(t, device)
        {et.ref, et.shape, et.type, et.device}
      else
        Nx.backend_transfer(t, {ExBurn.Backend, device: device})
      end
    end
  end
end
