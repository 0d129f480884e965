# Load test of the inference server: many concurrent HTTP clients, requests mixed
# across the endpoints, some streaming clients killed mid-stream; every answer is checked
# against ExBurn.Embedding / ExBurn.LLM called directly.
#
#   MIX_ENV=test mix run bench/server_load.exs                     # 200 clients, 10 000 requests
#   MIX_ENV=test mix run bench/server_load.exs --quick             # 20 clients, 1 000 requests, 4 killed
#   CLIENTS=50 REQUESTS=1000 KILLED=5 MIX_ENV=test mix run bench/server_load.exs
#
# Needs the test models (mix ex_burn.models.fetch). The server runs in this VM; the clients are
# raw keep-alive HTTP/1.1 connections (one per client; :httpc would queue them two per host).
# Mix (per request, seeded): 30% GET /api/v1/health, 10% GET /v1/models, 35% POST
# /v1/embeddings (one text), 15% POST /api/v1/embeddings (2-3 texts), 4% POST
# /v1/chat/completions, 3% POST /v1/completions streamed, 3% POST /api/v1/llm/inference
# (greedy, 2 tokens; generations share batched steps). KILLED more clients
# each start a long chat stream (1 000 tokens) and die at its first chunk: the server must stop
# those generations, or the run would take KILLED * 1 000 tokens longer.
#
# Prints throughput, p50/p99 latency overall and per route, lost (no answer) and wrong answers
# (both must be 0), and the load average and the CPUs' FMA rate (support/machine.exs) before and
# after.
Code.require_file("support/machine.exs", __DIR__)

defmodule LoadClient do
  @moduledoc false
  # A minimal HTTP/1.1 client on one keep-alive socket, enough for JSON and chunked SSE answers.

  def connect(port) do
    {:ok, socket} = :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false, nodelay: true])
    socket
  end

  def request(socket, method, path, body \\ nil) do
    body = if body, do: ExBurn.JSON.encode!(body), else: ""

    :ok =
      :gen_tcp.send(socket, [
        "#{method} #{path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n",
        "Content-Length: #{byte_size(body)}\r\n\r\n",
        body
      ])

    read_response(socket)
  end

  def read_response(socket) do
    :ok = :inet.setopts(socket, packet: :http_bin)
    {:ok, {:http_response, _, status, _}} = :gen_tcp.recv(socket, 0, 300_000)
    headers = read_headers(socket, %{})
    :ok = :inet.setopts(socket, packet: :raw)

    body =
      cond do
        headers["transfer-encoding"] == "chunked" -> read_chunks(socket, [])
        len = headers["content-length"] -> read_exact(socket, String.to_integer(len))
        true -> ""
      end

    {status, body}
  end

  defp read_headers(socket, acc) do
    case :gen_tcp.recv(socket, 0, 300_000) do
      {:ok, {:http_header, _, name, _, value}} ->
        read_headers(socket, Map.put(acc, String.downcase(to_string(name)), value))

      {:ok, :http_eoh} ->
        acc
    end
  end

  defp read_exact(_socket, 0), do: ""

  defp read_exact(socket, n) do
    {:ok, data} = :gen_tcp.recv(socket, n, 300_000)
    data
  end

  defp read_chunks(socket, acc) do
    :ok = :inet.setopts(socket, packet: :line)
    {:ok, line} = :gen_tcp.recv(socket, 0, 300_000)
    :ok = :inet.setopts(socket, packet: :raw)
    {size, _} = line |> String.trim() |> Integer.parse(16)

    if size == 0 do
      read_exact(socket, 2)
      IO.iodata_to_binary(Enum.reverse(acc))
    else
      chunk = read_exact(socket, size + 2) |> binary_part(0, size)
      read_chunks(socket, [chunk | acc])
    end
  end
end

