defmodule ExBurn.Pretrained do
  @moduledoc """
  What `ExBurn.Embedding` and `ExBurn.LLM` share: finding a model by name or path, loading it on
  an engine, and the `:auto` engine policy.

  ## Engines

    * `:burn` - Burn on the chosen device (any device ExBurn runs on). On the CPU, Q4_0, Q4_1
      and Q8_0 GGUF weights stay quantised (decoded inside the matrix products, activations in
      f32); other types, and all weights on other devices, are dequantised to f32.
    * `:candle` - Candle on the CPU, or on a CUDA GPU where the native library was built with
      the `candle-cuda` feature (`candle_kinds/0` says which; guides/devices.md). Without
      `:device` it takes the default device when Candle runs on its kind, else the CPU; another
      device is an error. GGUF weights stay quantised.
    * `:auto` (the default) - Burn on the chosen device, then Candle on that device where Candle
      runs on it, then Candle on the CPU. Where both engines run on the device, the first load of
      a model file there measures them on a short workload of the model's kind (an LLM: a
      40-token prompt and 16 greedy tokens; an embedder: eight sentences; a reranker: a query and
      four documents), one engine loaded at a time, and starts on Candle only when it took under
      90% of Burn's time. The choice is logged (info, with both times), emitted as the telemetry
      event `[:ex_burn, :pretrained, :engine_choice]` and kept in `EXBURN_ENGINE_CACHE`
      (default `~/.cache/ex_burn/engines`, one JSON file per model file, device and library
      version), so later loads read it. `EXBURN_ENGINE_CHOICE=burn_first` (or `config :ex_burn,
      engine_choice: :burn_first`) keeps Burn first without measuring.
      When Burn cannot load the model, or a call on it fails for a reason that is not the
      caller's input, the model switches to Candle for that call and the ones after it. Every
      switch logs a warning, emits the telemetry event `[:ex_burn, :pretrained, :fallback]`
      (measurements `%{count: 1}`, metadata `%{model: name, op: op, from: :burn, to: :candle,
      reason: message}`, `from: :candle` where Candle on a GPU gives way to Candle on the CPU)
      and bumps `fallback_count/0`: never silently.
  """

  require Logger

  alias ExBurn.Error
  alias ExBurn.Pretrained.EngineChoice

  @engines [:auto, :burn, :candle]
  @load_options [:engine, :device, :dir]
  @counter_key {__MODULE__, :fallbacks}

  # Failures that another engine would meet the same way: what the caller passed, and files that
  # are missing or broken. Any other failure of Burn (an unsupported quantisation, architecture,
  # module or device, or an engine error) is what `:auto` falls back to Candle for.
  @no_fallback_kinds [
    # the caller's input
    :argument,
    :invalid_option,
    :invalid_prompt,
    :empty_input,
    :empty_prompt,
    :prompt_too_long,
    :no_chat_template,
    :chat_template_error,
    :token_out_of_range,
    # the files
    :not_found,
    :model_not_found,
    :ambiguous_model,
    :missing_file,
    :io_error,
    :corrupt_safetensors,
    :truncated_file,
    :not_gguf,
    :corrupt_gguf,
    :bad_config,
    :bad_registry,
    :bad_tokenizer
  ]

  @doc "The device kinds the Candle engine runs on in this native library (`:cpu` always)."
  @spec candle_kinds() :: [atom]
  def candle_kinds, do: ExBurn.Error.unwrap!(ExBurn.Native.candle_kinds())

  @doc "How many times an `:auto` model has fallen back from Burn to Candle in this VM."
  @spec fallback_count() :: non_neg_integer
  def fallback_count, do: :counters.get(counter(), 1)

  @doc false
  # Loads `name_or_path` (of `kind`, :embedding, :llm or :reranker) with `load_nif`, a NIF taking the path
  # and `%{engine: :burn | :candle, device: device}`; returns a map with the resource and what
  # the struct records about the engine.
  def load(kind, name_or_path, opts, load_nif, measure \\ nil) do
    with :ok <- keyword(opts),
         :ok <- known_options(:load, opts, @load_options),
         {:ok, engine} <- engine(opts),
         {:ok, device} <- device(opts, engine),
         {:ok, path, name} <- resolve(kind, name_or_path, opts) do
      model = %{path: path, name: name, device: device, auto: engine == :auto}

      if engine == :auto,
        do: load_auto(model, load_nif, measure || EngineChoice.measure(kind)),
        else: load_on(model, engine, device, load_nif)
    end
  end

  defp load_on(model, engine, device, load_nif) do
    with {:ok, ref} <- wrap(load_nif.(model.path, %{engine: engine, device: device})),
         do: {:ok, Map.merge(model, %{ref: ref, engine: engine, device: device})}
  end

  # Where both engines run on the model's device and are measured (`EngineChoice`), the stored
  # verdict picks the first engine, or both are measured now; elsewhere Burn comes first.
  defp load_auto(model, load_nif, measure) do
    with {:ok, choice} <- EngineChoice.setting() do
      case choice == :measure and both_run?(model.device) and EngineChoice.stored(model) do
        {:ok, %{engine: :candle}} -> candle_first(model, load_nif)
        :none -> measured(model, load_nif, measure)
        _burn_or_not_measured -> burn_first(model, load_nif)
      end
    end
  end

  # Both engines are built for the device's kind (a library holds one CUDA engine, guides/devices.md).
  defp both_run?({kind, _} = device),
    do: candle_device(device) == device and kind in ExBurn.Device.compiled_kinds()

  # The chain: Burn on the device, then Candle on it where it runs there, then Candle on the CPU.
  defp burn_first(model, load_nif),
    do: after_burn(model, load_nif.(model.path, %{engine: :burn, device: model.device}), load_nif)

  defp after_burn(model, burn, load_nif) do
    case burn do
      {:ok, ref} ->
        {:ok, Map.merge(model, %{ref: ref, engine: :burn})}

      {:error, {op, reason, details} = err} ->
        if no_fallback?(details) do
          wrap({:error, err})
        else
          record_fallback(model.name, op, reason)

          with {:ok, ref, device} <- load_candle(model.name, model.path, model.device, load_nif),
               do: {:ok, Map.merge(model, %{ref: ref, engine: :candle, device: device})}
        end
    end
  end

  # A verdict for Candle: Candle on the device, and the usual chain if it no longer loads.
  defp candle_first(model, load_nif) do
    case load_nif.(model.path, %{engine: :candle, device: model.device}) do
      {:ok, ref} ->
        {:ok, Map.merge(model, %{ref: ref, engine: :candle})}

      {:error, {_op, _reason, details} = err} ->
        if no_fallback?(details), do: wrap({:error, err}), else: burn_first(model, load_nif)
    end
  end

  # Both engines timed on the kind's workload, one loaded at a time: Candle in a process of its
  # own (its model is freed when that process ends), then Burn, kept unless Candle wins.
  defp measured(model, load_nif, measure) do
    candle =
      Task.async(fn ->
        with {:ok, ref} <- load_nif.(model.path, %{engine: :candle, device: model.device}), do: measure.(ref)
      end)
      |> Task.await(:infinity)

    case {candle, load_nif.(model.path, %{engine: :burn, device: model.device})} do
      {{:ok, candle_ms}, {:ok, ref}} ->
        case measure.(ref) do
          {:ok, burn_ms} ->
            choose(model, EngineChoice.pick(burn_ms, candle_ms), ref, load_nif)

          {:error, {_, reason, _}} ->
            choose(
              model,
              %{
                engine: :candle,
                burn_ms: nil,
                candle_ms: candle_ms,
                why: "Burn failed the workload: #{reason}"
              },
              ref,
              load_nif
            )
        end

      {{:error, {_, reason, _}}, {:ok, ref}} ->
        choose(
          model,
          %{engine: :burn, burn_ms: nil, candle_ms: nil, why: "Candle could not run it: #{reason}"},
          ref,
          load_nif
        )

      {_, burn_failed} ->
        after_burn(model, burn_failed, load_nif)
    end
  end

  defp choose(model, verdict, burn_ref, load_nif) do
    stored = EngineChoice.store(model, verdict) == :ok
    EngineChoice.report(model, verdict, stored)

    if verdict.engine == :burn do
      {:ok, Map.merge(model, %{ref: burn_ref, engine: :burn})}
    else
      # Burn's model is garbage from here: collected before Candle's loads, not beside it
      :erlang.garbage_collect()
      candle_first(model, load_nif)
    end
  end

  @doc false
  # `load/4`, then the model's facts from `info_nif` (a NIF taking the resource), as a `module`
  # struct: the facade modules' `load/2`.
  def load_struct(module, kind, name_or_path, opts, load_nif, info_nif) do
    with {:ok, m} <- load(kind, name_or_path, opts, load_nif),
         {:ok, info} <- wrap(info_nif.(m.ref)),
         do: {:ok, struct(module, Map.merge(info, m))}
  end

  # Candle on `device` where it runs there, else (or when that load fails for a reason other
  # than the files) on the CPU: the chain's last links.
  defp load_candle(name, path, device, load_nif) do
    case candle_device(device) do
      {:cpu, 0} = cpu ->
        with {:ok, ref} <- wrap(load_nif.(path, %{engine: :candle, device: cpu})), do: {:ok, ref, cpu}

      gpu ->
        case load_nif.(path, %{engine: :candle, device: gpu}) do
          {:ok, ref} ->
            {:ok, ref, gpu}

          {:error, {op, reason, details} = err} ->
            if no_fallback?(details) do
              wrap({:error, err})
            else
              record_fallback(name, op, reason, gpu)
              load_candle(name, path, {:cpu, 0}, load_nif)
            end
        end
    end
  end

  defp candle_device({kind, _} = device) do
    if kind in candle_kinds(), do: device, else: {:cpu, 0}
  end

  @doc false
  # Runs `fun.(ref)` (a NIF answer) on the model's engine. An `:auto` model on Burn whose call
  # fails for a reason other than the input switches to Candle (loaded then, once per model) and
  # retries; `{:ok, value, model}` hands back the model, switched or not.
  def call(%{auto: true, engine: :burn} = model, op, load_nif, fun) do
    case :persistent_term.get(candle_key(model), nil) do
      nil -> call_on(model, op, load_nif, fun)
      {candle, device} -> call_on(%{model | ref: candle, engine: :candle, device: device}, op, load_nif, fun)
    end
  end

  def call(model, op, load_nif, fun), do: call_on(model, op, load_nif, fun)

  defp call_on(%{ref: ref} = model, op, load_nif, fun) do
    case fun.(ref) do
      {:ok, value} ->
        {:ok, value, model}

      {:error, {_op, reason, details} = err} ->
        if model.auto and model.engine == :burn and not no_fallback?(details) do
          record_fallback(model.name, op, reason)

          with {:ok, {candle, device}} <- candle_ref(model, load_nif),
               model = %{model | ref: candle, engine: :candle, device: device},
               {:ok, value} <- wrap(fun.(candle)) do
            {:ok, value, model}
          end
        else
          wrap({:error, err})
        end
    end
  end

  @doc false
  def wrap({:ok, _} = ok), do: ok
  def wrap({:error, {op, reason, details}}), do: {:error, %Error{op: op, reason: reason, details: details}}

  @doc false
  def error(op, reason, details), do: {:error, %Error{op: op, reason: reason, details: details}}

  @doc false
  # The answer to a call whose model argument is not a loaded `struct` model.
  def not_a_model(op, struct, got) do
    error(op, "expected #{inspect(struct)} (from #{inspect(struct)}.load/2)", %{got: got, kind: :argument})
  end

  defp keyword(opts) do
    if Keyword.keyword?(opts),
      do: :ok,
      else: error(:load, "options must be a keyword list", %{got: opts, kind: :invalid_option})
  end

  @doc false
  # `:ok` when every key of the keyword list `opts` is in `allowed`, else an error naming the
  # first other one: an option is never silently ignored.
  def known_options(op, opts, allowed) do
    case Enum.reject(Keyword.keys(opts), &(&1 in allowed)) do
      [] ->
        :ok

      [key | _] = unknown ->
        error(op, "unknown option #{inspect(key)}", %{
          option: key,
          unknown: unknown,
          allowed: allowed,
          kind: :invalid_option
        })
    end
  end

  defp no_fallback?(%{kind: kind}), do: kind in @no_fallback_kinds
  defp no_fallback?(%{argument: _}), do: true
  defp no_fallback?(_), do: false

  # The Candle twin of an `:auto` model, loaded on its first fallback and kept for the model's
  # path (models are long-lived; a second load would double the memory).
  defp candle_ref(model, load_nif) do
    key = candle_key(model)

    case :persistent_term.get(key, nil) do
      nil ->
        with {:ok, ref, device} <- load_candle(model.name, model.path, model.device, load_nif) do
          :persistent_term.put(key, {ref, device})
          {:ok, {ref, device}}
        end

      twin ->
        {:ok, twin}
    end
  end

  defp candle_key(model), do: {__MODULE__, :candle, model.path}

  defp record_fallback(name, op, reason, candle_on \\ nil) do
    Logger.warning(
      case candle_on do
        nil ->
          "ExBurn: #{name}: #{op} failed on Burn (#{reason}); falling back to Candle"

        device ->
          "ExBurn: #{name}: #{op} failed on Candle on #{inspect(device)} (#{reason}); falling back to Candle on the CPU"
      end
    )

    :counters.add(counter(), 1, 1)

    if Code.ensure_loaded?(:telemetry) do
      apply(:telemetry, :execute, [
        [:ex_burn, :pretrained, :fallback],
        %{count: 1},
        %{model: name, op: op, from: if(candle_on, do: :candle, else: :burn), to: :candle, reason: reason}
      ])
    end
  end

  defp counter do
    case :persistent_term.get(@counter_key, nil) do
      nil ->
        ref = :counters.new(1, [:atomics])
        # Two processes may race here; both refs count, the stored one wins for reads.
        :persistent_term.put(@counter_key, ref)
        :persistent_term.get(@counter_key)

      ref ->
        ref
    end
  end

  defp engine(opts) do
    case Keyword.get(opts, :engine, :auto) do
      e when e in @engines -> {:ok, e}
      e when is_binary(e) and e in ~w(auto burn candle) -> {:ok, String.to_existing_atom(e)}
      other -> error(:load, "unknown engine", %{engine: other, allowed: @engines, kind: :invalid_option})
    end
  end

  # Without an explicit :device Candle takes the default device where it runs on its kind, else
  # the CPU; an explicit device it does not run on is the load's error.
  defp device(opts, :candle) do
    if Keyword.has_key?(opts, :device),
      do: device(opts, :burn),
      else: {:ok, candle_device(ExBurn.Device.resolve(ExBurn.Device.default()))}
  end

  defp device(opts, _engine) do
    {:ok, ExBurn.Device.resolve(Keyword.get(opts, :device, ExBurn.Device.default()))}
  rescue
    e in Error -> {:error, e}
  end

  @doc false
  # An existing file or directory is taken as the model; anything else is a name looked up in
  # the models directory (`ExBurn.Models`), among the models of `kind`.
  def resolve(kind, name_or_path, opts) when is_binary(name_or_path) do
    if File.exists?(name_or_path) do
      {:ok, Path.expand(name_or_path),
       name_or_path |> Path.expand() |> Path.rootname(".gguf") |> Path.basename()}
    else
      dir = ExBurn.Models.dir(opts)

      case Enum.find(ExBurn.Models.list(dir: dir), &(&1.name == name_or_path and &1.kind == kind)) do
        %{path: path} ->
          {:ok, path, name_or_path}

        nil ->
          error(:load, "no #{kind} model named #{inspect(name_or_path)}", %{
            name: name_or_path,
            models_dir: dir,
            available: for(m <- ExBurn.Models.list(dir: dir), m.kind == kind, do: m.name),
            kind: :not_found
          })
      end
    end
  end

  def resolve(_kind, other, _opts),
    do: error(:load, "a model is named by a string (a name or a path)", %{got: other, kind: :argument})
end
