defmodule ExBurn.Model.NotAModelTest do
  # Every public ExBurn.Model function given something that is not a model raises ExBurn.Error
  # naming the op (the README's error rule), never FunctionClauseError.
  use ExUnit.Case, async: true

  alias ExBurn.Model

  defp call(:compile, m), do: Model.compile(m)
  defp call(:fit, m), do: Model.fit(m, {[[0.0]], [0]})
  defp call(:fit_with_history, m), do: Model.fit_with_history(m, {[[0.0]], [0]})
  defp call(:evaluate, m), do: Model.evaluate(m, {[[0.0]], [0]})
  defp call(:predict, m), do: Model.predict(m, [[0.0]])
  defp call(:summary, m), do: Model.summary(m)
  defp call(:summary_string, m), do: Model.summary_string(m)
  defp call(:save!, m), do: Model.save!(m, "/nonexistent/never-written.model")
  defp call(:cancel, m), do: Model.cancel(m)
  defp call(:free, m), do: Model.free(m)

  for op <- [
        :compile,
        :fit,
        :fit_with_history,
        :evaluate,
        :predict,
        :summary,
        :summary_string,
        :save!,
        :cancel,
        :free
      ] do
    test "#{op} of a non-model" do
      for junk <- [:junk, %{}, nil, "model"] do
        error = assert_raise ExBurn.Error, fn -> call(unquote(op), junk) end
        assert is_atom(error.op)
      end
    end
  end
end
