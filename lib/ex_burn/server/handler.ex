defmodule ExBurn.Server.Request do
  @moduledoc """
  An HTTP request as `ExBurn.Server.Handler` sees it, whatever the adapter (`:httpd`, Plug).

    * `:method` - upper case, such as `"POST"`
    * `:path` - without the query string; `:query` - the query string
    * `:headers` - `[{lower_case_name, value}]`
    * `:body` - the whole body (a binary; the adapter enforces the body limit)
    * `:peer` - the client's address as a string (rate limiting keys on it)
    * `:alive?` - nil, or a zero-arity function the adapter provides that returns false once
      the client has hung up (checked while a generation waits, so a gone client's request
      leaves the queue)
  """
  defstruct method: "GET", path: "/", query: "", headers: [], body: "", peer: "unknown", alive?: nil

  @type t :: %__MODULE__{}
end

defmodule ExBurn.Server.Response do
  @moduledoc """
  What `ExBurn.Server.Handler` answers: `:status`, `:headers` (`[{name, value}]`, lower case)
  and `:body`, either iodata or `{:stream, enumerable}`: chunks of iodata to send as they come
  (server-sent events), the adapter stopping the enumeration when a send fails.
  """
  defstruct status: 200, headers: [], body: "", cleanup: nil

  @type t :: %__MODULE__{}
end

