defmodule ExBurn.Pretrained.CLI do
  @moduledoc false
  # What `mix ex_burn.models`, `mix ex_burn.embed` and `mix ex_burn.llm` share: starting the
  # native library, the load options (--model, --dir, --engine, --device) and usage errors.

  @load_switches [model: :string, dir: :string, engine: :string, device: :string]

  def load_switches, do: @load_switches

  def start! do
    Mix.Task.run("app.config")
    Mix.Task.run("loadpaths")
    Application.ensure_all_started(:logger)
    # Logs go to stderr, so stdout is exactly the task's output (--json pipes into other tools).
    Logger.configure_backend(:console, device: :standard_error)

    unless ExBurn.Native.loaded?() do
      Mix.raise("the ExBurn native library is not loaded: #{inspect(ExBurn.Native.load_status())}")
    end
  end

  @doc "Parses `args` strictly; any unknown switch or stray argument raises with `usage`."
  def parse!(args, switches, usage) do
    case OptionParser.parse(args, strict: switches) do
      {parsed, [], []} ->
        parsed

      {_, rest, invalid} ->
        Mix.raise("#{usage}\n(unexpected: #{inspect(rest ++ Enum.map(invalid, &elem(&1, 0)))})")
    end
  end

  @doc "The model name or path and the keyword options `load/2` takes."
  def load_args!(parsed, usage) do
    model = parsed[:model] || Mix.raise("--model NAME|PATH is required\n#{usage}")

    opts =
      [dir: parsed[:dir], engine: parsed[:engine] && engine!(parsed[:engine]), device: parsed[:device]]
      |> Enum.reject(fn {_, v} -> is_nil(v) end)

    {model, opts}
  end

  defp engine!(e) when e in ~w(auto burn candle), do: String.to_atom(e)
  defp engine!(e), do: Mix.raise("--engine must be auto, burn or candle, got #{inspect(e)}")

  def ok!({:ok, value}), do: value
  def ok!({:error, %ExBurn.Error{} = e}), do: Mix.raise(Exception.message(e))

  def json!(value), do: Mix.shell().info(ExBurn.JSON.encode!(value))
end
