Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.ModelsHttpTest do
  # The server with the real models over HTTP: answers equal to ExBurn.Embedding / ExBurn.LLM
  # called directly, streams, clients that hang up, a model process that dies, and a graceful
  # stop with a stream in flight.
  use ExUnit.Case, async: false

  alias ExBurn.ServerTest.Support

  @moduletag skip: Support.skip_without_models()
  @moduletag timeout: 600_000

  @emb Support.embedding_id()
  @llm Support.llm_id()

  setup_all do
    name = :models_http_test
    # one generation at a time, so the tests can hold a request in the queue behind another
    start_supervised!(
      {ExBurn.Server, name: name, port: 0, token: nil, preload: :all, max_concurrent: 1, warmup: true}
    )

    {:ok, embedding} = ExBurn.Embedding.load(@emb)
    {:ok, llm} = ExBurn.LLM.load(@llm)
    %{name: name, url: ExBurn.Server.url(name), embedding: embedding, llm: llm}
  end

  defp post(url, path, body), do: Support.http_json(:post, url <> path, body: body)

  # Preloading runs in the background: a test that runs first may find the model still loading
  # (registered, with no value yet), so wait for it.
  defp llm_server(name) do
    config = ExBurn.Server.Instance.config(name)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.Server.Models.lookup(config, @llm) != nil end, 6_000)
    ExBurn.Server.Models.lookup(config, @llm).server
  end

  test "warmup: true warmed the LLM's one batch size before its scheduler took requests", %{name: name} do
    assert %{warmup: %{batch_sizes: [1], ms: ms}} = ExBurn.LLM.Scheduler.info(llm_server(name))
    assert is_integer(ms)
  end

  test "models are listed by directory name, with their kind", %{url: url} do
    assert {200, _, %{"object" => "list", "data" => data}} = Support.http_json(:get, url <> "/v1/models")
    ids = Enum.map(data, & &1["id"])
    assert @emb in ids and @llm in ids

    assert Enum.all?(
             data,
             &(&1["object"] == "model" and &1["owned_by"] == "exburn" and is_integer(&1["created"]))
           )

    assert {200, _, %{"id" => @llm, "object" => "model"}} =
             Support.http_json(:get, url <> "/v1/models/#{@llm}")

    # the preloaded models show what they are
    ExBurn.TestHelpers.wait_until(
      fn -> length(ExBurn.Server.loaded_models(:models_http_test)) == 2 end,
      3_000
    )

    {200, _, %{"models" => models}} = Support.http_json(:get, url <> "/api/v1/models")
    emb = Enum.find(models, &(&1["id"] == @emb))
    llm = Enum.find(models, &(&1["id"] == @llm))
    assert %{"kind" => "embedding", "format" => "safetensors", "loaded" => true, "dim" => 384} = emb
    assert %{"kind" => "llm", "format" => "gguf", "loaded" => true, "context_length" => ctx} = llm
    assert is_integer(ctx) and ctx > 0

    {200, _, health} = Support.http_json(:get, url <> "/api/v1/health")
    assert Enum.sort(health["models_loaded"]) == Enum.sort([@emb, @llm])
  end

  test "/v1/embeddings gives ExBurn.Embedding.embed's vectors, as floats or base64", %{
    url: url,
    embedding: model
  } do
    texts = ["A cat sits on the mat.", "Un chat est assis sur le tapis.", "Quantum chromodynamics"]
    {:ok, direct} = ExBurn.Embedding.embed(model, texts)
    {:ok, ids} = ExBurn.Embedding.tokenize(model, texts)

    assert {200, _, body} = post(url, "/v1/embeddings", %{model: @emb, input: texts})
    assert body["object"] == "list" and body["model"] == @emb
    assert Enum.map(body["data"], & &1["index"]) == [0, 1, 2]
    assert_vectors(Enum.map(body["data"], & &1["embedding"]), direct)
    tokens = ids |> Enum.map(&length/1) |> Enum.sum()
    assert body["usage"] == %{"prompt_tokens" => tokens, "total_tokens" => tokens}

    assert {200, _, body} =
             post(url, "/v1/embeddings", %{model: @emb, input: hd(texts), encoding_format: "base64"})

    [%{"embedding" => b64}] = body["data"]
    floats = for <<x::float-32-little <- Base.decode64!(b64)>>, do: x
    assert_vectors([floats], [hd(direct)])

    assert {200, _, body} = post(url, "/api/v1/embeddings", %{input: texts})
    assert %{"model" => @emb, "dim" => 384, "embeddings" => embeddings} = body
    assert_vectors(embeddings, direct)

    assert {400, _, %{"error" => %{"param" => "dimensions"}}} =
             post(url, "/v1/embeddings", %{model: @emb, input: "x", dimensions: 3})
  end

  test "concurrent embedding requests each get their own vectors", %{url: url, embedding: model} do
    texts = for i <- 1..40, do: "sentence number #{i} about #{Enum.at(~w(cats dogs rain code), rem(i, 4))}"
    {:ok, direct} = ExBurn.Embedding.embed(model, texts)
    expected = Map.new(Enum.zip(texts, direct))

    texts
    |> Enum.chunk_every(2)
    |> Enum.map(fn chunk ->
      Task.async(fn -> {chunk, post(url, "/v1/embeddings", %{model: @emb, input: chunk})} end)
    end)
    |> Enum.map(&Task.await(&1, 120_000))
    |> Enum.each(fn {chunk, {200, _, body}} ->
      assert_vectors(Enum.map(body["data"], & &1["embedding"]), Enum.map(chunk, &expected[&1]))
    end)
  end

  test "a request's texts are tokenised once and reach the batcher as one request of token ids", %{
    name: name,
    url: url,
    embedding: model
  } do
    texts = ["tokenised once: first", "tokenised once: the second text", "tokenised once: 3"]
    {:ok, ids} = ExBurn.Embedding.tokenize(model, texts)
    config = ExBurn.Server.Instance.config(name)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.Server.Models.lookup(config, @emb) != nil end, 6_000)
    served = ExBurn.Server.Models.lookup(config, @emb).model

    traced = [
      {ExBurn.Native, :embedder_tokenize, 2},
      {ExBurn.Native, :embedder_embed, 2},
      {ExBurn.Native, :embedder_embed_ids, 2},
      {ExBurn.Serving.Batcher, :run, 3},
      {ExBurn.Serving.Batcher, :run_many, 3}
    ]

    for mfa <- traced, do: :erlang.trace_pattern(mfa, true, [:global])
    :erlang.trace(:all, true, [:call])

    try do
      assert {200, _, body} = post(url, "/v1/embeddings", %{model: @emb, input: texts})
      tokens = ids |> Enum.map(&length/1) |> Enum.sum()
      assert body["usage"] == %{"prompt_tokens" => tokens, "total_tokens" => tokens}
    after
      :erlang.trace(:all, false, [:call])
      for mfa <- traced, do: :erlang.trace_pattern(mfa, false, [:global])
    end

    calls = traced_calls([])
    # the served model's own calls (other tests' models are not this one)
    native = for {f, [ref | args]} <- calls, ref == served.ref, do: {f, args}
    assert [{:embedder_tokenize, [^texts]}] = Enum.filter(native, &(elem(&1, 0) == :embedder_tokenize))
    assert Enum.filter(native, &(elem(&1, 0) == :embedder_embed)) == []

    # the batch embedded exactly the request's rows (several calls if it was split)
    embedded = for {:embedder_embed_ids, [rows]} <- native, row <- rows, do: row
    assert Enum.sort(embedded) == Enum.sort(ids)

    assert [{:run_many, [_server, rows, _timeout]}] = for({f, _} = c <- calls, f in [:run, :run_many], do: c)
    assert rows == Enum.map(ids, &{:token_ids, &1})
  end

  defp traced_calls(acc) do
    receive do
      {:trace, _pid, :call, {_module, f, args}} -> traced_calls([{f, args} | acc])
    after
      100 -> Enum.reverse(acc)
    end
  end

  test "a request of several texts gives each text's own vector and usage", %{url: url} do
    texts = [
      "The sky is blue.",
      "Le ciel est bleu, et la mer aussi.",
      "7",
      "A much longer sentence " <> String.duplicate("with many words ", 12)
    ]

    singles =
      for text <- texts do
        assert {200, _, body} = post(url, "/v1/embeddings", %{model: @emb, input: text})
        assert [%{"index" => 0, "embedding" => vector}] = body["data"]
        {vector, body["usage"]["prompt_tokens"]}
      end

    assert {200, _, body} = post(url, "/v1/embeddings", %{model: @emb, input: texts})
    assert Enum.map(body["data"], & &1["index"]) == [0, 1, 2, 3]
    assert_vectors(Enum.map(body["data"], & &1["embedding"]), Enum.map(singles, &elem(&1, 0)))
    tokens = singles |> Enum.map(&elem(&1, 1)) |> Enum.sum()
    assert Enum.all?(singles, &(elem(&1, 1) > 2))
    assert body["usage"] == %{"prompt_tokens" => tokens, "total_tokens" => tokens}
  end

  # Equal to the direct call's vectors up to the last bits: the texts sharing a call change the
  # kernel (calls of a few tokens run on the host, longer ones through gemm); a mixed-up row
  # would be ~0.1 away.
  defp assert_vectors(got, want) do
    assert length(got) == length(want)

    for {g, w} <- Enum.zip(got, want) do
      assert length(g) == length(w)
      assert Enum.zip_with(g, w, &abs(&1 - &2)) |> Enum.max() < 1.0e-6
    end
  end

  test "a model of the wrong kind is a 400", %{url: url} do
    assert {400, _, %{"error" => %{"param" => "model", "code" => "wrong_model_kind"}}} =
             post(url, "/v1/embeddings", %{model: @llm, input: "x"})

    assert {400, _, %{"error" => %{"code" => "wrong_model_kind"}}} =
             post(url, "/v1/chat/completions", %{model: @emb, messages: [%{role: "user", content: "x"}]})
  end

  test "/v1/completions gives ExBurn.LLM.generate's text and usage", %{url: url, llm: llm} do
    {:ok, direct} = ExBurn.LLM.generate(llm, "The capital of France is", max_tokens: 8, greedy: true)

    assert {200, _, body} =
             post(url, "/v1/completions", %{
               model: @llm,
               prompt: "The capital of France is",
               max_tokens: 8,
               temperature: 0
             })

    assert body["object"] == "text_completion" and String.starts_with?(body["id"], "cmpl-")
    assert [%{"text" => text, "index" => 0, "finish_reason" => "length", "logprobs" => nil}] = body["choices"]
    assert text == direct.text

    assert body["usage"] == %{
             "prompt_tokens" => direct.usage.prompt_tokens,
             "completion_tokens" => 8,
             "total_tokens" => direct.usage.prompt_tokens + 8
           }

    # a stop string ends it early, with finish_reason "stop"
    stop = String.slice(direct.text, 3, 2)

    {:ok, stopped} =
      ExBurn.LLM.generate(llm, "The capital of France is", max_tokens: 8, greedy: true, stop: [stop])

    assert {200, _, body} =
             post(url, "/v1/completions", %{
               model: @llm,
               prompt: "The capital of France is",
               max_tokens: 8,
               temperature: 0,
               stop: stop
             })

    assert [%{"text" => stopped_text, "finish_reason" => "stop"}] = body["choices"]
    assert stopped_text == stopped.text and stopped.finish_reason == :stop
  end

  test "/v1/chat/completions, plain and streamed, gives the chat template's generation", %{url: url, llm: llm} do
    messages = [%{role: "system", content: "You are terse."}, %{role: "user", content: "Name a fruit."}]
    {:ok, direct} = ExBurn.LLM.generate(llm, messages, max_tokens: 10, greedy: true)
    request = %{model: @llm, messages: messages, max_tokens: 10, temperature: 0}

    assert {200, _, body} = post(url, "/v1/chat/completions", request)
    assert body["object"] == "chat.completion" and String.starts_with?(body["id"], "chatcmpl-")

    assert [
             %{
               "index" => 0,
               "message" => %{"role" => "assistant", "content" => content},
               "finish_reason" => "length"
             }
           ] = body["choices"]

    assert content == direct.text
    assert body["usage"]["prompt_tokens"] == direct.usage.prompt_tokens

    {200, headers, stream} =
      Support.http(:post, url <> "/v1/chat/completions",
        body: Map.merge(request, %{stream: true, stream_options: %{include_usage: true}})
      )

    assert headers["content-type"] == "text/event-stream"
    events = Support.sse_data(stream)
    assert List.last(events) == :done
    chunks = Enum.drop(events, -1)
    assert Enum.all?(chunks, &(&1["object"] == "chat.completion.chunk" and &1["id"] == hd(chunks)["id"]))
    assert [%{"delta" => %{"role" => "assistant"}} | _] = hd(chunks)["choices"]

    text = chunks |> Enum.flat_map(& &1["choices"]) |> Enum.map_join(&(&1["delta"]["content"] || ""))
    assert text == direct.text

    finishes =
      chunks |> Enum.flat_map(& &1["choices"]) |> Enum.map(& &1["finish_reason"]) |> Enum.reject(&is_nil/1)

    assert finishes == ["length"]
    usage = List.last(chunks)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
  end

  unless System.find_executable("curl"), do: @tag(skip: "curl is not installed")

  test "curl -N receives the stream as it is generated, ending in [DONE]", %{url: url, llm: llm} do
    {:ok, direct} = ExBurn.LLM.generate(llm, "Once upon a time", max_tokens: 12, greedy: true)

    body =
      ExBurn.JSON.encode!(%{
        model: @llm,
        prompt: "Once upon a time",
        max_tokens: 12,
        temperature: 0,
        stream: true
      })

    {out, 0} =
      System.cmd("curl", ["-sN", "-H", "Content-Type: application/json", "-d", body, url <> "/v1/completions"])

    events = Support.sse_data(out)
    assert List.last(events) == :done
    text = events |> Enum.drop(-1) |> Enum.flat_map(& &1["choices"]) |> Enum.map_join(& &1["text"])
    assert text == direct.text
    assert length(events) > 3
  end

  test "/api/v1/llm/inference and /api/v1/llm/stream", %{url: url, llm: llm} do
    {:ok, direct} = ExBurn.LLM.generate(llm, "Water boils at", max_tokens: 6, greedy: true)

    assert {200, _, body} =
             post(url, "/api/v1/llm/inference", %{prompt: "Water boils at", max_tokens: 6, greedy: true})

    assert %{
             "model" => @llm,
             "text" => text,
             "finish_reason" => "length",
             "usage" => usage,
             "timing" => timing
           } = body

    assert text == direct.text

    assert usage == %{
             "prompt_tokens" => direct.usage.prompt_tokens,
             "completion_tokens" => 6,
             "total_tokens" => direct.usage.prompt_tokens + 6
           }

    assert timing["total_ms"] > 0

    {200, headers, stream} =
      Support.http(:post, url <> "/api/v1/llm/stream",
        body: %{model: @llm, prompt: "Water boils at", max_tokens: 6, greedy: true}
      )

    assert headers["content-type"] == "text/event-stream"
    events = Support.sse_events(stream)
    {tokens, [{"done", done}]} = Enum.split_while(events, fn {event, _} -> event == "token" end)
    assert Enum.map_join(tokens, fn {_, data} -> data["text"] end) == direct.text
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 6

    messages = [%{role: "user", content: "Hi"}]
    {:ok, chat} = ExBurn.LLM.generate(llm, messages, max_tokens: 4, greedy: true)

    assert {200, _, %{"text" => chat_text}} =
             post(url, "/api/v1/llm/inference", %{messages: messages, max_tokens: 4, greedy: true})

    assert chat_text == chat.text
  end

  test "a client killed mid-stream stops its generation and does not disturb another stream", %{
    name: name,
    url: url,
    llm: llm
  } do
    port = ExBurn.Server.port(name)
    server = llm_server(name)
    {200, _, metrics} = Support.http(:get, url <> "/metrics")
    aborted = Support.metric(metrics, ~s(exburn_http_requests_aborted_total{route="/v1/chat/completions"}))
    test = self()

    request = fn tokens, content ->
      %{
        model: @llm,
        messages: [%{role: "user", content: content}],
        max_tokens: tokens,
        temperature: 0,
        stream: true
      }
    end

    # A: a long stream whose client dies after its first tokens
    a =
      spawn(fn ->
        socket = Support.raw_post(port, "/v1/chat/completions", request.(2_000, "Count to a thousand."))
        Support.recv_until(socket, "\"content\":\"")
        send(test, :a_streaming)
        Process.sleep(:infinity)
      end)

    assert_receive :a_streaming, 60_000

    # B: queued behind A (one generation at a time), must come out whole
    {:ok, expected} =
      ExBurn.LLM.generate(llm, [%{role: "user", content: "Name a planet."}], max_tokens: 12, greedy: true)

    b =
      Task.async(fn ->
        Support.http(:post, url <> "/v1/chat/completions", body: request.(12, "Name a planet."))
      end)

    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).queued == 1 end)

    Process.exit(a, :kill)
    {200, _, stream} = Task.await(b, 120_000)
    events = Support.sse_data(stream)
    assert List.last(events) == :done

    text =
      events
      |> Enum.drop(-1)
      |> Enum.flat_map(& &1["choices"])
      |> Enum.map_join(&(&1["delta"]["content"] || ""))

    assert text == expected.text

    assert %{running: 0, queued: 0} = ExBurn.LLM.Scheduler.info(server)
    {200, _, metrics} = Support.http(:get, url <> "/metrics")

    assert Support.metric(metrics, ~s(exburn_http_requests_aborted_total{route="/v1/chat/completions"})) ==
             aborted + 1
  end

  test "a client that hangs up while its request is queued leaves the queue", %{name: name} do
    port = ExBurn.Server.port(name)
    server = llm_server(name)
    test = self()

    holder =
      spawn(fn ->
        body = %{model: @llm, prompt: "Count to a thousand:", max_tokens: 2_000, temperature: 0, stream: true}
        socket = Support.raw_post(port, "/v1/completions", body)
        Support.recv_until(socket, "\"text\":\"")
        send(test, :holding)
        Process.sleep(:infinity)
      end)

    assert_receive :holding, 60_000

    waiting =
      spawn(fn ->
        body = %{model: @llm, messages: [%{role: "user", content: "Hi"}], max_tokens: 50}
        _socket = Support.raw_post(port, "/v1/chat/completions", body)
        Process.sleep(:infinity)
      end)

    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).queued == 1 end)
    Process.exit(waiting, :kill)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).queued == 0 end)
    assert ExBurn.LLM.Scheduler.info(server).running == 1

    Process.exit(holder, :kill)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).running == 0 end)
  end

  test "a client that hangs up during a non-streamed generation stops it", %{name: name} do
    port = ExBurn.Server.port(name)
    server = llm_server(name)

    client =
      spawn(fn ->
        body = %{model: @llm, prompt: "Count to a thousand:", max_tokens: 2_000, temperature: 0}
        _socket = Support.raw_post(port, "/v1/completions", body)
        Process.sleep(:infinity)
      end)

    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).running == 1 end)
    Process.exit(client, :kill)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.LLM.Scheduler.info(server).running == 0 end)
  end

  test "a model process that dies is restarted and serves the next request", %{name: name, url: url, llm: llm} do
    old = llm_server(name)
    ref = Process.monitor(old)
    Process.exit(old, :kill)
    assert_receive {:DOWN, ^ref, :process, _, :killed}

    {:ok, direct} = ExBurn.LLM.generate(llm, "Hello", max_tokens: 3, greedy: true)

    assert {200, _, body} =
             post(url, "/v1/completions", %{model: @llm, prompt: "Hello", max_tokens: 3, temperature: 0})

    assert [%{"text" => text}] = body["choices"]
    assert text == direct.text
    assert llm_server(name) != old
  end

  test "stopping drains: new requests get 503, the stream in flight finishes", %{llm: llm} do
    name = :models_http_drain_test
    {:ok, sup} = ExBurn.Server.start_link(name: name, port: 0, token: nil, preload: [@llm])
    Process.unlink(sup)
    port = ExBurn.Server.port(name)
    {:ok, direct} = ExBurn.LLM.generate(llm, "Once upon a time", max_tokens: 40, greedy: true)

    socket =
      Support.raw_post(port, "/v1/completions", %{
        model: @llm,
        prompt: "Once upon a time",
        max_tokens: 40,
        temperature: 0,
        stream: true
      })

    first = Support.recv_until(socket, "\"text\":\"")

    stopper = Task.async(fn -> ExBurn.Server.stop(name) end)

    ExBurn.TestHelpers.wait_until(fn ->
      ExBurn.Server.Instance.draining?(ExBurn.Server.Instance.config(name))
    end)

    {503, head, body} = Support.raw_get(port, "/api/v1/health")
    assert %{"error" => %{"code" => "unavailable"}} = ExBurn.JSON.decode!(body)
    assert head =~ "Retry-After: 5"

    response = Support.recv_until(socket, "\r\n0\r\n\r\n", first)
    events = Support.sse_data(Support.dechunk(response))
    assert List.last(events) == :done

    assert events |> Enum.drop(-1) |> Enum.flat_map(& &1["choices"]) |> Enum.map_join(& &1["text"]) ==
             direct.text

    assert :ok = Task.await(stopper, 60_000)

    # :httpd closes its listening socket shortly after stop returns: the port refuses soon after
    ExBurn.TestHelpers.wait_until(fn ->
      case :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false]) do
        {:error, :econnrefused} -> true
        {:ok, s} -> :gen_tcp.close(s) && false
      end
    end)
  end
end
