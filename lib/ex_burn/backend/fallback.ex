if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Fallback do
    @moduledoc """
    The counted fallback of `ExBurn.Backend` to `Nx.BinaryBackend`.

    An operation that has no Burn kernel yet, or whose tensors have a type Burn cannot hold
    (complex, f8, 2/4-bit integers), runs on `Nx.BinaryBackend`: the operands are read back to the
    host, the BinaryBackend callback computes the result, and the result is transferred back (to
    Burn when its type is native, else kept as host bytes inside an `ExBurn.Backend` tensor).

    Every fallback is counted per callback name, in a process-independent `:counters` array, so
    tests and benchmarks can tell native paths from fallbacks: `counts/0`, `reset/0`.
    """

    alias Nx.Tensor, as: T
    alias ExBurn.Backend.Util

    # Every name a fallback can be counted under: the callbacks plus the Nx.Block structs that
    # fall back as a whole. Fixed at compile time so the counters need no owning process.
    @names Nx.Backend.behaviour_info(:callbacks)
           |> Enum.map(&elem(&1, 0))
           |> Enum.uniq()
           |> Kernel.++([:other])
    @index @names |> Enum.with_index(1) |> Map.new()
    @key {__MODULE__, :counters}

    defp counters do
      case :persistent_term.get(@key, nil) do
        nil ->
          # Two processes may race here; both arrays are valid and the later one wins, losing at
          # most the counts of that instant.
          ref = :counters.new(length(@names), [:write_concurrency])
          :persistent_term.put(@key, ref)
          ref

        ref ->
          ref
      end
    end

    @doc "Counts one fallback of `name`."
    def bump(name), do: :counters.add(counters(), Map.get(@index, name, @index.other), 1)

    @doc "Fallback counts since start (or `reset/0`), as a map of the non-zero ones."
    def counts do
      ref = counters()

      for {name, i} <- @index, (n = :counters.get(ref, i)) > 0, into: %{}, do: {name, n}
    end

    @doc "Sets every count back to zero."
    def reset do
      ref = counters()
      for i <- 1..length(@names), do: :counters.put(ref, i, 0)
      :ok
    end

    @doc "Runs `body` when the output type and all operands are native, else falls back."
    defmacro native(name, out, args, do: body) do
      quote do
        out = unquote(out)
        args = unquote(args)

        if ExBurn.Backend.Util.native_type?(out.type) and ExBurn.Backend.Util.native_args?(args) do
          unquote(body)
        else
          ExBurn.Backend.Fallback.run(unquote(name), out, args)
        end
      end
    end

    @doc "Runs callback `name` of `out` and `args` on `Nx.BinaryBackend` (see `call/3`)."
    def run(name, out, args) do
      out = if match?(%T{}, out), do: %{out | data: nil}, else: out
      call(name, [out | args], Util.device_of(args))
    end

    @doc """
    Runs `Nx.BinaryBackend.name(args...)` on host copies of every tensor in `args` and brings
    tensor results back onto `device`. `args` may nest tensors in lists and tuples.
    """
    def call(name, args, device) do
      bump(name)
      args = Enum.map(args, &to_host/1)
      from_host(on_host(fn -> apply(Nx.BinaryBackend, name, args) end), device)
    end

    @doc """
    Runs `fun` with `Nx.BinaryBackend` as the process's default backend: BinaryBackend's
    callbacks build helper tensors (pad values, constants, reduce accumulators) with the default
    backend and then read them as BinaryBackend tensors.
    """
    def on_host(fun) do
      previous = Nx.default_backend(Nx.BinaryBackend)

      try do
        fun.()
      after
        Nx.default_backend(previous)
      end
    end

    @doc "Host (BinaryBackend) copies of the tensors in `term`, deeply."
    def to_host(%T{data: %Nx.BinaryBackend{}} = t), do: t
    def to_host(%T{data: nil} = t), do: t

    def to_host(%T{data: %ExBurn.Backend{}} = t),
      do: %{t | data: %Nx.BinaryBackend{state: Util.to_binary(t, nil)}}

    def to_host(%T{} = t), do: Nx.backend_copy(t, Nx.BinaryBackend)
    def to_host(list) when is_list(list), do: Enum.map(list, &to_host/1)
    def to_host(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> to_host() |> List.to_tuple()
    def to_host(other), do: other

    @doc "Brings BinaryBackend tensors in `term` (deeply) onto `device`."
    def from_host(%T{data: %Nx.BinaryBackend{state: bin}} = t, device),
      do: Util.from_binary(t, bin, device)

    def from_host(list, device) when is_list(list), do: Enum.map(list, &from_host(&1, device))

    def from_host(tuple, device) when is_tuple(tuple),
      do: tuple |> Tuple.to_list() |> from_host(device) |> List.to_tuple()

    def from_host(other, _device), do: other

    # Callbacks with no Burn kernel (they take Elixir functions, or Burn lacks the op):
    # `ExBurn.Backend` delegates them here like those of its op families.
    for {name, arity} <- [reduce: 5, window_reduce: 6, triangular_solve: 4, fft: 3, ifft: 3] do
      [out | args] = Macro.generate_arguments(arity, __MODULE__)

      @doc false
      def unquote(name)(unquote(out), unquote_splicing(args)),
        do: run(unquote(name), unquote(out), unquote(args))
    end
  end
end
