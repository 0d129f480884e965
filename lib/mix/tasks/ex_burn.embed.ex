defmodule Mix.Tasks.ExBurn.Embed do
  @shortdoc "Embeds text with a pre-trained sentence-embedding model"
  @moduledoc """
  Embeds each line of the input with a sentence-embedding model (see `ExBurn.Embedding`):

      mix ex_burn.embed --model all-minilm-l6-v2 --text "A cat sits on the mat."
      mix ex_burn.embed --model ~/models/embeddings/all-minilm-l6-v2 --file sentences.txt --json

  * `--model NAME|PATH` - a model name in the models directory, or a model directory (required)
  * `--text TEXT` or `--file FILE` - the input; each line is one text (a final newline does not
    add an empty text)
  * `--json` - print `{"model": name, "dim": dim, "token_ids": [[...]], "embeddings": [[...]]}`,
    one row per input line, normalised as the model's `modules.json` says
  * `--engine auto|burn|candle`, `--device DEVICE` (`cpu`, `vulkan:0`, ...), `--dir DIR`
  """
  use Mix.Task
  alias ExBurn.Pretrained.CLI

  @usage "usage: mix ex_burn.embed --model NAME|PATH (--text TEXT | --file FILE) [--json] [--engine E] [--device D] [--dir DIR]"

  @impl true
  def run(args) do
    parsed = CLI.parse!(args, CLI.load_switches() ++ [text: :string, file: :string, json: :boolean], @usage)
    texts = texts!(parsed)
    {model, opts} = CLI.load_args!(parsed, @usage)
    CLI.start!()

    model = CLI.ok!(ExBurn.Embedding.load(model, opts))
    %{embeddings: rows, token_ids: ids, dim: dim} = CLI.ok!(ExBurn.Embedding.encode(model, texts))

    if parsed[:json] do
      CLI.json!(%{model: model.name, dim: dim, token_ids: ids, embeddings: rows})
    else
      Mix.shell().info("#{model.name} (#{model.engine} on #{ExBurn.Device.format(model.device)}), dim #{dim}")

      for {text, row, row_ids} <- Enum.zip([texts, rows, ids]) do
        head = row |> Enum.take(6) |> Enum.map_join(", ", &:erlang.float_to_binary(&1, decimals: 5))
        Mix.shell().info("#{inspect(text)}\n  #{length(row_ids)} tokens: [#{head}, ...]")
      end
    end
  end

  defp texts!(parsed) do
    text =
      case {parsed[:text], parsed[:file]} do
        {nil, nil} -> Mix.raise("give --text TEXT or --file FILE\n#{@usage}")
        {text, nil} -> text
        {nil, file} -> File.read!(file)
        _ -> Mix.raise("give --text or --file, not both\n#{@usage}")
      end

    case text |> String.split(~r/\r?\n/) |> drop_final_empty() do
      [] -> Mix.raise("the input has no lines")
      lines -> lines
    end
  end

  defp drop_final_empty(lines) do
    if List.last(lines) == "", do: Enum.drop(lines, -1), else: lines
  end
end
