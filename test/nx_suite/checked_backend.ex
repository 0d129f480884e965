defmodule ExBurn.NxSuite.CheckedBackend do
  @moduledoc false
  # Runs Nx's own test suite through ExBurn.Backend (test/nx_suite/run.exs).
  #
  # Nx's tests compare results with `==` against tensors they build, which only holds when both
  # sides keep their data as plain binaries. So this backend keeps every tensor as its binary
  # (like Nx.BinaryBackend) and computes every callback on ExBurn.Backend: tensor arguments are
  # copied onto ExBurn, the callback runs there, and the result comes back as bytes. Equality in
  # Nx's assertions is then bit equality of ExBurn's results with Nx's expected values.
  @behaviour Nx.Backend
  defstruct [:state]

  alias Nx.Tensor, as: T

  # callbacks whose first argument is a tensor to compute on, not an output template
  @no_template [:backend_copy, :backend_transfer, :backend_deallocate, :to_binary, :inspect, :to_pointer]

  @impl true
  def init(opts), do: opts

  @impl true
  def to_binary(%T{data: %__MODULE__{state: bin}} = t, limit) do
    # sub-byte types (u2, s4, ...) keep a bitstring, as Nx.BinaryBackend does
    {_, bits} = t.type
    size = min(limit * bits, bit_size(bin))
    <<part::bitstring-size(size), _::bitstring>> = bin
    part
  end

  @impl true
  def inspect(%T{data: %__MODULE__{state: bin}} = t, opts), do: Nx.Backend.inspect(t, bin, opts)

  @impl true
  def backend_deallocate(_), do: :ok

  @impl true
  def backend_copy(t, __MODULE__, _opts), do: t

  def backend_copy(%T{data: %__MODULE__{state: bin}} = t, backend, opts),
    do: backend.from_binary(t, bin, opts)

  @impl true
  def backend_transfer(t, backend, opts), do: backend_copy(t, backend, opts)

  @impl true
  def to_pointer(_, _), do: raise(ArgumentError, "not supported by the checked backend")

  @impl true
  def from_pointer(_, _, _, _, _), do: raise(ArgumentError, "not supported by the checked backend")

  @impl true
  def to_batched(out, t, opts),
    do:
      on_burn(fn -> ExBurn.Backend.to_batched(out, to_burn(t), opts) |> Enum.to_list() end)
      |> Stream.map(&back/1)

  @impl true
  def block(struct, output, args, fun),
    do: back(on_burn(fn -> ExBurn.Backend.block(struct, output, to_burn(args), fun) end))

  @done [:init, :to_binary, :inspect, :backend_deallocate, :backend_copy, :backend_transfer] ++
          [:to_pointer, :from_pointer, :to_batched, :block]

  for {name, arity} <- Nx.Backend.behaviour_info(:callbacks), name not in @done do
    args = Macro.generate_arguments(arity, __MODULE__)

    @impl true
    if name in @no_template do
      def unquote(name)(unquote_splicing(args)), do: call(unquote(name), Enum.map(unquote(args), &to_burn/1))
    else
      def unquote(name)(unquote_splicing(args)) do
        [out | rest] = unquote(args)
        call(unquote(name), [out | Enum.map(rest, &to_burn/1)])
      end
    end
  end

  # ExBurn.Backend composes some callbacks from Nx calls (and `block` runs Nx's fallback function):
  # tensors those create must be ExBurn's too
  defp call(name, args), do: back(on_burn(fn -> apply(ExBurn.Backend, name, args) end))

  # (with --compiler, nested defn inside such a callback compiles with ExBurn's own compiler)
  @doc false
  def on_burn(fun) do
    previous = Nx.Defn.default_options()

    if previous[:compiler],
      do: Nx.Defn.default_options(Keyword.put(previous, :compiler, ExBurn.Defn.Compiler))

    try do
      Nx.with_default_backend(ExBurn.Backend, fun)
    after
      Nx.Defn.default_options(previous)
    end
  end

  # our tensors (anywhere in lists and tuples) onto ExBurn
  defp to_burn(%T{data: %__MODULE__{state: bin}} = t), do: ExBurn.Backend.from_binary(t, bin, [])
  defp to_burn(list) when is_list(list), do: Enum.map(list, &to_burn/1)
  defp to_burn(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> to_burn() |> List.to_tuple()
  defp to_burn(other), do: other

  # ExBurn's results back as bytes
  defp back(%T{data: %ExBurn.Backend{}} = t) do
    bin = ExBurn.Backend.to_binary(t, Nx.size(t))
    %{t | data: %__MODULE__{state: bin}}
  end

  defp back(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> Enum.map(&back/1) |> List.to_tuple()
  defp back(list) when is_list(list), do: Enum.map(list, &back/1)
  defp back(other), do: other
end
