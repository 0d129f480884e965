if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.Nx do
    @moduledoc false
    # ExBurn.Serving's Nx.Serving path (compiled only with Nx). Each partition gets its own batch
    # function bound to its device: a function is jitted with the real compiler and fed the
    # batch on ExBurn.Backend; a model gets its own copy on that device, so partitions never
    # queue on one model's lock.

    alias ExBurn.{Error, Model}
    alias ExBurn.Serving.Partitions
    alias ExBurn.Tensor, as: ET

    @build_options [:batch_size, :batch_timeout, :partitions, :device]

    def build(target, opts) do
      opts = ExBurn.Tensor.Util.opts!(:serving, opts, @build_options)
      target = target!(target)
      devices = devices!(Keyword.get(opts, :device))
      partitions = ExBurn.Tensor.Util.int_option!(:serving, opts, :partitions, length(devices))
      batch_size = ExBurn.Tensor.Util.int_option!(:serving, opts, :batch_size, 32)
      batch_timeout = Keyword.get(opts, :batch_timeout, 10)

      unless is_integer(batch_timeout) and batch_timeout >= 0,
        do:
          fail!(":batch_timeout must be a non-negative integer", %{option: :batch_timeout, got: batch_timeout})

      defn_options = [
        compiler: Partitions,
        exburn_compiler: inner_compiler(),
        exburn_devices: devices,
        exburn_partitions: partitions
      ]

      Nx.Serving.new(fn partition_opts -> batch_fun(target, partition_opts) end, defn_options)
      |> Nx.Serving.batch_size(batch_size)
      |> Nx.Serving.process_options(batch_size: batch_size, batch_timeout: batch_timeout, partitions: true)
      |> Nx.Serving.client_preprocessing(&preprocess/1)
      |> Nx.Serving.client_postprocessing(&postprocess/2)
      # Replies to another node cannot carry NIF resources: copy them to the host first.
      |> Nx.Serving.distributed_postprocessing(&Nx.backend_copy(&1, Nx.BinaryBackend))
    end

    # ExBurn.Defn.Compiler is another engineer's work in progress; use it once it exists.
    def inner_compiler do
      if Code.ensure_loaded?(ExBurn.Defn.Compiler), do: ExBurn.Defn.Compiler, else: Nx.Defn.Evaluator
    end

    def run(%Nx.Serving{} = serving, input), do: Nx.Serving.run(serving, input)

    def batched_run(name, input),
      do: Nx.Serving.batched_run(name, input, &Nx.backend_copy(&1, Nx.BinaryBackend))

    def supervise(%Nx.Serving{} = serving, opts) do
      {name, opts} = Keyword.pop(opts, :name)
      {supervisor, opts} = Keyword.pop(opts, :supervisor)
      unless is_atom(name) and name != nil, do: fail!(":name must be an atom", %{option: :name, got: name})

      spec =
        {Nx.Serving,
         [serving: serving, name: name] ++
           Keyword.take(opts, [:batch_size, :batch_timeout, :partitions, :shutdown])}

      if supervisor,
        do: DynamicSupervisor.start_child(supervisor, spec),
        else: Nx.Serving.start_link(elem(spec, 1))
    end

    def supervise(target, opts) do
      {build_opts, opts} = Keyword.split(opts, @build_options)
      supervise(build(target, build_opts), opts)
    end

    ## Partitions

    defp batch_fun({:model, model}, opts) do
      device = Partitions.device(opts)
      model = model_on(model, device, Keyword.get(opts, :exburn_partition, 0))

      fn batch ->
        x = batch_tensor(batch)
        x = ExBurn.Backend.Util.et(x, device)
        out = Model.predict(model, x, batch_size: max(elem(x.shape, 0), 1))
        to_nx(out)
      end
    end

    defp batch_fun({:fun, fun}, opts) do
      device = Partitions.device(opts)
      jitted = Nx.Defn.jit(fun, [compiler: Partitions.compiler(opts)] ++ Partitions.inner(opts))

      fn batch ->
        batch |> batch_tensor() |> Nx.backend_transfer({ExBurn.Backend, device: device}) |> jitted.()
      end
    end

    # Partition 0 on the model's own device serves the model itself; every other partition
    # gets a private copy (save/load through a temporary file) on its device.
    defp model_on(%Model{device: device} = model, device, 0), do: model

    defp model_on(model, device, partition) do
      path =
        Path.join(
          System.tmp_dir!(),
          "ex_burn_serving_#{System.unique_integer([:positive])}_#{partition}.model"
        )

      try do
        Model.save!(model, path)
        Model.load!(path, device: device)
      after
        File.rm(path)
      end
    end

    # The batch's stacked inputs (Nx.Batch is a lazy container of one template).
    defp batch_tensor(%Nx.Batch{} = batch) do
      {tensor, _} = Nx.LazyContainer.traverse(batch, nil, fn _template, fun, acc -> {fun.(), acc} end)
      tensor
    end

    defp to_nx(%ET{} = et), do: ExBurn.Backend.Util.put(Nx.template(et.shape, et.type), et)

    ## Client side

    defp preprocess(%Nx.Batch{} = batch), do: {batch, :batch}
    defp preprocess(input), do: {Nx.Batch.stack([sample(input)]), :single}

    defp sample(%Nx.Tensor{} = t), do: t
    defp sample(%ET{} = et), do: to_nx(et)
    defp sample(data) when is_number(data) or is_list(data), do: Nx.tensor(data)
    defp sample(other), do: fail!("cannot use this as a sample", %{got: other})

    defp postprocess({output, _metadata}, :batch), do: output

    defp postprocess({output, _metadata}, :single),
      do: Nx.Defn.Composite.traverse(output, &Nx.squeeze(&1, axes: [0]))

    ## Options

    defp target!(%Model{} = model), do: {:model, model}
    defp target!(fun) when is_function(fun, 1), do: {:fun, fun}
    defp target!(other), do: fail!("expected an ExBurn.Model or a one-argument function", %{got: other})

    defp devices!(nil), do: [ExBurn.default_device()]
    defp devices!([]), do: fail!(":device must not be an empty list", %{option: :device})
    defp devices!(list) when is_list(list), do: Enum.map(list, &ExBurn.Tensor.Util.device!(:serving, &1))
    defp devices!(device), do: [ExBurn.Tensor.Util.device!(:serving, device)]

    defp fail!(reason, details), do: raise(Error, op: :serving, reason: reason, details: details)
  end
end