defmodule ServerLoad do
  @moduledoc false

  @emb "all-minilm-l6-v2"
  @llm "smollm2-135m-instruct"

  def run(argv) do
    # --quick: a smoke run of the same mix; CLIENTS, REQUESTS and KILLED still override
    {clients, total, killed} = if "--quick" in argv, do: {20, 1_000, 4}, else: {200, 10_000, 20}
    clients = env_int("CLIENTS", clients)
    total = env_int("REQUESTS", total)
    killed = env_int("KILLED", killed)

    for {kind, name} <- [embedding: @emb, llm: @llm],
        not Enum.any?(ExBurn.Models.list(), &(&1.kind == kind and &1.name == name)) do
      IO.puts("#{name} is not installed: run mix ex_burn.models.fetch")
      System.halt(1)
    end

    IO.puts("load before: #{Bench.Machine.loadavg()}")

    {:ok, _} =
      ExBurn.Server.start_link(name: LoadServer, port: 0, preload: :all, token: nil, max_connections: 2048)

    port = ExBurn.Server.port(LoadServer)
    expected = expectations()
    wait_loaded()

    IO.puts(
      "#{clients} clients, #{total} requests, #{killed} clients killed mid-stream; server on port #{port}"
    )

    test = self()
    t0 = System.monotonic_time()

    victims =
      for i <- 1..killed//1 do
        spawn(fn ->
          socket = LoadClient.connect(port)

          body = %{
            model: @llm,
            messages: [%{role: "user", content: "Count to a thousand, #{i}."}],
            max_tokens: 1_000,
            stream: true
          }

          :ok = :gen_tcp.send(socket, request_bytes("/v1/chat/completions", body))
          {:ok, _first} = :gen_tcp.recv(socket, 0, 600_000)
          send(test, {:victim_streaming, i})
          # dies holding the socket: the connection drops mid-stream
          Process.exit(self(), :kill)
        end)
      end

    per_client =
      for c <- 0..(clients - 1), do: div(total, clients) + if(c < rem(total, clients), do: 1, else: 0)

    tasks =
      for {n, c} <- Enum.with_index(per_client) do
        Task.async(fn -> client(port, c, n, expected) end)
      end

    results = Enum.flat_map(tasks, &Task.await(&1, :infinity))
    wall = System.convert_time_unit(System.monotonic_time() - t0, :native, :microsecond) / 1.0e6
    streaming_victims = for _ <- victims, into: [], do: receive_victim()

    report(results, wall, total)
    check_server(killed, length(Enum.reject(streaming_victims, &is_nil/1)))
    IO.puts("load after: #{Bench.Machine.loadavg()}")
    ExBurn.Server.stop(LoadServer)
  end

  defp receive_victim do
    receive do
      {:victim_streaming, i} -> i
    after
      600_000 -> nil
    end
  end

  defp request_bytes(path, body) do
    body = ExBurn.JSON.encode!(body)

    [
      "POST #{path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: #{byte_size(body)}\r\n\r\n",
      body
    ]
  end

  # What each kind of request must answer, computed without the server.
  defp expectations do
    {:ok, emb} = ExBurn.Embedding.load(@emb)
    {:ok, llm} = ExBurn.LLM.load(@llm)

    texts =
      for i <- 1..64,
          do:
            "load test sentence #{i}: #{Enum.at(~w(cats dogs rain code tea), rem(i, 5))} #{String.duplicate("x", rem(i, 7))}"

    vectors = Map.new(Enum.zip(texts, ExBurn.Embedding.embed!(emb, texts)))
    prompts = for i <- 1..6, do: "Tell me about the number #{i}."

    chats =
      Map.new(
        prompts,
        &{&1, ExBurn.LLM.generate!(llm, [%{role: "user", content: &1}], max_tokens: 2, greedy: true).text}
      )

    completions = Map.new(prompts, &{&1, ExBurn.LLM.generate!(llm, &1, max_tokens: 2, greedy: true).text})
    models = ExBurn.Models.list() |> Enum.map(& &1.name) |> Enum.sort()

    %{
      texts: List.to_tuple(texts),
      vectors: vectors,
      prompts: List.to_tuple(prompts),
      chats: chats,
      completions: completions,
      models: models
    }
  end

  defp wait_loaded do
    if length(ExBurn.Server.loaded_models(LoadServer)) < 2 do
      Process.sleep(50)
      wait_loaded()
    end
  end

  defp client(port, c, n, expected) do
    :rand.seed(:exsss, {c + 1, 7, 13})
    socket = LoadClient.connect(port)

    for _ <- 1..n//1 do
      {route, method, path, body, check} = pick(expected)
      t = System.monotonic_time()

      outcome =
        try do
          {status, answer} = LoadClient.request(socket, method, path, body)

          case status == 200 and check.(answer) do
            true -> :ok
            # how far a differing embedding is off tells rounding from a bug
            {:off_by, d} -> {:wrong, status, "embedding off by at most #{d}"}
            _ -> {:wrong, status, String.slice(answer, 0, 200)}
          end
        catch
          kind, reason -> {:lost, {kind, reason}}
        end

      us = System.convert_time_unit(System.monotonic_time() - t, :native, :microsecond)
      {route, us, outcome}
    end
  end

  defp pick(e) do
    r = :rand.uniform(100)
    text = elem(e.texts, :rand.uniform(tuple_size(e.texts)) - 1)
    prompt = elem(e.prompts, :rand.uniform(tuple_size(e.prompts)) - 1)

    cond do
      r <= 30 ->
        {"GET /api/v1/health", "GET", "/api/v1/health", nil, &(json(&1)["status"] == "ok")}

      r <= 40 ->
        {"GET /v1/models", "GET", "/v1/models", nil,
         &(Enum.map(json(&1)["data"], fn m -> m["id"] end) |> Enum.sort() == e.models)}

      r <= 75 ->
        {"POST /v1/embeddings", "POST", "/v1/embeddings", %{model: @emb, input: text},
         &same_vectors([json(&1)["data"] |> hd() |> Map.get("embedding")], [e.vectors[text]])}

      r <= 90 ->
        batch =
          for _ <- 1..(2 + :rand.uniform(2) - 1), do: elem(e.texts, :rand.uniform(tuple_size(e.texts)) - 1)

        {"POST /api/v1/embeddings", "POST", "/api/v1/embeddings", %{model: @emb, input: batch},
         &same_vectors(json(&1)["embeddings"], Enum.map(batch, fn t -> e.vectors[t] end))}

      r <= 94 ->
        body = %{model: @llm, messages: [%{role: "user", content: prompt}], max_tokens: 2, temperature: 0}

        {"POST /v1/chat/completions", "POST", "/v1/chat/completions", body,
         &(hd(json(&1)["choices"])["message"]["content"] == e.chats[prompt])}

      r <= 97 ->
        body = %{model: @llm, prompt: prompt, max_tokens: 2, temperature: 0, stream: true}

        {"POST /v1/completions (stream)", "POST", "/v1/completions", body,
         &(streamed_text(&1) == {:done, e.completions[prompt]})}

      true ->
        body = %{model: @llm, prompt: prompt, max_tokens: 2, greedy: true}

        {"POST /api/v1/llm/inference", "POST", "/api/v1/llm/inference", body,
         &(json(&1)["text"] == e.completions[prompt])}
    end
  end

  defp json(body), do: ExBurn.JSON.decode!(body)

  # true when equal; {:off_by, max |difference|} when the same shape; else false
  defp same_vectors(got, expected) do
    cond do
      got == expected ->
        true

      is_list(got) and length(got) == length(expected) and
          Enum.all?(Enum.zip(got, expected), fn {g, x} -> is_list(g) and length(g) == length(x) end) ->
        {:off_by,
         Enum.zip(got, expected)
         |> Enum.flat_map(fn {g, x} -> Enum.zip_with(g, x, &abs(&1 - &2)) end)
         |> Enum.max()}

      true ->
        false
    end
  end

  defp streamed_text(body) do
    datas = for "data: " <> d <- String.split(body, "\n"), do: d
    {"[DONE]", chunks} = List.pop_at(datas, -1)
    {:done, chunks |> Enum.flat_map(&json(&1)["choices"]) |> Enum.map_join(& &1["text"])}
  rescue
    _ -> :bad_stream
  end

  defp report(results, wall, total) do
    lost = Enum.filter(results, &match?({_, _, {:lost, _}}, &1))
    wrong = Enum.filter(results, &match?({_, _, {:wrong, _, _}}, &1))

    IO.puts(
      "\n#{length(results)}/#{total} requests in #{Float.round(wall, 1)} s: #{Float.round(length(results) / wall, 1)} requests/s"
    )

    off_by = for {_, _, {:wrong, _, "embedding off by at most " <> d}} <- wrong, do: String.to_float(d)

    IO.puts(
      "lost: #{length(lost)}, wrong: #{length(wrong)}" <>
        if(off_by == [],
          do: "",
          else: " (#{length(off_by)} embeddings differ from the direct call by at most #{Enum.max(off_by)})"
        )
    )

    for {route, _, outcome} <- Enum.take(lost ++ wrong, 5), do: IO.puts("  #{route}: #{inspect(outcome)}")

    IO.puts(
      "\n#{String.pad_trailing("route", 32)} #{String.pad_leading("count", 6)} #{String.pad_leading("p50 ms", 9)} #{String.pad_leading("p99 ms", 9)}"
    )

    [{"all", results} | results |> Enum.group_by(&elem(&1, 0)) |> Enum.sort()]
    |> Enum.each(fn {route, rs} ->
      lat = rs |> Enum.map(&elem(&1, 1)) |> Enum.sort() |> List.to_tuple()
      p = fn q -> elem(lat, min(tuple_size(lat) - 1, floor(q * tuple_size(lat)))) / 1000 end

      IO.puts(
        "#{String.pad_trailing(route, 32)} #{String.pad_leading(Integer.to_string(length(rs)), 6)} " <>
          "#{String.pad_leading(:erlang.float_to_binary(p.(0.5), decimals: 1), 9)} #{String.pad_leading(:erlang.float_to_binary(p.(0.99), decimals: 1), 9)}"
      )
    end)

    if lost != [] or wrong != [], do: IO.puts("\nFAILED: answers were lost or wrong")
  end

  defp check_server(killed, streaming) do
    config = ExBurn.Server.Instance.config(LoadServer)
    [{_, %{server: llm}}] = Registry.lookup(config.registry, @llm)
    # the killed clients' generations must all have stopped
    wait = fn wait, tries ->
      info = ExBurn.LLM.Scheduler.info(llm)

      if (info.running > 0 or info.queued > 0) and tries > 0,
        do:
          (
            Process.sleep(100)
            wait.(wait, tries - 1)
          ),
        else: info
    end

    info = wait.(wait, 100)
    metrics = ExBurn.Server.Metrics.render(config) |> IO.iodata_to_binary()

    aborted =
      Regex.run(~r/exburn_http_requests_aborted_total\{route="\/v1\/chat\/completions"\} (\d+)/, metrics,
        capture: :all_but_first
      )

    aborted = if aborted, do: String.to_integer(hd(aborted)), else: 0

    IO.puts(
      "\nkilled clients: #{killed} (#{streaming} were streaming when killed); streams the server saw aborted: #{aborted}"
    )

    IO.puts("LLM queue after the run: running #{info.running}, queued #{info.queued}")

    IO.puts(
      "LLM KV cache reserved at most #{mib(info.kv_peak)} of its #{mib(info.kv_memory)} budget " <>
        "(#{info.max_concurrent} generations a step at most)"
    )

    if aborted != killed or info.running != 0,
      do: IO.puts("FAILED: a killed client's generation did not stop")
  end

  defp env_int(name, default), do: String.to_integer(System.get_env(name) || Integer.to_string(default))

  defp mib(bytes), do: "#{Float.round(bytes / 1_048_576, 1)} MiB"
end

ServerLoad.run(System.argv())
