# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.OpsJitTest.Source do
    @moduledoc false
    # The backend's op tests (test/ex_burn/backend/ops_test.exs), recompiled as a second module
    # with `@jit true`, so its `same/3` runs each op through `Nx.Defn.jit(fun, compiler:
    # ExBurn.Defn.Compiler)` instead of calling it directly: one list of cases, two execution
    # paths, same assertions.

    @path Path.expand("../backend/ops_test.exs", __DIR__)

    def path, do: @path

    def quoted do
      {ast, wrapped} =
        @path
        |> File.read!()
        |> Code.string_to_quoted!(file: @path)
        |> Macro.prewalk(0, fn
          {:defmodule, meta, [{:__aliases__, am, [:ExBurn, :Backend, :OpsTest]}, body]}, n ->
            {{:defmodule, meta, [{:__aliases__, am, [:ExBurn, :Defn, :OpsJitTest]}, body]}, n}

          {:@, meta, [{:jit, jm, [false]}]}, n ->
            {{:@, meta, [{:jit, jm, [true]}]}, n + 1}

          other, n ->
            {other, n}
        end)

      # the rewrite must have found the attribute, or this module silently tests nothing new
      1 = wrapped
      ast
    end
  end

  Code.eval_quoted(ExBurn.Defn.OpsJitTest.Source.quoted(), [], file: ExBurn.Defn.OpsJitTest.Source.path())
end
