if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.Partitions do
    @moduledoc false
    # The defn compiler named in an ExBurn serving's options. Nx.Serving asks the compiler how
    # many partitions to start (`__partitions_options__/1`, with `partitions: true`); this one
    # answers one partition per requested count, each with its own ExBurn device (round robin
    # over the serving's devices), and delegates compilation to the real compiler
    # (ExBurn.Defn.Compiler when it exists, else Nx.Defn.Evaluator).

    @keys [:exburn_compiler, :exburn_devices, :exburn_partitions, :exburn_device, :exburn_partition]

    def __partitions_options__(opts) do
      devices = Keyword.fetch!(opts, :exburn_devices)

      for i <- 0..(Keyword.fetch!(opts, :exburn_partitions) - 1) do
        Keyword.merge(opts, exburn_partition: i, exburn_device: Enum.at(devices, rem(i, length(devices))))
      end
    end

    def __to_backend__(opts), do: {ExBurn.Backend, device: device(opts)}

    def __jit__(key, vars, fun, args_list, opts),
      do: compiler(opts).__jit__(key, vars, fun, args_list, inner(opts))

    def __compile__(key, vars, fun, opts), do: compiler(opts).__compile__(key, vars, fun, inner(opts))

    @doc "The partition's device: its own, else the serving's first."
    def device(opts),
      do: opts[:exburn_device] || hd(Keyword.get(opts, :exburn_devices, [ExBurn.default_device()]))

    @doc "The real compiler and its options, without the serving's keys."
    def compiler(opts), do: Keyword.get(opts, :exburn_compiler, Nx.Defn.Evaluator)
    def inner(opts), do: Keyword.drop(opts, [:compiler | @keys])
  end
end
