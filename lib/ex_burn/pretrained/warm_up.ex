defmodule ExBurn.Pretrained.WarmUp do
  @moduledoc false
  # The warm-up rule the models, their servings and the LLM scheduler share: which batch sizes
  # a `:warmup` option asks for, and running one model call per size before traffic, timed.

  alias ExBurn.Error

  @doc """
  The batch sizes of a `:warmup` value: `false`/`nil` none, `true` the caller's `all`, or a
  list of positive integers (each at most `max`, when given). `{:ok, sizes}` or an
  `ExBurn.Error` (`details.kind` `:invalid_option`).
  """
  def sizes(op, value, all, max \\ nil)
  def sizes(_op, value, _all, _max) when value in [false, nil], do: {:ok, []}
  def sizes(_op, true, all, _max), do: {:ok, all}

  def sizes(op, sizes, _all, max) when is_list(sizes) and sizes != [] do
    if Enum.all?(sizes, &(is_integer(&1) and &1 >= 1 and (max == nil or &1 <= max))),
      do: {:ok, Enum.uniq(sizes)},
      else: invalid(op, sizes, max)
  end

  def sizes(op, other, _all, max), do: invalid(op, other, max)

  @doc "The sizes an embedder's `warmup: true` and a batcher's `:warmup` run: one sample, and a full batch."
  def embedder_sizes(batch_size), do: Enum.uniq([1, batch_size])

  @doc "Like `sizes/4`, but raises `ExBurn.Error`."
  def sizes!(op, value, all, max \\ nil) do
    case sizes(op, value, all, max) do
      {:ok, sizes} -> sizes
      {:error, error} -> raise error
    end
  end

  @doc """
  Calls `run.(n)` for each size in order (each returns `:ok` or `{:error, error}`), stopping
  at the first error: `{:ok, %{batch_sizes: sizes, ms: elapsed}}` or the error.
  """
  def run(sizes, run) do
    t0 = System.monotonic_time()

    result =
      Enum.reduce_while(sizes, :ok, fn n, :ok ->
        if (r = run.(n)) == :ok, do: {:cont, :ok}, else: {:halt, r}
      end)

    ms = System.convert_time_unit(System.monotonic_time() - t0, :native, :millisecond)
    with :ok <- result, do: {:ok, %{batch_sizes: sizes, ms: ms}}
  end

  defp invalid(op, got, max) do
    {:error,
     %Error{
       op: op,
       reason:
         "warm-up batch sizes must be true, false or a non-empty list of sizes#{if max, do: " from 1 to #{max}"}",
       details: %{kind: :invalid_option, option: :warmup, got: got}
     }}
  end
end
