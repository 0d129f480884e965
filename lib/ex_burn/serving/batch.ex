defmodule ExBurn.Serving.Batch do
  @moduledoc false
  # Runs one batch for ExBurn.Serving.Batcher, in the batch process (never in the server's loop).
  #
  # Samples are stacked along a new axis 0, run through the target, and the output is sliced
  # back into one row per sample. When the batch fails (a bad sample, a model or function
  # error), every sample is run again on its own, so only the samples that fail on their own get
  # an error: a single bad request must not fail the requests it happened to be batched with.

  alias ExBurn.{Embedding, Error, Model, Tensor}

  @doc "One `{:ok, row} | {:error, %ExBurn.Error{}}` per input, in order, and whether it fell back."
  def execute(target, [input]), do: {[run_one(target, input)], false}

  def execute(target, inputs) do
    {Enum.map(run_stacked!(target, inputs), &{:ok, &1}), false}
  rescue
    _ -> {Enum.map(inputs, &run_one(target, &1)), true}
  catch
    _, _ -> {Enum.map(inputs, &run_one(target, &1)), true}
  end

  defp run_one(target, input) do
    {:ok, hd(run_stacked!(target, [input]))}
  rescue
    e -> {:error, to_error(e)}
  catch
    kind, value -> {:error, caught(kind, value)}
  end

  # Texts and token id rows for an embedding model are one padded batch in the model itself;
  # rows come back as lists of floats. Callers that already tokenised (to count tokens) send
  # ids, so texts are tokenised here only when they come as texts.
  defp run_stacked!({:embedding, model}, samples) do
    if Enum.all?(samples, &is_binary/1),
      do: Embedding.embed!(model, samples),
      else: Embedding.embed_ids!(model, token_rows!(model, samples))
  end

  defp run_stacked!(target, inputs) do
    n = length(inputs)
    batch = Tensor.stack(inputs)
    out = call(target, batch, n)

    case out do
      %Tensor{shape: shape} when tuple_size(shape) >= 1 and elem(shape, 0) == n ->
        split(out, n)

      other ->
        raise Error,
          op: :serving,
          reason: "the model must return a tensor with one row per input",
          details: %{rows: n, got: summary(other)}
    end
  end

  # The samples as token id rows, in order; the texts among them are tokenised in one call.
  defp token_rows!(model, samples) do
    texts = for text <- samples, is_binary(text), do: text
    tokenized = if texts == [], do: [], else: bang!(Embedding.tokenize(model, texts))

    {rows, []} =
      Enum.map_reduce(samples, tokenized, fn
        {:token_ids, row}, rest -> {row, rest}
        _text, [row | rest] -> {row, rest}
      end)

    rows
  end

  defp bang!({:ok, value}), do: value
  defp bang!({:error, e}), do: raise(e)

  defp call({:model, model}, batch, n), do: Model.predict(model, batch, batch_size: n)
  defp call({:fun, fun}, batch, _n), do: fun.(batch)

  # Slices stay on the output's device (no host round trip on a GPU).
  defp split(%Tensor{shape: shape} = out, n) do
    [_ | rest] = Tuple.to_list(shape)
    starts = List.duplicate(0, length(rest))

    for i <- 0..(n - 1) do
      out |> Tensor.slice([i | starts], [1 | rest]) |> Tensor.reshape(List.to_tuple(rest))
    end
  end

  @doc "Any exception as an `ExBurn.Error` (non-ExBurn ones keep the original under `:exception`)."
  def to_error(%Error{} = e), do: e

  def to_error(e) when is_exception(e),
    do: %Error{
      op: :serving,
      reason: "the serving function raised: " <> Exception.message(e),
      details: %{exception: e}
    }

  def caught(kind, value),
    do: %Error{
      op: :serving,
      reason: "the serving function #{verb(kind)}",
      details: %{kind: kind, value: value}
    }

  defp verb(:throw), do: "threw"
  defp verb(_), do: "exited"

  defp summary(%Tensor{shape: shape}), do: %{shape: shape}
  defp summary(other), do: other
end
