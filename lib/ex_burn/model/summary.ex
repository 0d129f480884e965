defmodule ExBurn.Model.Summary do
  @moduledoc false
  # The summary map of a compiled model and its boxed text form.

  @width 60

  @doc "Builds the summary map from the native `{layer, output_shape, params}` rows."
  def build(spec, layers, total) do
    {rows, _counts} =
      Enum.map_reduce(layers, %{}, fn {layer, shape, params}, counts ->
        index = Map.get(counts, layer, 0)
        row = %{name: "#{layer}_#{index}", layer: layer, output_shape: batched(shape), params: params}
        {row, Map.put(counts, layer, index + 1)}
      end)

    # Burn's count includes batch norm's running mean and variance (per channel), which the
    # optimizer never updates.
    non_trainable =
      rows
      |> Enum.filter(&(&1.layer == :batch_norm))
      |> Enum.map(&(2 * elem(&1.output_shape, tuple_size(&1.output_shape) - 1)))
      |> Enum.sum()

    %{
      params: total,
      trainable: total - non_trainable,
      non_trainable: non_trainable,
      input_shape: batched(List.to_tuple(spec.input_shape)),
      layers: rows
    }
  end

  defp batched(shape) when is_tuple(shape), do: Tuple.insert_at(shape, 0, nil)
  defp batched(shape) when is_list(shape), do: batched(List.to_tuple(shape))

  @doc "The summary as a box of `#{@width}` columns."
  def format(summary) do
    inner = @width - 2

    rows =
      Enum.map(summary.layers, fn row ->
        line(
          String.pad_trailing(row.name, 22) <> String.pad_trailing(shape(row.output_shape), 22),
          row.params
        )
      end)

    Enum.join(
      [
        "╔" <> String.duplicate("═", inner) <> "╗",
        "║" <> center("ExBurn Model Summary", inner) <> "║",
        sep(),
        line("Layer                 Output shape", "Params")
        | rows
      ] ++
        [
          sep(),
          line("Total params:", summary.params),
          line("Trainable params:", summary.trainable),
          line("Non-trainable:", summary.non_trainable),
          line("Formatted:", human(summary.params)),
          "╚" <> String.duplicate("═", inner) <> "╝"
        ],
      "\n"
    )
  end

  defp sep, do: "╠" <> String.duplicate("═", @width - 2) <> "╣"

  defp line(label, value) do
    value = to_string(value)
    pad = max(@width - 6 - String.length(label) - String.length(value), 1)
    "║  " <> label <> String.duplicate(" ", pad) <> value <> "  ║"
  end

  defp center(text, width) do
    left = div(width - String.length(text), 2)
    String.duplicate(" ", left) <> text <> String.duplicate(" ", width - left - String.length(text))
  end

  defp shape(shape),
    do: shape |> Tuple.to_list() |> Enum.map_join(", ", &if(&1, do: &1, else: "nil")) |> then(&"{#{&1}}")

  @doc "235146 -> \"235.1K\""
  def human(n) when n >= 1_000_000, do: "#{Float.round(n / 1_000_000, 1)}M"
  def human(n) when n >= 1_000, do: "#{Float.round(n / 1_000, 1)}K"
  def human(n), do: Integer.to_string(n)
end
