defmodule ExBurn.Server.OpenAI do
  @moduledoc false
  # OpenAI-compatible routes: /v1/models, /v1/embeddings, /v1/completions and
  # /v1/chat/completions (streamed as server-sent events ending in `data: [DONE]`).
  #
  # Parameters: max_tokens / max_completion_tokens, temperature, top_p, seed, stop (string or
  # list), stream, stream_options.include_usage, and top_k (as llama.cpp's server). Parameters
  # the server cannot honour get a 400 naming them when they ask for something (n > 1,
  # logprobs, tools, non-zero penalties, logit_bias, echo, best_of > 1, suffix, a
  # response_format other than text); unknown fields are ignored, as OpenAI's own API does.

  import ExBurn.Server.Handler, only: [json: 1, error: 3, json_body: 1, sse: 1, sse_headers: 0]

  alias ExBurn.Server.{Inference, Models, Response}

  def models(config, _request, _params) do
    json(%{object: "list", data: Enum.map(Models.catalog(config), &model_object(config, &1))})
  end

  def model(config, _request, %{"id" => id}) do
    case Models.entry(config, id) do
      nil -> error(404, "the model #{inspect(id)} does not exist", param: "model", code: "model_not_found")
      entry -> json(model_object(config, entry))
    end
  end

  defp model_object(config, entry),
    do: %{id: entry.name, object: "model", created: config.started_unix, owned_by: "exburn"}

  def embeddings(config, request, _params) do
    with {:ok, body} <- json_body(request),
         {:ok, texts, _} <- Inference.texts(body, "input", config),
         {:ok, format} <- encoding_format(body),
         {:ok, served} <- Inference.model(config, body, :embedding),
         :ok <- dimensions(body, served.model),
         {:ok, vectors, tokens} <- Inference.embed(served, texts) do
      data =
        vectors
        |> Enum.with_index()
        |> Enum.map(fn {vector, i} ->
          %{
            object: "embedding",
            index: i,
            embedding: if(format == "base64", do: Inference.base64(vector), else: vector)
          }
        end)

      json(%{
        object: "list",
        data: data,
        model: served.id,
        usage: %{prompt_tokens: tokens, total_tokens: tokens}
      })
    else
      {:error, %Response{} = response} -> response
    end
  end

  defp encoding_format(body) do
    case Map.get(body, "encoding_format") do
      nil ->
        {:ok, "float"}

      f when f in ["float", "base64"] ->
        {:ok, f}

      _ ->
        {:error, error(400, "\"encoding_format\" must be \"float\" or \"base64\"", param: "encoding_format")}
    end
  end

  defp dimensions(body, model) do
    case Map.get(body, "dimensions") do
      nil ->
        :ok

      d when d == model.dim ->
        :ok

      _ ->
        {:error, error(400, "this model only gives #{model.dim} dimensions", param: "dimensions")}
    end
  end

  def completions(config, request, _params) do
    generation(config, request, %{
      unsupported: [:n, :penalties, :logit_bias, :logprobs, :echo, :best_of, :suffix],
      prompt: &completion_prompt/1,
      id_prefix: "cmpl-",
      object: "text_completion",
      chunk_object: "text_completion",
      choice: fn text, finish -> %{text: text, index: 0, logprobs: nil, finish_reason: finish} end,
      whole: fn text -> text end,
      streamed: fn text -> text end,
      ended: "",
      head: []
    })
  end

  def chat_completions(config, request, _params) do
    generation(config, request, %{
      unsupported: [:n, :penalties, :logit_bias, :chat_logprobs, :tools, :response_format],
      prompt: &Inference.messages/1,
      id_prefix: "chatcmpl-",
      object: "chat.completion",
      chunk_object: "chat.completion.chunk",
      choice: fn message, finish -> %{index: 0, message: message, logprobs: nil, finish_reason: finish} end,
      whole: fn text -> %{role: "assistant", content: text} end,
      streamed: fn text -> %{content: text} end,
      ended: %{},
      # the first chunk carries the role, as OpenAI's does
      head: [%{role: "assistant", content: ""}]
    })
  end

  # A completion or chat completion, whole or streamed; `kind` says what differs between them:
  # the parameters refused, how the prompt is read, the object names, each choice's shape (a
  # chat's choice holds a `message` whole and a `delta` when streamed) and what the text,
  # whole, streamed or ended, becomes inside it.
  defp generation(config, request, kind) do
    with {:ok, body} <- json_body(request),
         :ok <- unsupported(body, kind.unsupported),
         {:ok, prompt} <- kind.prompt.(body),
         {:ok, stream?, usage?} <- stream_flags(body),
         {:ok, served} <- Inference.model(config, body, :llm),
         {:ok, opts} <- Inference.llm_options(config, body) do
      id = kind.id_prefix <> random_id()
      created = System.os_time(:second)

      object = fn object, choices ->
        %{id: id, object: object, created: created, model: served.id, choices: choices}
      end

      if stream? do
        chunk = &object.(kind.chunk_object, &1)
        delta = fn content, finish -> kind.choice.(content, finish) |> delta() end
        head = for content <- kind.head, do: sse(chunk.([delta.(content, nil)]))
        texts = fn t -> [delta.(kind.streamed.(t), nil)] end
        final = fn f -> [delta.(kind.ended, f)] end
        stream(served, prompt, opts, request, chunk, texts, final, usage?, head)
      else
        with {:ok, result} <- Inference.generate(served, prompt, opts, request) do
          choice = kind.choice.(kind.whole.(result.text), result.finish_reason)
          json(Map.put(object.(kind.object, [choice]), :usage, Inference.usage(result.usage)))
        end
      end
    end
    |> response()
  end

  # A streamed chat choice carries its message as `delta`; a completion's choice is as is.
  defp delta(%{message: message} = choice), do: choice |> Map.delete(:message) |> Map.put(:delta, message)
  defp delta(choice), do: choice

  defp response({:error, %Response{} = response}), do: response
  defp response(%Response{} = response), do: response

  # An SSE body: `head`, a chunk per text piece, a last chunk with the finish reason, a usage
  # chunk when asked for, then `data: [DONE]`. An error after the headers went out is an event
  # with OpenAI's error object (OpenAI's clients raise it).
  defp stream(served, prompt, opts, request, chunk, text_choices, final_choices, usage?, head) do
    case Inference.start_stream(served, prompt, opts, request) do
      {:ok, events, cleanup} ->
        body =
          Stream.concat(
            head,
            Stream.map(events, fn
              {:text, text} ->
                sse(chunk.(text_choices.(text)))

              {:done, info} ->
                usage_chunk =
                  if usage?, do: [sse(Map.put(chunk.([]), :usage, Inference.usage(info.usage)))], else: []

                [sse(chunk.(final_choices.(info.finish_reason))), usage_chunk, sse("[DONE]")]

              {:error, e} ->
                %Response{body: body} = Inference.llm_error(e)
                sse(body)
            end)
          )

        %Response{status: 200, headers: sse_headers(), body: {:stream, body}, cleanup: cleanup}

      {:error, response} ->
        {:error, response}
    end
  end

  defp completion_prompt(body) do
    case Map.get(body, "prompt") do
      p when is_binary(p) ->
        {:ok, p}

      [p] when is_binary(p) ->
        {:ok, p}

      [_, _ | _] = list ->
        if Enum.all?(list, &is_binary/1),
          do: {:error, error(400, "one prompt per request is supported", param: "prompt")},
          else: {:error, error(400, "token id prompts are not supported: send text", param: "prompt")}

      nil ->
        {:error, error(400, "\"prompt\" is required", param: "prompt", code: "missing_required_parameter")}

      _ ->
        {:error, error(400, "\"prompt\" must be a string", param: "prompt")}
    end
  end

  defp stream_flags(body) do
    with {:ok, stream?} <- Inference.boolean(body, "stream") do
      case Map.get(body, "stream_options") do
        nil ->
          {:ok, stream? == true, false}

        %{} = o when is_boolean(:erlang.map_get("include_usage", o)) ->
          {:ok, stream? == true, :erlang.map_get("include_usage", o)}

        %{} = o when not is_map_key(o, "include_usage") ->
          {:ok, stream? == true, false}

        _ ->
          {:error,
           error(400, "\"stream_options\" must be an object like {\"include_usage\": true}",
             param: "stream_options"
           )}
      end
    end
  end

  # Parameters whose requested behaviour the server does not have.
  defp unsupported(body, checks) do
    Enum.find_value(checks, :ok, fn check ->
      case check(check, body) do
        :ok -> nil
        {param, why} -> {:error, error(400, why, param: param, code: "unsupported_parameter")}
      end
    end)
  end

  # one completion per request: n and best_of may only be 1
  defp check(field, body) when field in [:n, :best_of] do
    name = Atom.to_string(field)

    case Map.get(body, name) do
      n when n in [nil, 1] -> :ok
      _ -> {name, "only #{name} = 1 is supported"}
    end
  end

  defp check(:penalties, body) do
    Enum.find_value(["presence_penalty", "frequency_penalty"], :ok, fn field ->
      case Map.get(body, field) do
        p when p in [nil, 0, +0.0] -> nil
        _ -> {field, "#{field} is not supported (send 0 or leave it out)"}
      end
    end)
  end

  defp check(:logit_bias, body) do
    case Map.get(body, "logit_bias") do
      b when b in [nil, %{}] -> :ok
      _ -> {"logit_bias", "logit_bias is not supported"}
    end
  end

  defp check(:logprobs, body) do
    case Map.get(body, "logprobs") do
      nil -> :ok
      _ -> {"logprobs", "logprobs are not supported"}
    end
  end

  defp check(:chat_logprobs, body) do
    case {Map.get(body, "logprobs"), Map.get(body, "top_logprobs")} do
      {l, nil} when l in [nil, false] -> :ok
      _ -> {"logprobs", "logprobs are not supported"}
    end
  end

  defp check(:echo, body) do
    case Map.get(body, "echo") do
      e when e in [nil, false] -> :ok
      _ -> {"echo", "echo is not supported"}
    end
  end

  defp check(:suffix, body) do
    case Map.get(body, "suffix") do
      s when s in [nil, ""] -> :ok
      _ -> {"suffix", "suffix is not supported"}
    end
  end

  defp check(:tools, body) do
    cond do
      Map.get(body, "tools") not in [nil, []] -> {"tools", "tools are not supported"}
      Map.get(body, "functions") not in [nil, []] -> {"functions", "functions are not supported"}
      Map.get(body, "tool_choice") not in [nil, "none", "auto"] -> {"tool_choice", "tools are not supported"}
      true -> :ok
    end
  end

  defp check(:response_format, body) do
    case Map.get(body, "response_format") do
      f when f in [nil, %{"type" => "text"}] -> :ok
      _ -> {"response_format", "only the text response format is supported"}
    end
  end

  defp random_id, do: 12 |> :rand.bytes() |> Base.encode16(case: :lower)
end
