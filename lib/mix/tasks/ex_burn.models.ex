defmodule Mix.Tasks.ExBurn.Models do
  @shortdoc "Lists the pre-trained models in the models directory"
  @moduledoc """
  Lists the models `ExBurn.Embedding.load/2` and `ExBurn.LLM.load/2` find by name:

      mix ex_burn.models [--dir DIR] [--json]

  * `--dir DIR` - the models directory (default: see `ExBurn.Models.dir/1`)
  * `--json` - print the list as JSON (name, kind, format, arch, bytes, path)

  `mix ex_burn.models.fetch` installs the models the test suite uses.
  """
  use Mix.Task
  alias ExBurn.Pretrained.CLI

  @usage "usage: mix ex_burn.models [--dir DIR] [--json]"

  @impl true
  def run(args) do
    parsed = CLI.parse!(args, [dir: :string, json: :boolean], @usage)
    CLI.start!()
    opts = Keyword.take(parsed, [:dir])
    models = ExBurn.Models.list(opts)

    if parsed[:json] do
      CLI.json!(models)
    else
      Mix.shell().info("models directory: #{ExBurn.Models.dir(opts)}")

      if models == [],
        do: Mix.shell().info("  (no models; mix ex_burn.models.fetch installs the test models)")

      for m <- models do
        Mix.shell().info(
          "  #{String.pad_trailing(m.name, 28)} #{String.pad_trailing(to_string(m.kind), 9)} " <>
            "#{String.pad_trailing(to_string(m.format), 11)} #{String.pad_trailing(m.arch || "?", 8)} " <>
            "#{Float.round(m.bytes / 1_048_576, 1)} MiB"
        )
      end
    end
  end
end
