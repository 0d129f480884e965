defmodule ExBurn.PublicAPIErrorsTest do
  # README: every failure is an ExBurn.Error (Nx's own ArgumentError cases aside). This calls
  # every documented public function of the core modules with a malformed first argument and
  # checks what it raises: ExBurn.Error, or ArgumentError only where Nx specifies it, never
  # FunctionClauseError, CaseClauseError, MatchError, KeyError or a crash.
  use ExUnit.Case, async: false

  @modules [
    ExBurn,
    ExBurn.Tensor,
    ExBurn.Device,
    ExBurn.Model,
    ExBurn.Embedding,
    ExBurn.LLM,
    ExBurn.JSON,
    ExBurn.Models,
    ExBurn.Env
  ]

  # Functions whose contract accepts any term (inspection helpers) or that take no subject.
  @any_term [
    {ExBurn.JSON, :encode, 1},
    {ExBurn.JSON, :encode, 2},
    {ExBurn.JSON, :encode!, 1},
    {ExBurn.JSON, :encode!, 2},
    {ExBurn.Tensor, :tensor, 1},
    {ExBurn.Tensor, :tensor, 2}
  ]

  @junk [nil, :atom, "str", {1, 2}, %{}, [1, :x], -1, 1.5, self()]

  defp documented(module) do
    {:docs_v1, _, _, _, _, _, docs} = Code.fetch_docs(module)

    for {{:function, name, arity}, _, _, doc, _} <- docs,
        doc != :hidden,
        arity > 0,
        {module, name, arity} not in @any_term,
        do: {name, arity}
  end

  defp subject_args(arity) do
    t = ExBurn.Tensor.tensor([1.0, 2.0])
    fn junk -> [junk | List.duplicate(t, arity - 1)] end
  end

  for module <- @modules do
    test "#{inspect(module)}: malformed arguments raise ExBurn.Error or return {:error, %ExBurn.Error{}}" do
      bad =
        for {name, arity} <- documented(unquote(module)),
            junk <- @junk,
            outcome = outcome(unquote(module), name, subject_args(arity).(junk)),
            outcome != :ok,
            do: {name, arity, junk, outcome}

      assert bad == [],
             "unexpected exceptions:\n" <>
               Enum.map_join(Enum.uniq_by(bad, &Tuple.delete_at(&1, 2)), "\n", &inspect/1)
    end
  end

  defp outcome(module, name, args) do
    task =
      Task.async(fn ->
        try do
          apply(module, name, args)
          :ok
        rescue
          ExBurn.Error -> :ok
          # Nx specifies ArgumentError for these, and ExBurn.Tensor follows Nx there
          e in ArgumentError -> if nx_argument?(e), do: :ok, else: {ArgumentError, Exception.message(e)}
          e -> {e.__struct__, Exception.message(e) |> String.slice(0, 120)}
        catch
          kind, value -> {kind, value}
        end
      end)

    case Task.yield(task, 10_000) || Task.shutdown(task) do
      {:ok, result} -> result
      nil -> :timeout
    end
  end

  defp nx_argument?(e), do: Exception.message(e) =~ ~r/out of bounds|shift amount|negative/
end
