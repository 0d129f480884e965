defmodule ExBurn.Server.APIErrorsTest do
  # As test/ex_burn/public_api_errors_test.exs for the core: every documented public function of
  # the server modules, given a malformed first argument, raises ExBurn.Error or returns
  # {:error, %ExBurn.Error{}} (or a lazy stream that does so when run), never another exception.
  use ExUnit.Case, async: false

  @modules [ExBurn.Server, ExBurn.LLM.Scheduler]
  @junk [nil, :atom, "str", {1, 2}, %{}, [1, :x], -1, 1.5, self()]

  defp documented(module) do
    {:docs_v1, _, _, _, _, _, docs} = Code.fetch_docs(module)
    for {{:function, name, arity}, _, _, doc, _} <- docs, doc != :hidden, arity > 0, do: {name, arity}
  end

  for module <- @modules do
    test "#{inspect(module)}: malformed arguments give ExBurn.Error" do
      bad =
        for {name, arity} <- documented(unquote(module)),
            junk <- @junk,
            # the other arguments are junk too
            args = [junk | List.duplicate({:junk}, arity - 1)],
            outcome = outcome(unquote(module), name, args),
            outcome != :ok,
            do: {name, arity, junk, outcome}

      assert bad == [],
             "unexpected:\n" <> Enum.map_join(Enum.uniq_by(bad, &Tuple.delete_at(&1, 2)), "\n", &inspect/1)
    end
  end

  defp outcome(module, name, args) do
    task =
      Task.async(fn ->
        try do
          case apply(module, name, args) do
            %Stream{} = stream -> Enum.to_list(stream)
            other -> other
          end

          :ok
        rescue
          ExBurn.Error -> :ok
          e -> {e.__struct__, Exception.message(e) |> String.slice(0, 120)}
        catch
          kind, value -> {kind, value}
        end
      end)

    case Task.yield(task, 5_000) || Task.shutdown(task) do
      {:ok, result} -> result
      nil -> :timeout
    end
  end
end
