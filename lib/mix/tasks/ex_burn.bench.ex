defmodule Mix.Tasks.ExBurn.Bench do
  @shortdoc "Runs benchmark suites and writes an HTML report plus the raw JSON"
  @moduledoc """
  Runs `ExBurn.Bench`'s suites and writes `report.html` (self-contained: inline SVG charts)
  and `results.json`:

      mix ex_burn.bench                                   # every suite
      mix ex_burn.bench embed llm --compare python        # with the Python references
      mix ex_burn.bench ops train --iterations 20 --devices cpu,vulkan:0 --out bench/report

  * suites: `embed`, `llm`, `ops`, `train` (default all)
  * `--iterations N` - timed calls per case (default 10; generation and training use a third)
  * `--devices LIST` - device specs (default the default device)
  * `--engines LIST` - `burn`, `candle` for the model suites (default both)
  * `--compare python` - run sentence-transformers, transformers and PyTorch in the same
    invocation, after ExBurn's cases
  * `--out DIR` - where the files go (default `bench/report`)
  * `--dir DIR` - the models directory

  A progress bar is drawn on stderr. The report is described in `ExBurn.Bench.Report`.
  """
  use Mix.Task
  alias ExBurn.Pretrained.CLI

  @usage "usage: mix ex_burn.bench [embed|llm|ops|train ...] [--iterations N] [--devices D1,D2] [--engines burn,candle] [--compare python] [--out DIR]"
  @switches [
    iterations: :integer,
    devices: :string,
    engines: :string,
    compare: :string,
    out: :string,
    dir: :string
  ]

  @impl true
  def run(args) do
    {parsed, suites, invalid} = OptionParser.parse(args, strict: @switches)
    if invalid != [], do: Mix.raise("#{@usage}\n(unexpected: #{inspect(invalid)})")
    suites = suites!(suites)
    CLI.start!()

    opts =
      [
        iterations: parsed[:iterations] || 10,
        devices: parsed[:devices] && String.split(parsed[:devices], ",", trim: true),
        engines: engines!(parsed[:engines]),
        compare: compare!(parsed[:compare]),
        dir: parsed[:dir],
        progress: &progress/1
      ]
      |> Enum.reject(fn {_, v} -> is_nil(v) end)

    if opts[:iterations] < 1, do: Mix.raise("--iterations must be at least 1")
    results = ExBurn.Bench.run(suites, opts)
    out = Path.expand(parsed[:out] || "bench/report")
    File.mkdir_p!(out)
    write_atomically(Path.join(out, "results.json"), ExBurn.JSON.encode!(results, pretty: true))
    write_atomically(Path.join(out, "report.html"), ExBurn.Bench.Report.html(results))

    Mix.shell().info(
      "wrote #{Path.join(out, "report.html")} and results.json (#{length(results.cases)} cases)"
    )

    for note <- results.notes, do: Mix.shell().info("note: " <> note)
  end

  defp suites!([]), do: ExBurn.Bench.suites()

  defp suites!(names) do
    known = Enum.map(ExBurn.Bench.suites(), &to_string/1)

    for name <- names do
      if name in known,
        do: String.to_existing_atom(name),
        else: Mix.raise("unknown suite #{inspect(name)}\n#{@usage}")
    end
  end

  defp engines!(nil), do: nil

  defp engines!(list) do
    for e <- String.split(list, ",", trim: true) do
      if e in ~w(burn candle),
        do: String.to_existing_atom(e),
        else: Mix.raise("unknown engine #{inspect(e)}\n#{@usage}")
    end
  end

  defp compare!(nil), do: nil
  defp compare!("python"), do: :python
  defp compare!(other), do: Mix.raise("--compare takes python, got #{inspect(other)}")

  defp progress({done, total, label}) do
    width = 30
    filled = if total > 0, do: div(done * width, total), else: width
    bar = String.duplicate("#", filled) <> String.duplicate(" ", width - filled)
    IO.write(:stderr, "\r[#{bar}] #{done}/#{total} #{String.pad_trailing(String.slice(label, 0, 40), 40)}")
    if done == total, do: IO.write(:stderr, "\n")
  end

  defp write_atomically(path, data) do
    with {:error, reason} <- ExBurn.AtomicFile.write(path, data),
         do: Mix.raise("cannot write #{path}: #{:file.format_error(reason)}")
  end
end
