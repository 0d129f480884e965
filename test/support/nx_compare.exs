# Loaded by test_helper.exs; defined only where Nx is present.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.NxCompare do
    @moduledoc false
    # The one comparison of ExBurn results with a reference (Nx.BinaryBackend or the Evaluator on
    # it), shared by the backend, lowering, grad and host tests.

    import ExUnit.Assertions

    alias ExBurn.Backend.Fallback

    @doc "ExUnit setup: BinaryBackend is the default backend (restored after), compiler stats zeroed."
    def binary_default(_context) do
      previous = Nx.default_backend(Nx.BinaryBackend)
      ExBurn.Defn.Compiler.reset_stats()
      ExUnit.Callbacks.on_exit(fn -> Nx.default_backend(previous) end)
      :ok
    end

    def burn(data, opts \\ []), do: Nx.tensor(data, Keyword.put(opts, :backend, ExBurn.Backend))

    def host(t), do: Nx.backend_copy(t, Nx.BinaryBackend)

    @doc """
    Asserts every tensor in `got` (any Nx container) is an ExBurn.Backend tensor with `want`'s
    shape, type and names; floats agree within `:atol`/`:rtol` (NaN equal to NaN), the rest
    exactly.
    """
    def assert_same(got, want, opts \\ []) do
      got = Nx.Defn.Composite.flatten_list([got])
      want = Nx.Defn.Composite.flatten_list([want])
      assert length(got) == length(want)
      Enum.zip_with(got, want, &assert_tensor(&1, &2, opts))
    end

    defp assert_tensor(got, want, opts) do
      assert got.data.__struct__ == ExBurn.Backend
      assert {got.shape, got.type, got.names} == {want.shape, want.type, want.names}
      got = Nx.backend_copy(got, Nx.BinaryBackend)
      want = Nx.backend_copy(want, Nx.BinaryBackend)

      if Nx.Type.float?(want.type) do
        close =
          Nx.all_close(got, want, atol: opts[:atol] || 1.0e-5, rtol: opts[:rtol] || 1.0e-5, equal_nan: true)

        assert Nx.to_number(close) == 1, "got #{inspect(got)}\nwant #{inspect(want)}"
      else
        assert got == want
      end
    end

    @doc """
    Runs `fun` on ExBurn.Backend copies of `inputs` and on BinaryBackend copies, and asserts
    the results agree. Unless `native: false`, nothing may have fallen back to BinaryBackend.
    With `jit: true` the ExBurn side runs through `Nx.Defn.jit(fun, compiler:
    ExBurn.Defn.Compiler)` instead of calling `fun` directly. Returns the ExBurn result.
    """
    def same(fun, inputs, opts \\ []) do
      burn = Enum.map(inputs, &Nx.backend_copy(&1, ExBurn.Backend))
      host = Enum.map(inputs, &Nx.backend_copy(&1, Nx.BinaryBackend))
      run = if opts[:jit], do: Nx.Defn.jit(fun, compiler: ExBurn.Defn.Compiler), else: fun
      Fallback.reset()
      got = apply(run, burn)
      counts = Fallback.counts()
      assert_same(got, apply(fun, host), opts)
      if opts[:native] != false, do: assert(counts == %{}, "fell back: #{inspect(counts)}")
      got
    end
  end
end
