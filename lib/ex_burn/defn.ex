if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn do
    @moduledoc """
    Shortcuts for running `defn` code with `ExBurn.Defn.Compiler` (see `guides/compiler.md`).
    """

    @doc "`Nx.Defn.jit/2` with `compiler: ExBurn.Defn.Compiler` (other options pass through)."
    def jit(fun, opts \\ []), do: Nx.Defn.jit(fun, Keyword.put(opts, :compiler, ExBurn.Defn.Compiler))

    @doc "`Nx.Defn.jit_apply/3` with `compiler: ExBurn.Defn.Compiler`."
    def jit_apply(fun, args, opts \\ []),
      do: Nx.Defn.jit_apply(fun, args, Keyword.put(opts, :compiler, ExBurn.Defn.Compiler))
  end
end
