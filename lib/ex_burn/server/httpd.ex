defmodule ExBurn.Server.Httpd do
  @moduledoc """
  The `:httpd` (OTP inets) adapter of `ExBurn.Server`: a child that runs a stand-alone
  `:httpd` whose only module is this one (its `do/1` callback turns the request into an
  `ExBurn.Server.Request` and sends back what `ExBurn.Server.Handler.serve/3` answers).

  How it uses `:httpd`:

    * Request bodies arrive in 64 KiB pieces (`max_client_body_chunk`), so a body over the
      limit is read and dropped rather than kept, then answered with a JSON 413; a declared
      length over 8 times the limit is refused by `:httpd` itself (413, before reading it).
    * Streamed responses use chunked transfer encoding (`:httpd_response.send_chunk/3`); a
      failed send means the client went away, and the stream stops there, cancelling its
      generation.
    * While a generation request is queued or runs, the socket is switched to `active: :once`,
      so the connection process hears `tcp_closed` when the client hangs up, and the request
      leaves the queue or its generation stops (`ExBurn.Server.Request` `:alive?`), streamed or
      not.
    * `:httpd` itself turns some statuses into 403 for HTTP/1.0 clients (413 and 429 among
      them); HTTP/1.1 clients get them as they are.
    * On shutdown the server drains: requests get 503 and the listener waits for those in
      flight (up to `:shutdown_timeout`) before it closes.
  """

  use GenServer

  require Record
  require Logger

  alias ExBurn.Server.{Handler, Instance, Request, Response}

  Record.defrecordp(:mod, Record.extract(:mod, from_lib: "inets/include/httpd.hrl"))
  Record.defrecordp(:init_data, Record.extract(:init_data, from_lib: "inets/include/httpd.hrl"))

  @chunk 65_536

  @doc false
  def child_spec(config) do
    %{
      id: __MODULE__,
      start: {__MODULE__, :start_link, [config]},
      shutdown: config.shutdown_timeout + 2_000
    }
  end

  @relisten_ms 1_000

  @doc false
  def start_link(config), do: GenServer.start_link(__MODULE__, config)

  @doc "The port the listener is bound to."
  def port(pid), do: GenServer.call(pid, :port)

  @impl true
  def init(config) do
    Process.flag(:trap_exit, true)
    instance = Instance.config(config.name)
    Instance.resume(instance)
    start_httpd(config, instance, System.monotonic_time(:millisecond) + @relisten_ms)
  end

  # A listener restarted after being killed can find its previous :httpd instance still shutting
  # down: under its registered name (wait for it to go), or still holding the port (try again
  # shortly). Each failed start would count against the supervisor's restart intensity, so
  # these are retried here, for at most `@relisten_ms` (a port that stays busy fails then).
  defp start_httpd(config, instance, deadline) do
    case :inets.start(:httpd, httpd_config(config), :stand_alone) do
      {:ok, pid} ->
        # A stand-alone :httpd whose socket failed to listen starts without children.
        case Supervisor.which_children(pid) do
          [{{:httpd_instance_sup, _addr, port, _profile}, _, _, _}] ->
            {:ok, %{httpd: pid, port: port, config: instance}}

          _ ->
            :inets.stop(:stand_alone, pid)
            retry(config, instance, deadline, {:listen_failed, config.port})
        end

      {:error, {:shutdown, {:failed_to_start_child, _, {:already_started, previous}}}} ->
        ref = Process.monitor(previous)

        receive do
          {:DOWN, ^ref, :process, _, _} -> start_httpd(config, instance, deadline)
        after
          config.shutdown_timeout + 2_000 ->
            Process.demonitor(ref, [:flush])
            {:stop, {:listen_failed, config.port, {:still_running, previous}}}
        end

      {:error, reason} ->
        retry(config, instance, deadline, {:listen_failed, config.port, reason})
    end
  end

  defp retry(config, instance, deadline, failure) do
    if System.monotonic_time(:millisecond) < deadline do
      Process.sleep(50)
      start_httpd(config, instance, deadline)
    else
      {:stop, failure}
    end
  end

  defp httpd_config(config) do
    root = String.to_charlist(System.tmp_dir!())
    hard_limit = 8 * config.body_limit

    [
      port: config.port,
      bind_address: config.ip,
      ipfamily: if(tuple_size(config.ip) == 8, do: :inet6, else: :inet),
      server_name: ~c"exburn",
      server_root: root,
      document_root: root,
      modules: [__MODULE__],
      max_clients: config.max_connections,
      max_body_size: hard_limit,
      max_content_length: hard_limit,
      max_client_body_chunk: @chunk,
      max_header_size: 65_536,
      max_uri_size: 16_384,
      keep_alive: true,
      keep_alive_timeout: 60,
      server_tokens: {:private, ~c"exburn"},
      ex_burn_instance: config.name
    ]
  end

  @impl true
  def handle_call(:port, _from, s), do: {:reply, s.port, s}

  @impl true
  def handle_info({:EXIT, pid, reason}, %{httpd: pid} = s), do: {:stop, reason, %{s | httpd: nil}}
  def handle_info(_other, s), do: {:noreply, s}

  @impl true
  def terminate(reason, s) do
    if s.httpd do
      if reason in [:normal, :shutdown] or match?({:shutdown, _}, reason) do
        Instance.drain(s.config)

        unless Instance.await_idle(s.config, s.config.shutdown_timeout),
          do:
            Logger.warning(
              "ExBurn.Server: closing with #{Instance.in_flight(s.config)} requests still in flight"
            )
      end

      :inets.stop(:stand_alone, s.httpd)
    end

    :ok
  end

  ## The :httpd module callback

  @doc false
  # `do` is a keyword in Elixir, hence unquote.
  def unquote(:do)(m) do
    name = :httpd_util.lookup(mod(m, :config_db), :ex_burn_instance)
    limit = limit(name)

    case mod(m, :entity_body) do
      {:first, chunk} -> {:continue, add(:undefined, chunk, limit)}
      {:continue, chunk, acc} -> {:continue, add(acc, chunk, limit)}
      {:last, chunk, acc} -> respond(name, m, add(acc, chunk, limit))
      body -> respond(name, m, add(:undefined, body, limit))
    end
  end

  defp limit(name) do
    case Instance.config(name) do
      nil -> :infinity
      config -> config.body_limit
    end
  end

  # The body so far: {:body, size, iodata}, or :too_large once over the limit (then dropped).
  defp add(:undefined, chunk, limit), do: add({:body, 0, []}, chunk, limit)
  defp add(:too_large, _chunk, _limit), do: :too_large

  defp add({:body, size, acc}, chunk, limit) do
    size = size + IO.iodata_length(chunk)
    if limit != :infinity and size > limit, do: :too_large, else: {:body, size, [acc | chunk]}
  end

  defp respond(name, m, body) do
    {path, query} = split_uri(to_string(mod(m, :request_uri)))

    request = %Request{
      method: to_string(mod(m, :method)),
      path: path,
      query: query,
      headers: for({k, v} <- mod(m, :parsed_header), do: {to_string(k), to_string(v)}),
      body:
        case body do
          :too_large -> :too_large
          {:body, _, acc} -> IO.iodata_to_binary(acc)
        end,
      peer: peer(m),
      alive?: alive_fun(m)
    }

    Process.delete(:ex_burn_client_closed)
    sent = Handler.serve(name, request, &send_response(m, request.method, &1))
    {:proceed, [{:response, sent}]}
  end

  defp split_uri("http" <> _ = uri) do
    parsed = URI.parse(uri)
    {parsed.path || "/", parsed.query || ""}
  end

  defp split_uri(uri) do
    case String.split(uri, "?", parts: 2) do
      [path, query] -> {path, query}
      [path] -> {path, ""}
    end
  end

  defp peer(m) do
    case mod(m, :init_data) do
      init_data(peername: {_port, ip}) -> to_string(ip)
      _ -> "unknown"
    end
  end

  # Arms `active: :once` on the connection's socket (this process owns it) and reports false
  # once the client has closed it.
  defp alive_fun(m) do
    type = mod(m, :socket_type)
    socket = mod(m, :socket)

    fn ->
      receive do
        {closed, ^socket} when closed in [:tcp_closed, :ssl_closed] -> client_closed()
        {error, ^socket, _} when error in [:tcp_error, :ssl_error] -> client_closed()
      after
        0 -> :http_transport.setopts(type, socket, active: :once) == :ok or client_closed()
      end
    end
  end

  # Remembered for this request, so a stream that stopped because the client left is counted as
  # aborted even though no send failed.
  defp client_closed do
    Process.put(:ex_burn_client_closed, true)
    false
  end

  defp closed?, do: Process.get(:ex_burn_client_closed, false)

  defp send_response(m, method, %Response{status: status, headers: headers, body: {:stream, chunks}}) do
    http11? = mod(m, :http_version) == ~c"HTTP/1.1"
    headers = if http11?, do: [{"transfer-encoding", "chunked"} | headers], else: headers

    case :httpd_response.send_header(m, status, charlist_headers(headers)) do
      :ok when method == "HEAD" ->
        :httpd_response.send_final_chunk(m, false)
        {:ok, {:already_sent, status, 0}}

      :ok ->
        outcome =
          Enum.reduce_while(chunks, :ok, fn chunk, :ok ->
            if IO.iodata_length(chunk) == 0 do
              {:cont, :ok}
            else
              case :httpd_response.send_chunk(m, chunk, false) do
                :ok -> {:cont, :ok}
                _closed -> {:halt, :closed}
              end
            end
          end)

        if outcome == :ok, do: :httpd_response.send_final_chunk(m, false)
        {if(closed?(), do: :closed, else: outcome), {:already_sent, status, 0}}

      _closed ->
        {:closed, {:already_sent, status, 0}}
    end
  end

  defp send_response(m, method, %Response{status: status, headers: headers, body: body}) do
    size = IO.iodata_length(body)
    head = [{"content-length", Integer.to_string(size)} | headers]
    type = mod(m, :socket_type)
    socket = mod(m, :socket)

    outcome =
      with :ok <- :httpd_response.send_header(m, status, charlist_headers(head)),
           :ok <- if(method == "HEAD" or size == 0, do: :ok, else: :httpd_socket.deliver(type, socket, body)) do
        :ok
      else
        _ -> :closed
      end

    # A response that says so ends the connection (draining).
    if List.keyfind(headers, "connection", 0) == {"connection", "close"},
      do: :httpd_socket.close(type, socket)

    {if(closed?(), do: :closed, else: outcome), {:already_sent, status, size}}
  end

  defp charlist_headers(headers),
    do: for({k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)})
end
