defmodule ExBurn.Server.Api do
  @moduledoc false
  # ExBurn's own /api/v1 routes, and /metrics. Shapes (guides/server.md shows them):
  #
  #   GET  /api/v1/health         -> {"status", "uptime_s", "models_loaded", "version"}
  #   GET  /api/v1/hardware       -> {"compiled_backends", "devices", "auto", "default_device", ...}
  #   GET  /api/v1/models         -> {"models": [{"id", "kind", "format", "arch", "bytes", "loaded", ...}]}
  #   POST /api/v1/embeddings     {"model"?, "input": text | [text]}
  #                               -> {"model", "dim", "embeddings": [[float]], "usage"}
  #   POST /api/v1/llm/inference  {"model"?, "prompt" | "messages", "max_tokens", "temperature",
  #                                "top_k", "top_p", "seed", "stop", "greedy", "ignore_eos"}
  #                               -> {"model", "text", "finish_reason", "usage", "timing"}
  #   POST /api/v1/llm/stream     same request -> SSE: "event: token" {"text"}..., then
  #                               "event: done" {"finish_reason", "usage"} or "event: error"

  import ExBurn.Server.Handler, only: [json: 1, error: 3, json_body: 1, sse: 2, sse_headers: 0]

  alias ExBurn.Server.{Inference, Instance, Metrics, Models, Response}

  @version Mix.Project.config()[:version]

  def health(config, _request, _params) do
    json(%{
      status: if(Instance.draining?(config), do: "draining", else: "ok"),
      uptime_s: div(System.monotonic_time(:millisecond) - config.started_at, 1000),
      models_loaded: Models.loaded(config),
      version: @version
    })
  end

  def hardware(config, _request, _params) do
    {auto, reason} = ExBurn.Device.auto()

    devices =
      for d <- ExBurn.devices() do
        %{kind: d.kind, index: d.index, name: d.name, dtypes: Enum.map(d.dtypes, &ExBurn.Type.to_string/1)}
      end

    json(%{
      compiled_backends: ExBurn.Device.compiled_kinds(),
      devices: devices,
      auto: %{device: ExBurn.Device.format(auto), reason: reason},
      default_device: ExBurn.Device.format(ExBurn.Device.default()),
      server_device: config.load_opts[:device] && device_name(config.load_opts[:device]),
      engine: Keyword.get(config.load_opts, :engine, :auto),
      cpu: %{
        schedulers: System.schedulers_online(),
        dirty_cpu_schedulers: :erlang.system_info(:dirty_cpu_schedulers_online),
        architecture: to_string(:erlang.system_info(:system_architecture))
      },
      memory_bytes: :erlang.memory(:total),
      otp_release: to_string(:erlang.system_info(:otp_release)),
      elixir: System.version()
    })
  end

  defp device_name(spec) do
    ExBurn.Device.format(ExBurn.Device.resolve(spec))
  rescue
    _ -> inspect(spec)
  end

  def models(config, _request, _params) do
    json(%{models: Enum.map(Models.catalog(config), &describe(config, &1))})
  end

  @doc false
  def describe(config, entry) do
    base = %{
      id: entry.name,
      kind: entry.kind,
      format: entry.format,
      arch: entry.arch,
      bytes: entry.bytes,
      loaded: false
    }

    case Models.lookup(config, entry.name) do
      %{model: %ExBurn.Embedding{} = m} ->
        Map.merge(base, %{
          loaded: true,
          engine: m.engine,
          device: ExBurn.Device.format(m.device),
          dim: m.dim,
          max_seq_len: m.max_seq_len
        })

      %{model: %ExBurn.LLM{} = m} ->
        Map.merge(base, %{
          loaded: true,
          engine: m.engine,
          device: ExBurn.Device.format(m.device),
          context_length: m.context_length,
          vocab_size: m.vocab_size
        })

      nil ->
        base
    end
  end

  def embeddings(config, request, _params) do
    with {:ok, body} <- json_body(request),
         {:ok, texts, _} <- texts(body, config),
         {:ok, served} <- Inference.model(config, body, :embedding, false),
         {:ok, vectors, tokens} <- Inference.embed(served, texts) do
      json(%{
        model: served.id,
        dim: served.model.dim,
        embeddings: vectors,
        usage: %{prompt_tokens: tokens, total_tokens: tokens}
      })
    else
      {:error, %Response{} = response} -> response
    end
  end

  # "input" as OpenAI; "texts" as ExBurn.Embedding.embed/3.
  defp texts(body, config) do
    if Map.has_key?(body, "texts") and not Map.has_key?(body, "input"),
      do: Inference.texts(body, "texts", config),
      else: Inference.texts(body, "input", config)
  end

  def inference(config, request, _params) do
    t0 = System.monotonic_time(:millisecond)

    with {:ok, _body, served, prompt, opts} <- llm_request(config, request),
         {:ok, result} <- Inference.generate(served, prompt, opts, request) do
      ms = max(System.monotonic_time(:millisecond) - t0, 1)

      json(%{
        model: served.id,
        text: result.text,
        finish_reason: result.finish_reason,
        usage: Inference.usage(result.usage),
        timing: %{total_ms: ms, tokens_per_second: result.usage.completion_tokens * 1000 / ms}
      })
    else
      {:error, %Response{} = response} -> response
    end
  end

  def stream(config, request, _params) do
    with {:ok, _body, served, prompt, opts} <- llm_request(config, request),
         {:ok, events, cleanup} <- Inference.start_stream(served, prompt, opts, request) do
      chunks =
        Stream.map(events, fn
          {:text, text} ->
            sse(%{text: text}, "token")

          {:done, info} ->
            sse(
              %{model: served.id, finish_reason: info.finish_reason, usage: Inference.usage(info.usage)},
              "done"
            )

          {:error, e} ->
            %Response{body: body} = Inference.llm_error(e)
            sse(body, "error")
        end)

      %Response{status: 200, headers: sse_headers(), body: {:stream, chunks}, cleanup: cleanup}
    else
      {:error, %Response{} = response} -> response
    end
  end

  defp llm_request(config, request) do
    with {:ok, body} <- json_body(request),
         {:ok, prompt} <- prompt(body),
         {:ok, served} <- Inference.model(config, body, :llm, false),
         {:ok, opts} <- Inference.llm_options(config, body) do
      {:ok, body, served, prompt, opts}
    end
  end

  defp prompt(body) do
    case body do
      %{"prompt" => prompt} when is_binary(prompt) ->
        {:ok, prompt}

      %{"prompt" => _} ->
        {:error, error(400, "\"prompt\" must be a string", param: "prompt")}

      %{"messages" => _} ->
        Inference.messages(body)

      _ ->
        {:error, error(400, "give \"prompt\" (a string) or \"messages\" (chat messages)", param: "prompt")}
    end
  end

  def metrics(config, _request, _params) do
    %Response{
      status: 200,
      headers: [{"content-type", "text/plain; version=0.0.4"}],
      body: Metrics.render(config)
    }
  end
end
