# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.OpsJitTest.Source do
    @moduledoc false
    # The backend's op tests (test/ex_burn/backend/ops_test.exs), recompiled as a second module
    # whose `same/3` helper runs each op through `Nx.Defn.jit(fun, compiler: ExBurn.Defn.Compiler)`
    # instead of calling it directly: one list of cases, two execution paths, same assertions.

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

          {:apply, meta, [{:fun, _, _} = fun, {:burn, _, _} = args]}, n ->
            jitted = quote(do: Nx.Defn.jit(unquote(fun), compiler: ExBurn.Defn.Compiler))
            {{:apply, meta, [jitted, args]}, n + 1}

          other, n ->
            {other, n}
        end)

      # the rewrite must have found the one call site, or this module silently tests nothing new
      1 = wrapped
      ast
    end
  end

  Code.eval_quoted(ExBurn.Defn.OpsJitTest.Source.quoted(), [], file: ExBurn.Defn.OpsJitTest.Source.path())
end
