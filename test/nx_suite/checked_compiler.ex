defmodule ExBurn.NxSuite.CheckedCompiler do
  @moduledoc false
  # ExBurn.Defn.Compiler for Nx's own test suite (test/nx_suite/run.exs): compiles and runs every
  # defn with ExBurn's compiler, then hands the results over as ExBurn.NxSuite.CheckedBackend
  # tensors, which is what Nx's `==` assertions compare against.
  @behaviour Nx.Defn.Compiler

  alias ExBurn.NxSuite.CheckedBackend

  @impl true
  defdelegate __partitions_options__(opts), to: ExBurn.Defn.Compiler

  @impl true
  def __to_backend__(_opts), do: {CheckedBackend, []}

  @impl true
  def __jit__(key, vars, fun, args_list, opts), do: __compile__(key, vars, fun, opts).(args_list)

  @impl true
  def __compile__(key, vars, fun, opts) do
    run = ExBurn.Defn.Compiler.__compile__(key, vars, fun, opts)

    fn args_list ->
      # inside the run (hooks, hosted nodes, nested defn) tensors are ExBurn's, as they are for a
      # user whose default backend is ExBurn.Backend
      args_list
      |> on_burn(run)
      |> Enum.map(&Nx.Defn.Composite.traverse(&1, fn t -> Nx.backend_transfer(t, CheckedBackend) end))
    end
  end

  defp on_burn(args_list, run), do: CheckedBackend.on_burn(fn -> run.(args_list) end)
end
