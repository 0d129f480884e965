defmodule ExBurn.Pretrained.EngineChoice do
  @moduledoc false
  # Which engine an `:auto` model starts on where Burn and Candle both run on its device: the one
  # that measures faster on a short workload of the model's kind. The first load of a model file
  # on a device measures; the verdict is kept on disk (a small JSON file per model file, device and
  # library version), so later loads read it instead of loading both engines again.

  require Logger

  alias ExBurn.{Env, Error, JSON}

  @choices %{"measure" => :measure, "burn_first" => :burn_first}

  # Candle must take less than this share of Burn's time to be picked: a tie stays with Burn, the
  # chain's first link, and run-to-run noise does not flip a model between engines.
  @margin 0.9

  @doc false
  # `:measure` (the default) or `:burn_first` (Burn first, no measuring), from
  # `EXBURN_ENGINE_CHOICE` or `config :ex_burn, engine_choice: ...`.
  def setting do
    case Env.get(:engine_choice) do
      choice when choice in [:measure, :burn_first] ->
        {:ok, choice}

      name when is_binary(name) and is_map_key(@choices, name) ->
        {:ok, Map.fetch!(@choices, name)}

      other ->
        {:error,
         %Error{
           op: :load,
           reason: "unknown engine choice",
           details: %{engine_choice: other, allowed: Map.keys(@choices), kind: :invalid_option}
         }}
    end
  end

  @doc false
  # The stored verdict for `model` (its `:path` and `:device`): `{:ok, %{engine: e, ...}}` or `:none`.
  def stored(model) do
    with {:ok, text} <- File.read(file(model)),
         {:ok, %{"key" => key, "engine" => engine} = v} when engine in ["burn", "candle"] <-
           JSON.decode(text),
         true <- key == key(model) do
      {:ok,
       %{
         engine: String.to_existing_atom(engine),
         burn_ms: v["burn_ms"],
         candle_ms: v["candle_ms"],
         why: v["why"]
       }}
    else
      _ -> :none
    end
  end

  @doc false
  # Keeps `verdict` for `model`, written atomically; a cache that cannot be written is not the
  # load's failure (the next load measures again).
  def store(model, verdict) do
    path = file(model)

    data =
      verdict
      |> Map.take([:burn_ms, :candle_ms, :why])
      |> Map.merge(%{key: key(model), engine: Atom.to_string(verdict.engine)})

    with :ok <- File.mkdir_p(Path.dirname(path)),
         {:ok, json} <- JSON.encode(data) do
      ExBurn.AtomicFile.write(path, json)
    end
  end

  @doc false
  # The verdict from the two engines' times (ms): Candle where it takes under @margin of Burn's.
  def pick(burn_ms, candle_ms) do
    if candle_ms < burn_ms * @margin,
      do: %{engine: :candle, burn_ms: burn_ms, candle_ms: candle_ms, why: "Candle measured faster"},
      else: %{engine: :burn, burn_ms: burn_ms, candle_ms: candle_ms, why: "Burn measured faster or level"}
  end

  @doc false
  # Logs the choice for `model` with both times and emits it as telemetry.
  def report(model, verdict, stored) do
    ms = fn
      nil -> "-"
      t -> "#{Float.round(t / 1, 1)} ms"
    end

    Logger.info(
      "ExBurn: #{model.name} on #{inspect(model.device)} starts on #{verdict.engine |> Atom.to_string() |> String.capitalize()}: " <>
        "#{verdict.why} (the workload took #{ms.(verdict.burn_ms)} on Burn, #{ms.(verdict.candle_ms)} on Candle)" <>
        if(stored, do: "; later loads reuse this choice", else: "; the choice could not be stored")
    )

    if Code.ensure_loaded?(:telemetry) do
      apply(:telemetry, :execute, [
        [:ex_burn, :pretrained, :engine_choice],
        %{burn_ms: verdict.burn_ms, candle_ms: verdict.candle_ms},
        %{model: model.name, device: model.device, engine: verdict.engine, why: verdict.why, stored: stored}
      ])
    end
  end

  @doc false
  # The workload of each kind of model, timed: `fun(ref)` gives `{:ok, ms}` or the NIF's error. A
  # short untimed run comes first (it compiles a GPU's kernels for the shapes the timed run takes).
  def measure(kind) do
    fn ref ->
      with :ok <- workload(kind, :warm).(ref) do
        {us, result} = :timer.tc(fn -> workload(kind, :timed).(ref) end)
        if result == :ok, do: {:ok, us / 1000}, else: result
      end
    end
  end

  @sentences [
    "The quick brown fox jumps over the lazy dog.",
    "A model's first load on a device measures both engines.",
    "Rust and Elixir meet in a native library.",
    "Every answer names its operation and its reason."
  ]

  # An LLM: a prompt of about forty tokens and sixteen greedy tokens after it (prefill and
  # decode, as a chat turn mixes them; two tokens to warm up); an embedder: eight sentences; a
  # reranker: a query against four documents.
  defp workload(:llm, run) do
    tokens = if run == :warm, do: 2, else: 16

    {:ok, start} =
      ExBurn.LLM.start_args(Enum.join(@sentences, " "),
        max_tokens: tokens,
        greedy: true,
        ignore_eos: true,
        seed: 0
      )

    fn ref ->
      with {:ok, gen} <- ExBurn.Native.llm_start(ref, start.prompt, start.opts),
           {:ok, _} <- drain(gen),
           do: :ok
    end
  end

  defp workload(:embedding, _run) do
    texts = @sentences ++ @sentences

    fn ref ->
      with {:ok, _} <- ExBurn.Native.embedder_embed(ref, texts), do: :ok
    end
  end

  defp workload(:reranker, _run) do
    fn ref ->
      with {:ok, _} <- ExBurn.Native.reranker_score(ref, "Which engine is faster?", @sentences, false),
           do: :ok
    end
  end

  defp drain(gen) do
    case ExBurn.Native.llm_next(gen, 16) do
      {:ok, {:done, _, _, _}} = done -> done
      {:ok, _} -> drain(gen)
      error -> error
    end
  end

  defp file(model) do
    dir = :engine_cache |> Env.get() |> Path.expand()
    {kind, index} = model.device
    # readable, and the full key inside is what a read checks
    Path.join(
      dir,
      "#{model.path |> Path.basename() |> Path.rootname()}-#{kind}#{index}-#{:erlang.phash2(key(model))}.json"
    )
  end

  # The model file (its path, size and modification time), the device and this library's
  # version: a changed file, another device or an upgrade measures again.
  defp key(%{path: path, device: {kind, index}}) do
    stat =
      case File.stat(path, time: :posix) do
        {:ok, %{size: size, mtime: mtime}} -> "#{size}@#{mtime}"
        _ -> "missing"
      end

    "#{path}|#{stat}|#{kind}:#{index}|#{Application.spec(:ex_burn, :vsn)}"
  end
end