defmodule ExBurn.Server.Handler do
  @moduledoc """
  The request handling of `ExBurn.Server`, independent of the HTTP library: a request in
  (`ExBurn.Server.Request`), a response out (`ExBurn.Server.Response`). The `:httpd` adapter
  (`ExBurn.Server.Httpd`) and the Plug adapter (`ExBurn.Server.Plug`) call `serve/3`.
  """

  require Logger

  alias ExBurn.JSON
  alias ExBurn.Server.{Api, Instance, Metrics, OpenAI, RateLimiter, Request, Rerank, Response}

  # {method, path pattern, function, authenticated?}
  @routes [
    {"GET", "/api/v1/health", {Api, :health}, false},
    {"GET", "/api/v1/hardware", {Api, :hardware}, true},
    {"GET", "/api/v1/models", {Api, :models}, true},
    {"POST", "/api/v1/embeddings", {Api, :embeddings}, true},
    {"POST", "/api/v1/llm/inference", {Api, :inference}, true},
    {"POST", "/api/v1/llm/stream", {Api, :stream}, true},
    {"GET", "/v1/models", {OpenAI, :models}, true},
    {"GET", "/v1/models/:id", {OpenAI, :model}, true},
    {"POST", "/v1/embeddings", {OpenAI, :embeddings}, true},
    {"POST", "/v1/completions", {OpenAI, :completions}, true},
    {"POST", "/v1/chat/completions", {OpenAI, :chat_completions}, true},
    {"POST", "/v1/rerank", {Rerank, :rerank}, true},
    {"GET", "/metrics", {Api, :metrics}, true}
  ]

  @doc """
  Answers `request` for server instance `name`: builds the response and hands it to `respond`,
  a function that sends it and returns `{:ok, value}`, or `{:closed, value}` when the client
  went away mid-response; `serve/3` returns `value`. Around that it counts the request in flight
  (refusing it with 503 while the server drains), and records metrics and telemetry.
  """
  @spec serve(atom | map, Request.t(), (Response.t() -> {:ok | :closed, term})) :: term
  def serve(name, %Request{} = request, respond) when is_function(respond, 1) do
    t0 = System.monotonic_time()

    case config(name) do
      nil ->
        request |> unavailable("the server is not running") |> respond.() |> elem(1)

      config ->
        if Instance.enter(config) do
          try do
            {route, response} = handle(config, request)
            {outcome, value} = send_response(response, respond)
            finish(config, request, route, response.status, outcome, t0)
            value
          after
            Instance.leave(config)
          end
        else
          response = unavailable(request, "the server is shutting down")
          {outcome, value} = respond.(response)
          finish(config, request, route_of(request), 503, outcome, t0)
          value
        end
    end
  end

  defp config(%{} = config), do: config
  defp config(name), do: Instance.config(name)

  defp send_response(%Response{cleanup: nil} = response, respond), do: respond.(response)

  defp send_response(%Response{cleanup: cleanup} = response, respond) do
    respond.(response)
  after
    cleanup.()
  end

  defp unavailable(_request, message) do
    error(503, message,
      type: "server_error",
      code: "unavailable",
      headers: [{"retry-after", "5"}, {"connection", "close"}]
    )
  end

  defp finish(config, request, route, status, outcome, t0) do
    duration = System.monotonic_time() - t0
    Metrics.record(config, route, status, duration, outcome == :closed)

    if Code.ensure_loaded?(:telemetry) do
      apply(:telemetry, :execute, [
        [:ex_burn, :server, :request],
        %{duration: duration},
        %{
          server: config.name,
          method: request.method,
          route: route,
          status: status,
          aborted: outcome == :closed
        }
      ])
    end

    :ok
  end

  @doc """
  Routes and answers a request: `{route, response}` (`route` is the matched pattern, or
  `"unmatched"`). Pure apart from the models it may load and run; never raises.
  """
  @spec handle(map, Request.t()) :: {String.t(), Response.t()}
  def handle(config, %Request{} = request) do
    path = normalize(request.path)

    case match(request.method, path) do
      {:ok, route, fun, auth?, params} ->
        {route, run(config, request, fun, auth?, params)}

      {:method_not_allowed, route, allowed} ->
        {route,
         error(405, "#{request.method} is not allowed on #{path}",
           code: "method_not_allowed",
           headers: [{"allow", Enum.join(allowed, ", ")}]
         )}

      :not_found ->
        {"unmatched", error(404, "no route for #{request.method} #{path}", code: "not_found")}
    end
  end

  defp route_of(request) do
    case match(request.method, normalize(request.path)) do
      {:ok, route, _, _, _} -> route
      {:method_not_allowed, route, _} -> route
      :not_found -> "unmatched"
    end
  end

  defp run(config, request, {mod, fun}, auth?, params) do
    with :ok <- authorize(config, request, auth?),
         :ok <- rate_limit(config, request, auth?),
         :ok <- body_size(config, request) do
      apply(mod, fun, [config, %{request | path: normalize(request.path)}, params])
    end
  rescue
    e ->
      Logger.error(
        "ExBurn.Server: #{request.method} #{request.path} failed: " <>
          Exception.format(:error, e, __STACKTRACE__)
      )

      error(500, "internal error: #{Exception.message(e)}", type: "server_error", code: "internal_error")
  catch
    kind, reason ->
      Logger.error("ExBurn.Server: #{request.method} #{request.path} failed: #{inspect({kind, reason})}")
      error(500, "internal error", type: "server_error", code: "internal_error")
  end

  defp normalize(path) do
    case String.trim_trailing(path, "/") do
      "" -> "/"
      p -> p
    end
  end

  defp match(method, path) do
    segments = String.split(path, "/", trim: true)

    matches =
      for {m, pattern, fun, auth?} <- @routes,
          params = match_path(String.split(pattern, "/", trim: true), segments, %{}),
          params != nil,
          do: {m, pattern, fun, auth?, params}

    case Enum.find(matches, fn {m, _, _, _, _} -> m == method or (method == "HEAD" and m == "GET") end) do
      {_, pattern, fun, auth?, params} ->
        {:ok, pattern, fun, auth?, params}

      nil ->
        case matches do
          [] -> :not_found
          [{_, pattern, _, _, _} | _] = all -> {:method_not_allowed, pattern, Enum.map(all, &elem(&1, 0))}
        end
    end
  end

  defp match_path([], [], params), do: params

  defp match_path([":" <> name | rest], [seg | segs], params) do
    case decode_segment(seg) do
      {:ok, value} -> match_path(rest, segs, Map.put(params, name, value))
      :error -> nil
    end
  end

  defp match_path([seg | rest], [seg | segs], params), do: match_path(rest, segs, params)
  defp match_path(_, _, _), do: nil

  # Percent-decoding of a path parameter; a malformed escape or a non-UTF-8 result matches nothing.
  defp decode_segment(seg) do
    value = URI.decode(seg)
    if String.valid?(value), do: {:ok, value}, else: :error
  rescue
    ArgumentError -> :error
  end

  ## Authentication, rate limits, body size

  defp authorize(%{token: nil}, _request, _), do: :ok
  defp authorize(_config, _request, false), do: :ok

  defp authorize(%{token: token}, request, true) do
    case bearer(request) do
      nil ->
        error(401, "missing bearer token: send Authorization: Bearer <token>",
          type: "authentication_error",
          code: "missing_api_key",
          headers: [{"www-authenticate", ~s(Bearer realm="exburn")}]
        )

      given ->
        if secure_compare(given, token),
          do: :ok,
          else:
            error(401, "invalid bearer token",
              type: "authentication_error",
              code: "invalid_api_key",
              headers: [{"www-authenticate", ~s(Bearer realm="exburn", error="invalid_token")}]
            )
    end
  end

  defp bearer(request) do
    with value when is_binary(value) <- header(request, "authorization"),
         [scheme, token] <- String.split(String.trim(value), ~r/\s+/, parts: 2),
         true <- String.downcase(scheme) == "bearer" do
      token
    else
      _ -> nil
    end
  end

  # Compares digests, so the time taken says nothing about how much of the token matched.
  defp secure_compare(a, b) do
    da = :erlang.md5(a) <> :erlang.md5("exburn" <> a)
    db = :erlang.md5(b) <> :erlang.md5("exburn" <> b)

    :erlang.bxor(:binary.decode_unsigned(da), :binary.decode_unsigned(db)) == 0 and
      byte_size(a) == byte_size(b)
  end

  defp rate_limit(%{rate_limit: nil}, _request, _), do: :ok
  defp rate_limit(_config, _request, false), do: :ok

  defp rate_limit(config, request, true) do
    case RateLimiter.take(config, client_key(request)) do
      :ok ->
        :ok

      {:error, retry_after} ->
        error(429, "rate limit exceeded: retry in #{retry_after} s",
          type: "rate_limit_error",
          code: "rate_limit_exceeded",
          headers: [{"retry-after", Integer.to_string(retry_after)}]
        )
    end
  end

  @doc false
  # The client a rate limit applies to: its bearer token (hashed) when it sends one, else its
  # address. Forwarding headers are not trusted (anyone can send them).
  def client_key(request) do
    case bearer(request) do
      nil -> {:ip, request.peer}
      token -> {:token, :erlang.md5(token)}
    end
  end

  defp body_size(config, %Request{body: :too_large}), do: too_large(config)

  defp body_size(config, request) do
    if byte_size(request.body) > config.body_limit,
      do: too_large(config),
      else: :ok
  end

  @doc false
  def too_large(config) do
    error(413, "request body larger than #{config.body_limit} bytes",
      code: "body_too_large",
      headers: [{"connection", "close"}]
    )
  end

  ## Helpers for the routes

  @doc "A request header's value (name in lower case), or nil."
  def header(%Request{headers: headers}, name) do
    Enum.find_value(headers, fn {k, v} -> if String.downcase(k) == name, do: v end)
  end

  @doc "A JSON response."
  def json(status \\ 200, value, headers \\ []) do
    %Response{
      status: status,
      headers: [{"content-type", "application/json"} | headers],
      body: JSON.encode!(value)
    }
  end

  @doc """
  An error response in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`;
  options `:type` (default from the status), `:param`, `:code`, `:headers`.
  """
  def error(status, message, opts \\ []) do
    type = Keyword.get_lazy(opts, :type, fn -> error_type(status) end)
    # Messages may quote what the client sent (a path, a name): keep the JSON valid UTF-8.
    message = if String.valid?(message), do: message, else: inspect(message)

    json(
      status,
      %{error: %{message: message, type: type, param: opts[:param], code: opts[:code]}},
      Keyword.get(opts, :headers, [])
    )
  end

  defp error_type(401), do: "authentication_error"
  defp error_type(403), do: "permission_error"
  defp error_type(429), do: "rate_limit_error"
  defp error_type(status) when status >= 500, do: "server_error"
  defp error_type(_), do: "invalid_request_error"

  @doc "Decodes a JSON object body: `{:ok, map}` or `{:error, response}` (400)."
  def json_body(%Request{body: body}) do
    case JSON.decode(body) do
      {:ok, %{} = map} -> {:ok, map}
      {:ok, _} -> {:error, error(400, "the request body must be a JSON object", code: "invalid_json")}
      {:error, e} -> {:error, error(400, "malformed JSON: #{e.reason}", code: "invalid_json")}
    end
  end

  @doc "Server-sent event lines for a JSON value (`data: ...\\n\\n`), with an optional event name."
  def sse(value, event \\ nil) do
    {event, data} =
      case if(is_binary(value), do: {:ok, value}, else: JSON.encode(value)) do
        {:ok, data} ->
          {event, data}

        # Nothing a model produces should fail to encode; if it does, the stream says so.
        {:error, e} ->
          message = "could not encode an event: #{e.reason}"

          {event && "error",
           JSON.encode!(%{error: %{message: message, type: "server_error", param: nil, code: nil}})}
      end

    if event, do: ["event: ", event, "\ndata: ", data, "\n\n"], else: ["data: ", data, "\n\n"]
  end

  @doc "The headers of an event stream."
  def sse_headers do
    [{"content-type", "text/event-stream"}, {"cache-control", "no-cache"}, {"x-accel-buffering", "no"}]
  end
end
