defmodule ExBurn.Server.Inference do
  @moduledoc false
  # What the /api/v1 and the OpenAI routes share: picking the model, checking inputs and
  # generation parameters, embedding through the model's ExBurn.Serving.Batcher and generating
  # through its ExBurn.LLM.Scheduler. Failures come back as `{:error, %ExBurn.Server.Response{}}`.

  import ExBurn.Server.Handler, only: [error: 2, error: 3]

  alias ExBurn.Error
  alias ExBurn.Server.Models

  @embed_timeout 120_000

  ## Models

  @doc """
  The served model a request names (`"model"`), loading it if needed. Without a name, the only
  model of `kind` is taken when there is exactly one and `required?` is false.
  """
  def model(config, body, kind, required? \\ true) do
    case Map.get(body, "model") do
      id when is_binary(id) and id != "" ->
        case Models.entry(config, id) do
          nil ->
            {:error,
             error(404, "the model #{inspect(id)} does not exist", param: "model", code: "model_not_found")}

          %{kind: ^kind} = entry ->
            serve(config, entry)

          %{kind: other} ->
            {:error,
             error(
               400,
               "the model #{inspect(id)} is an #{kind_name(other)} model, not an #{kind_name(kind)} model",
               param: "model",
               code: "wrong_model_kind"
             )}
        end

      nil when not required? ->
        case Enum.filter(Models.catalog(config), &(&1.kind == kind)) do
          [entry] ->
            serve(config, entry)

          [] ->
            {:error,
             error(404, "no #{kind_name(kind)} model is installed", param: "model", code: "model_not_found")}

          _ ->
            {:error,
             error(400, "several #{kind_name(kind)} models are installed: name one in \"model\"",
               param: "model"
             )}
        end

      nil ->
        {:error, error(400, "\"model\" is required", param: "model", code: "missing_required_parameter")}

      _ ->
        {:error, error(400, "\"model\" must be a string", param: "model")}
    end
  end

  defp serve(config, entry) do
    case Models.ensure(config, entry) do
      {:ok, served} ->
        {:ok, Map.merge(served, %{id: entry.name, config: config, entry: entry})}

      {:error, e} ->
        {:error,
         error(500, "the model #{entry.name} could not be loaded: #{Exception.message(e)}",
           type: "server_error",
           code: "model_load_failed"
         )}
    end
  end

  defp kind_name(:llm), do: "LLM"
  defp kind_name(:embedding), do: "embedding"
  defp kind_name(:reranker), do: "reranker"

  # Runs `fun` on the served model; if its process died in between (a crash being restarted
  # by the supervisor), once more on the restarted one.
  defp retrying(served, fun) do
    case fun.(served) do
      {:error, %Error{details: %{cause: :down}}} = error ->
        case Models.ensure(served.config, served.entry) do
          {:ok, again} -> fun.(Map.merge(served, again))
          _ -> error
        end

      other ->
        other
    end
  end

  ## Embeddings

  @doc "The texts of an embeddings request's `field`: a string or a non-empty list of strings."
  def texts(body, field, config) do
    case Map.get(body, field) do
      text when is_binary(text) ->
        {:ok, [text], :single}

      [_ | _] = list ->
        cond do
          not Enum.all?(list, &is_binary/1) ->
            if Enum.all?(list, &(is_integer(&1) or is_list(&1))),
              do: {:error, error(400, "token id inputs are not supported: send text", param: field)},
              else: {:error, error(400, "\"#{field}\" must be a string or a list of strings", param: field)}

          length(list) > config.max_inputs ->
            {:error, error(400, "at most #{config.max_inputs} inputs per request", param: field)}

          true ->
            {:ok, list, :list}
        end

      [] ->
        {:error, error(400, "\"#{field}\" must not be empty", param: field)}

      nil ->
        {:error, error(400, "\"#{field}\" is required", param: field, code: "missing_required_parameter")}

      _ ->
        {:error, error(400, "\"#{field}\" must be a string or a list of strings", param: field)}
    end
  end

  @doc """
  Embeds `texts` through the model's batching server: `{:ok, vectors, prompt_tokens}` or
  `{:error, response}`. Each text is tokenised once, here (its token count is the usage), and
  goes to the batcher as its token ids; the texts are one request there, sharing batches with
  concurrent clients.
  """
  def embed(served, texts) do
    with {:ok, ids} <- ExBurn.Embedding.tokenize(served.model, texts),
         rows = Enum.map(ids, &{:token_ids, &1}),
         {:ok, vectors} <- retrying(served, &ExBurn.Serving.Batcher.run_many(&1.server, rows, @embed_timeout)) do
      {:ok, vectors, ids |> Enum.map(&length/1) |> Enum.sum()}
    else
      {:error, e} -> {:error, serving_error(e)}
    end
  end

  @doc """
  Scores `documents` for `query` with a served reranker: `{:ok, scores, tokens}` (the token count
  of all pairs) or `{:error, response}`. Scoring runs in the request's process: reranker models
  are shared read-only, so concurrent requests score at once.
  """
  def rerank(served, query, documents) do
    case ExBurn.Rerank.run(served.model, query, documents, []) do
      {:ok, %{scores: scores, tokens: tokens}} -> {:ok, scores, tokens}
      {:error, e} -> {:error, serving_error(e)}
    end
  end

  defp serving_error(%Error{details: %{cause: :overloaded}} = e),
    do:
      error(503, Exception.message(e),
        type: "server_error",
        code: "overloaded",
        headers: [{"retry-after", "1"}]
      )

  defp serving_error(%Error{details: %{kind: kind}} = e)
       when kind in [:argument, :empty_input, :invalid_option],
       do: error(400, e.reason)

  defp serving_error(e), do: error(500, Exception.message(e), type: "server_error")

  @doc "Little-endian float32 bytes of a vector, base64: OpenAI's `encoding_format: \"base64\"`."
  def base64(vector),
    do: vector |> Enum.map(&<<&1::float-32-little>>) |> IO.iodata_to_binary() |> Base.encode64()

  ## Generation parameters

  @doc """
  ExBurn.LLM options from a request's parameters: `max_tokens` (or `max_completion_tokens`),
  `temperature`, `top_p`, `top_k`, `seed`, `stop`, `greedy`, `ignore_eos`.
  """
  def llm_options(config, body) do
    with {:ok, max_tokens} <- max_tokens(body, config),
         {:ok, temperature} <- number(body, "temperature", 0, 2),
         {:ok, top_p} <- number(body, "top_p", 0, 1),
         {:ok, top_k} <- integer(body, "top_k", 0, 1_000_000),
         {:ok, seed} <- integer(body, "seed", -9_223_372_036_854_775_808, 18_446_744_073_709_551_615),
         {:ok, stop} <- stop(body),
         {:ok, greedy} <- boolean(body, "greedy"),
         {:ok, ignore_eos} <- boolean(body, "ignore_eos") do
      greedy? = greedy == true or temperature == 0 or top_p == 0

      opts =
        [max_tokens: max_tokens, stop: stop]
        |> put_if(greedy?, :greedy, true)
        |> put_if(not greedy? and temperature != nil, :temperature, temperature)
        |> put_if(not greedy? and top_p != nil, :top_p, top_p)
        |> put_if(top_k != nil, :top_k, if(top_k == 0, do: nil, else: top_k))
        |> put_if(seed != nil, :seed, seed)
        |> put_if(ignore_eos != nil, :ignore_eos, ignore_eos)

      {:ok, opts}
    end
  end

  defp put_if(opts, true, key, value), do: opts ++ [{key, value}]
  defp put_if(opts, _, _key, _value), do: opts

  defp max_tokens(body, config) do
    {field, value} =
      case {Map.get(body, "max_completion_tokens"), Map.get(body, "max_tokens")} do
        {nil, v} -> {"max_tokens", v}
        {v, _} -> {"max_completion_tokens", v}
      end

    case value do
      nil -> {:ok, config.default_max_tokens}
      n when is_integer(n) and n > 0 and n <= 1_000_000 -> {:ok, n}
      _ -> {:error, error(400, "\"#{field}\" must be a positive integer", param: field)}
    end
  end

  @doc "An optional number in `min..max`."
  def number(body, field, min, max) do
    case Map.get(body, field) do
      nil -> {:ok, nil}
      n when is_number(n) and n >= min and n <= max -> {:ok, n}
      _ -> {:error, error(400, "\"#{field}\" must be a number from #{min} to #{max}", param: field)}
    end
  end

  @doc "An optional integer in `min..max`."
  def integer(body, field, min, max) do
    case Map.get(body, field) do
      nil -> {:ok, nil}
      n when is_integer(n) and n >= min and n <= max -> {:ok, n}
      _ -> {:error, error(400, "\"#{field}\" must be an integer", param: field)}
    end
  end

  @doc "An optional boolean."
  def boolean(body, field) do
    case Map.get(body, field) do
      b when is_boolean(b) or is_nil(b) -> {:ok, b}
      _ -> {:error, error(400, "\"#{field}\" must be true or false", param: field)}
    end
  end

  defp stop(body) do
    case Map.get(body, "stop") do
      nil ->
        {:ok, []}

      s when is_binary(s) and s != "" ->
        {:ok, [s]}

      list when is_list(list) and length(list) <= 16 ->
        if Enum.all?(list, &(is_binary(&1) and &1 != "")),
          do: {:ok, list},
          else:
            {:error, error(400, "\"stop\" must be a string or a list of non-empty strings", param: "stop")}

      _ ->
        {:error,
         error(400, "\"stop\" must be a string or a list of at most 16 non-empty strings", param: "stop")}
    end
  end

  @doc """
  Chat messages: a non-empty list of `{"role", "content"}` objects; content is a string, a list
  of `{"type": "text", "text": ...}` parts (joined by newlines) or null.
  """
  def messages(body, field \\ "messages") do
    case Map.get(body, field) do
      [_ | _] = list ->
        list
        |> Enum.with_index()
        |> Enum.reduce_while({:ok, []}, fn {message, i}, {:ok, acc} ->
          case message(message) do
            {:ok, m} -> {:cont, {:ok, [m | acc]}}
            {:error, why} -> {:halt, {:error, error(400, "#{field}[#{i}]: #{why}", param: "#{field}[#{i}]")}}
          end
        end)
        |> case do
          {:ok, acc} -> {:ok, Enum.reverse(acc)}
          error -> error
        end

      nil ->
        {:error, error(400, "\"#{field}\" is required", param: field, code: "missing_required_parameter")}

      _ ->
        {:error, error(400, "\"#{field}\" must be a non-empty list of messages", param: field)}
    end
  end

  defp message(%{"role" => role} = m) when is_binary(role) and role != "" do
    role = if role == "developer", do: "system", else: role

    case Map.get(m, "content") do
      text when is_binary(text) ->
        {:ok, %{role: role, content: text}}

      nil ->
        {:ok, %{role: role, content: ""}}

      parts when is_list(parts) ->
        texts =
          Enum.map(parts, fn
            %{"type" => "text", "text" => t} when is_binary(t) -> t
            _ -> nil
          end)

        if Enum.all?(texts, & &1),
          do: {:ok, %{role: role, content: Enum.join(texts, "\n")}},
          else: {:error, "only text content parts are supported"}

      _ ->
        {:error, "\"content\" must be a string, a list of text parts or null"}
    end
  end

  defp message(_), do: {:error, "a message is an object with a string \"role\" and a \"content\""}

  ## Generation

  @doc "Generates to the end: `{:ok, %{text, finish_reason, usage}}` or `{:error, response}`."
  def generate(served, prompt, opts, request) do
    case retrying(served, &ExBurn.LLM.Scheduler.generate(&1.server, prompt, opts ++ [alive?: request.alive?])) do
      {:ok, result} -> {:ok, result}
      {:error, e} -> {:error, llm_error(e)}
    end
  end

  @doc """
  Queues a generation and returns `{:ok, events, cleanup}`: the lazy stream of its events
  (`{:text, t}`..., then `{:done, info}` or `{:error, e}`) and a function that cancels it if
  the stream was not run to its end; or `{:error, response}` when it cannot be queued.
  """
  def start_stream(served, prompt, opts, request) do
    case retrying(
           served,
           &with(
             {:ok, ref} <- ExBurn.LLM.Scheduler.request(&1.server, prompt, opts),
             do: {:ok, &1.server, ref}
           )
         ) do
      {:ok, server, ref} ->
        events = ExBurn.LLM.Scheduler.events(server, ref, alive?: request.alive?)
        {:ok, events, fn -> ExBurn.LLM.Scheduler.cancel(server, ref) end}

      {:error, e} ->
        {:error, llm_error(e)}
    end
  end

  @input_kinds [
    :argument,
    :invalid_option,
    :invalid_prompt,
    :empty_prompt,
    :prompt_too_long,
    :no_chat_template,
    :chat_template_error
  ]

  @doc "The response for a generation error."
  def llm_error(%Error{details: %{cause: :overloaded}} = e),
    do:
      error(503, Exception.message(e),
        type: "server_error",
        code: "overloaded",
        headers: [{"retry-after", "1"}]
      )

  def llm_error(%Error{details: %{kind: kind}} = e) when kind in @input_kinds,
    do: error(400, e.reason, code: Atom.to_string(kind))

  def llm_error(%Error{details: %{cause: :cancelled}}),
    do: error(499, "the client went away", code: "cancelled")

  def llm_error(%Error{} = e), do: error(500, Exception.message(e), type: "server_error")

  @doc "The usage object of a finished generation."
  def usage(%{prompt_tokens: p, completion_tokens: c}),
    do: %{prompt_tokens: p, completion_tokens: c, total_tokens: p + c}
end
