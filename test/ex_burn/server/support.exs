defmodule ExBurn.ServerTest.Support do
  @moduledoc false
  # Helpers of the inference server tests: HTTP through :httpc and raw sockets, SSE parsing,
  # and which pre-trained models are installed (tests that need one skip without it).

  @embedding "all-minilm-l6-v2"
  @llm "smollm2-135m-instruct"

  def embedding_id, do: @embedding
  def llm_id, do: @llm

  @doc "The installed model `name` of `kind`, or nil."
  def installed(kind, name) do
    Enum.find(ExBurn.Models.list(), &(&1.kind == kind and &1.name == name))
  rescue
    _ -> nil
  end

  @doc "A `@moduletag skip:` reason unless both test models are installed."
  def skip_without_models do
    missing = for {kind, name} <- [embedding: @embedding, llm: @llm], installed(kind, name) == nil, do: name

    if missing != [],
      do: "models not installed: #{Enum.join(missing, ", ")} (mix ex_burn.models.fetch installs them)"
  end

  @doc "A TCP port nobody listens on now."
  def free_port do
    {:ok, socket} = :gen_tcp.listen(0, reuseaddr: true)
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end

  @doc "A fresh empty directory (a models directory without models)."
  def empty_dir do
    # the OS pid too: unique_integer repeats across VMs, and a folder left by another run may
    # hold models
    name = "exburn_server_test_#{System.pid()}_#{System.unique_integer([:positive])}"
    dir = Path.join(System.tmp_dir!(), name)
    File.rm_rf!(dir)
    File.mkdir_p!(dir)
    ExUnit.Callbacks.on_exit(fn -> File.rm_rf(dir) end)
    dir
  end

  @doc "An HTTP request through :httpc: `{status, headers (lower-case names), body}`."
  def http(method, url, opts \\ []) do
    {:ok, _} = Application.ensure_all_started(:inets)

    headers =
      for {k, v} <- Keyword.get(opts, :headers, []), do: {String.to_charlist(k), String.to_charlist(v)}

    url = String.to_charlist(url)

    request =
      case Keyword.fetch(opts, :body) do
        {:ok, body} ->
          body = if is_binary(body), do: body, else: ExBurn.JSON.encode!(body)
          {url, headers, ~c"application/json", body}

        :error ->
          {url, headers}
      end

    {:ok, {{_, status, _}, resp_headers, body}} =
      :httpc.request(method, request, [timeout: 120_000], body_format: :binary)

    {status, Map.new(resp_headers, fn {k, v} -> {String.downcase(to_string(k)), to_string(v)} end), body}
  end

  @doc "Like `http/3` for a JSON answer: `{status, headers, decoded_body}`."
  def http_json(method, url, opts \\ []) do
    {status, headers, body} = http(method, url, opts)
    {status, headers, ExBurn.JSON.decode!(body)}
  end

  @doc "The `data:` payloads of a server-sent event stream, in order (JSON decoded unless `[DONE]`)."
  def sse_data(body) do
    body
    |> String.split("\n")
    |> Enum.flat_map(fn
      "data: [DONE]" -> [:done]
      "data: " <> json -> [ExBurn.JSON.decode!(json)]
      _ -> []
    end)
  end

  @doc "The `{event, data}` pairs of a stream with named events."
  def sse_events(body) do
    body
    |> String.split("\n\n", trim: true)
    |> Enum.map(fn block ->
      lines = String.split(block, "\n")

      event =
        Enum.find_value(lines, fn
          "event: " <> e -> e
          _ -> nil
        end)

      data =
        Enum.find_value(lines, fn
          "data: " <> d -> ExBurn.JSON.decode!(d)
          _ -> nil
        end)

      {event, data}
    end)
  end

  @doc """
  Opens a raw connection and sends a POST; returns the socket (owned by the caller, so killing
  the caller closes it, as a client that dies).
  """
  def raw_post(port, path, body, headers \\ []) do
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])
    body = if is_binary(body), do: body, else: ExBurn.JSON.encode!(body)
    extra = Enum.map(headers, fn {k, v} -> "#{k}: #{v}\r\n" end)

    :ok =
      :gen_tcp.send(socket, [
        "POST #{path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n",
        extra,
        "Content-Length: #{byte_size(body)}\r\n\r\n",
        body
      ])

    socket
  end

  @doc """
  Reads from a raw socket until `marker` (a string, or a predicate on the text so far) has
  arrived, or the peer closes; returns the text so far.
  """
  def recv_until(socket, marker, acc \\ "") do
    done? = if is_function(marker, 1), do: marker.(acc), else: String.contains?(acc, marker)

    if done? do
      acc
    else
      case :gen_tcp.recv(socket, 0, 120_000) do
        {:ok, data} -> recv_until(socket, marker, acc <> data)
        {:error, _} -> acc
      end
    end
  end

  @doc """
  A GET over a fresh raw connection that the server is expected to close: `{status, body}`.
  (:httpc would retry a 503 that carries Retry-After by itself.)
  """
  def raw_get(port, path) do
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])
    :ok = :gen_tcp.send(socket, "GET #{path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    response = recv_until(socket, fn _ -> false end)
    :gen_tcp.close(socket)
    [head, body] = String.split(response, "\r\n\r\n", parts: 2)
    ["HTTP/1.1", status | _] = String.split(head, " ")
    {String.to_integer(status), head, body}
  end

  @doc "Decodes a chunked HTTP/1.1 response body (after the headers)."
  def dechunk(response) do
    [_head, body] = String.split(response, "\r\n\r\n", parts: 2)
    dechunk_body(body, [])
  end

  defp dechunk_body(data, acc) do
    case String.split(data, "\r\n", parts: 2) do
      [size_hex, rest] ->
        case Integer.parse(size_hex, 16) do
          {0, _} ->
            IO.iodata_to_binary(Enum.reverse(acc))

          {size, _} when byte_size(rest) >= size ->
            <<chunk::binary-size(size), rest::binary>> = rest
            dechunk_body(String.replace_prefix(rest, "\r\n", ""), [chunk | acc])

          _ ->
            IO.iodata_to_binary(Enum.reverse(acc))
        end

      _ ->
        IO.iodata_to_binary(Enum.reverse(acc))
    end
  end

  @doc "The value of a Prometheus sample line, or 0 when absent."
  def metric(text, sample) do
    text
    |> String.split("\n")
    |> Enum.find_value(0, fn line ->
      case String.split(line, " ") do
        [^sample, value] -> value |> Float.parse() |> elem(0)
        _ -> nil
      end
    end)
  end
end
