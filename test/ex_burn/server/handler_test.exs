Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.HandlerTest do
  # The request handling without HTTP (ExBurn.Server.Handler.serve/3 with a collecting
  # responder) and without models: routing, authentication, rate limits, body limits, bad
  # input, draining and metrics. Not async: one test sets EXBURN_API_TOKEN.
  use ExUnit.Case, async: false

  alias ExBurn.Server.{Handler, Instance, Request, Response}
  alias ExBurn.ServerTest.Support

  defp start(opts \\ []) do
    name = :"handler_test_#{System.unique_integer([:positive])}"
    opts = Keyword.merge([name: name, port: false, models_dir: Support.empty_dir(), token: nil], opts)
    start_supervised!({ExBurn.Server, opts})
    name
  end

  defp call(name, method, path, opts \\ []) do
    body =
      case Keyword.get(opts, :body, "") do
        b when is_binary(b) or b == :too_large -> b
        other -> ExBurn.JSON.encode!(other)
      end

    request = %Request{
      method: method,
      path: path,
      headers: Keyword.get(opts, :headers, []),
      body: body,
      peer: Keyword.get(opts, :peer, "10.0.0.1")
    }

    %Response{} = response = Handler.serve(name, request, fn response -> {:ok, response} end)
    response
  end

  defp json(%Response{body: body}), do: body |> IO.iodata_to_binary() |> ExBurn.JSON.decode!()

  defp header(%Response{headers: headers}, name),
    do: Enum.find_value(headers, fn {k, v} -> if k == name, do: v end)

  defp assert_error(response, status, fields \\ %{}) do
    assert response.status == status
    assert header(response, "content-type") == "application/json"
    assert %{"error" => error} = json(response)
    assert Map.keys(error) |> Enum.sort() == ["code", "message", "param", "type"]
    assert is_binary(error["message"]) and error["message"] != ""
    for {k, v} <- fields, do: assert(error[k] == v, "#{k}: expected #{inspect(v)}, got #{inspect(error[k])}")
    error
  end

  test "health answers with the server's status" do
    name = start()
    response = call(name, "GET", "/api/v1/health")
    assert response.status == 200
    assert %{"status" => "ok", "models_loaded" => [], "version" => _, "uptime_s" => up} = json(response)
    assert is_integer(up) and up >= 0
    # a trailing slash is the same route
    assert call(name, "GET", "/api/v1/health/").status == 200
  end

  test "hardware reports the devices the native library can use" do
    name = start()
    response = call(name, "GET", "/api/v1/hardware")
    assert response.status == 200
    body = json(response)
    assert "cpu" in body["compiled_backends"]
    assert Enum.any?(body["devices"], &(&1["kind"] == "cpu" and "f32" in &1["dtypes"]))
    assert body["auto"]["device"] == ExBurn.Device.format(elem(ExBurn.Device.auto(), 0))
  end

  test "an empty models directory lists no models" do
    name = start()
    assert json(call(name, "GET", "/api/v1/models")) == %{"models" => []}
    assert json(call(name, "GET", "/v1/models")) == %{"object" => "list", "data" => []}
  end

  test "unknown routes are 404 and wrong methods 405 with Allow" do
    name = start()
    assert_error(call(name, "GET", "/nope"), 404, %{"code" => "not_found"})
    assert_error(call(name, "POST", "/api/v1/health"), 405, %{"code" => "method_not_allowed"})
    assert header(call(name, "GET", "/v1/chat/completions"), "allow") == "POST"
    assert_error(call(name, "DELETE", "/v1/models"), 405)
  end

  test "odd paths are 404s, not crashes" do
    name = start()

    for path <- ["/v1/models/%zz", "/v1/models/%FF%FE", <<"/v1/", 255, 254>>, "/v1/models/a/b", "//", ""] do
      response = call(name, "GET", path)
      assert response.status == 404, inspect(path)
      assert %{"error" => %{"message" => message}} = json(response)
      assert String.valid?(message)
    end
  end

  test "unknown models are 404 in OpenAI's error shape" do
    name = start()

    assert_error(call(name, "GET", "/v1/models/nope"), 404, %{"code" => "model_not_found", "param" => "model"})

    assert_error(call(name, "POST", "/v1/embeddings", body: %{model: "nope", input: "hi"}), 404, %{
      "code" => "model_not_found",
      "type" => "invalid_request_error"
    })

    chat = %{model: "nope", messages: [%{role: "user", content: "hi"}]}
    assert_error(call(name, "POST", "/v1/chat/completions", body: chat), 404, %{"code" => "model_not_found"})
    assert_error(call(name, "POST", "/v1/completions", body: %{model: "nope", prompt: "hi"}), 404)
    # /api/v1 without a model name and no model installed
    assert_error(call(name, "POST", "/api/v1/embeddings", body: %{input: "hi"}), 404)
    assert_error(call(name, "POST", "/api/v1/llm/inference", body: %{prompt: "hi"}), 404)
  end

  test "malformed JSON and wrong fields are 400 naming the parameter" do
    name = start()

    assert_error(call(name, "POST", "/v1/embeddings", body: "{not json"), 400, %{"code" => "invalid_json"})
    assert_error(call(name, "POST", "/v1/embeddings", body: ""), 400, %{"code" => "invalid_json"})
    assert_error(call(name, "POST", "/v1/embeddings", body: "[1, 2]"), 400, %{"code" => "invalid_json"})
    assert_error(call(name, "POST", "/v1/embeddings", body: <<255, 254, 0>>), 400)

    assert_error(call(name, "POST", "/v1/embeddings", body: %{model: "m", input: 5}), 400, %{
      "param" => "input"
    })

    assert_error(call(name, "POST", "/v1/embeddings", body: %{model: "m", input: []}), 400, %{
      "param" => "input"
    })

    assert_error(call(name, "POST", "/v1/embeddings", body: %{model: "m", input: [[1, 2]]}), 400, %{
      "param" => "input"
    })

    assert_error(call(name, "POST", "/v1/embeddings", body: %{input: "x"}), 400, %{"param" => "model"})

    assert_error(
      call(name, "POST", "/v1/embeddings", body: %{model: "m", input: "x", encoding_format: "int8"}),
      400,
      %{
        "param" => "encoding_format"
      }
    )

    chat = fn extra -> Map.merge(%{model: "m", messages: [%{role: "user", content: "hi"}]}, extra) end
    assert_error(call(name, "POST", "/v1/chat/completions", body: chat.(%{n: 2})), 400, %{"param" => "n"})

    assert_error(call(name, "POST", "/v1/chat/completions", body: chat.(%{logprobs: true})), 400, %{
      "param" => "logprobs"
    })

    assert_error(
      call(name, "POST", "/v1/chat/completions", body: chat.(%{tools: [%{type: "function"}]})),
      400,
      %{
        "param" => "tools"
      }
    )

    assert_error(call(name, "POST", "/v1/chat/completions", body: chat.(%{presence_penalty: 1.5})), 400, %{
      "param" => "presence_penalty"
    })

    assert_error(call(name, "POST", "/v1/chat/completions", body: chat.(%{stream: "yes"})), 400, %{
      "param" => "stream"
    })

    assert_error(call(name, "POST", "/v1/chat/completions", body: %{model: "m", messages: []}), 400, %{
      "param" => "messages"
    })

    assert_error(
      call(name, "POST", "/v1/chat/completions", body: %{model: "m", messages: [%{content: "no role"}]}),
      400,
      %{
        "param" => "messages[0]"
      }
    )

    image = %{role: "user", content: [%{type: "image_url", image_url: %{url: "x"}}]}
    assert_error(call(name, "POST", "/v1/chat/completions", body: %{model: "m", messages: [image]}), 400)

    assert_error(call(name, "POST", "/v1/completions", body: %{model: "m", prompt: ["a", "b"]}), 400, %{
      "param" => "prompt"
    })

    assert_error(call(name, "POST", "/v1/completions", body: %{model: "m", prompt: [1, 2, 3]}), 400, %{
      "param" => "prompt"
    })

    assert_error(call(name, "POST", "/v1/completions", body: %{model: "m", prompt: "x", echo: true}), 400, %{
      "param" => "echo"
    })

    assert_error(call(name, "POST", "/api/v1/llm/inference", body: %{prompt: 3}), 400, %{"param" => "prompt"})
    assert_error(call(name, "POST", "/api/v1/llm/inference", body: %{}), 400)
  end

  test "generation parameters are checked and mapped to ExBurn.LLM options" do
    config = Instance.config(start())
    options = fn body -> ExBurn.Server.Inference.llm_options(config, body) end

    assert {:ok, opts} =
             options.(%{
               "max_tokens" => 7,
               "temperature" => 0.5,
               "top_p" => 0.9,
               "seed" => 42,
               "stop" => "\n"
             })

    assert opts[:max_tokens] == 7 and opts[:temperature] == 0.5 and opts[:top_p] == 0.9
    assert opts[:seed] == 42 and opts[:stop] == ["\n"]
    assert {:ok, opts} = options.(%{"max_completion_tokens" => 3, "max_tokens" => 9, "temperature" => 0})
    assert opts[:max_tokens] == 3 and opts[:greedy] == true and opts[:temperature] == nil
    assert {:ok, opts} = options.(%{"stop" => ["a", "b"], "top_k" => 0})
    assert opts[:stop] == ["a", "b"] and Keyword.has_key?(opts, :top_k) and opts[:top_k] == nil
    assert {:ok, opts} = options.(%{})
    assert opts[:max_tokens] == config.default_max_tokens
    assert {:ok, opts} = options.(%{"ignore_eos" => true})
    assert opts[:ignore_eos] == true

    for {field, bad} <- [
          {"max_tokens", 0},
          {"max_tokens", "5"},
          {"temperature", 3},
          {"temperature", "hot"},
          {"top_p", 1.5},
          {"seed", 1.5},
          {"stop", [1]},
          {"stop", ""},
          {"greedy", 1},
          {"ignore_eos", "yes"}
        ] do
      assert {:error, response} = options.(%{field => bad})
      assert_error(response, 400, %{"param" => field})
    end
  end

  test "a bearer token is required when configured; health stays open" do
    name = start(token: "s3cret")

    error = assert_error(call(name, "GET", "/v1/models"), 401, %{"type" => "authentication_error"})
    assert error["code"] == "missing_api_key"
    assert header(call(name, "GET", "/v1/models"), "www-authenticate") =~ "Bearer"

    wrong = [{"authorization", "Bearer nope"}]
    assert_error(call(name, "GET", "/v1/models", headers: wrong), 401, %{"code" => "invalid_api_key"})
    assert_error(call(name, "GET", "/v1/models", headers: [{"authorization", "Basic czNjcmV0"}]), 401)
    assert_error(call(name, "GET", "/metrics"), 401)

    right = [{"authorization", "Bearer s3cret"}]
    assert call(name, "GET", "/v1/models", headers: right).status == 200
    assert call(name, "GET", "/v1/models", headers: [{"Authorization", "bearer   s3cret"}]).status == 200
    assert call(name, "GET", "/api/v1/health").status == 200
  end

  test "the token comes from EXBURN_API_TOKEN when not given" do
    System.put_env("EXBURN_API_TOKEN", "from-env")

    try do
      name = :"env_token_#{System.unique_integer([:positive])}"
      start_supervised!({ExBurn.Server, name: name, port: false, models_dir: Support.empty_dir()})
      assert_error(call(name, "GET", "/v1/models"), 401)
      assert call(name, "GET", "/v1/models", headers: [{"authorization", "Bearer from-env"}]).status == 200
    after
      System.delete_env("EXBURN_API_TOKEN")
    end
  end

  test "each client has its own token bucket; over it, 429 with Retry-After" do
    name = start(rate_limit: [per_second: 0.5, burst: 3])

    for _ <- 1..3, do: assert(call(name, "GET", "/v1/models", peer: "10.0.0.1").status == 200)
    limited = call(name, "GET", "/v1/models", peer: "10.0.0.1")
    assert_error(limited, 429, %{"type" => "rate_limit_error", "code" => "rate_limit_exceeded"})
    {retry, ""} = Integer.parse(header(limited, "retry-after"))
    assert retry in 1..2

    # another address, and a client identified by its token, have their own buckets
    assert call(name, "GET", "/v1/models", peer: "10.0.0.2").status == 200
    token = [{"authorization", "Bearer client-a"}]
    for _ <- 1..3, do: assert(call(name, "GET", "/v1/models", peer: "10.0.0.1", headers: token).status == 200)
    assert call(name, "GET", "/v1/models", peer: "10.0.0.9", headers: token).status == 429
    # health is never limited
    assert call(name, "GET", "/api/v1/health", peer: "10.0.0.1").status == 200
  end

  test "bodies over the limit are 413" do
    name = start(body_limit: 100)
    body = ExBurn.JSON.encode!(%{model: "m", input: String.duplicate("a", 200)})
    assert_error(call(name, "POST", "/v1/embeddings", body: body), 413, %{"code" => "body_too_large"})
    # what an adapter passes when it dropped an oversized body unread
    assert_error(call(name, "POST", "/v1/embeddings", body: :too_large), 413)
    assert call(name, "POST", "/v1/embeddings", body: %{model: "m", input: "a"}).status == 404
  end

  test "a draining server refuses requests with 503" do
    name = start()
    config = Instance.config(name)
    Instance.drain(config)
    response = call(name, "GET", "/v1/models")
    assert_error(response, 503, %{"code" => "unavailable"})
    assert header(response, "retry-after") == "5"
    Instance.resume(config)
    assert call(name, "GET", "/v1/models").status == 200
    assert Instance.in_flight(config) == 0
  end

  test "no server is a 503, not a crash" do
    response = Handler.serve(:no_such_server, %Request{path: "/v1/models"}, &{:ok, &1})
    assert_error(response, 503)
  end

  test "metrics count requests by route and status in Prometheus text" do
    name = start()
    for _ <- 1..3, do: call(name, "GET", "/api/v1/health")
    call(name, "GET", "/nope")
    call(name, "POST", "/v1/embeddings", body: "{")

    response = call(name, "GET", "/metrics")
    assert response.status == 200
    assert header(response, "content-type") =~ "text/plain"
    text = IO.iodata_to_binary(response.body)
    assert Support.metric(text, ~s(exburn_http_requests_total{route="/api/v1/health",status="200"})) == 3.0
    assert Support.metric(text, ~s(exburn_http_requests_total{route="unmatched",status="404"})) == 1.0
    assert Support.metric(text, ~s(exburn_http_requests_total{route="/v1/embeddings",status="400"})) == 1.0
    assert Support.metric(text, ~s(exburn_http_request_duration_seconds_count{route="/api/v1/health"})) == 3.0
    assert Support.metric(text, ~s(exburn_http_request_duration_seconds_sum{route="/api/v1/health"})) > 0
    assert text =~ "# TYPE exburn_http_requests_total counter"
  end

  test "whatever a client sends, the answer is a JSON error or success, never a crash" do
    name = start()
    :rand.seed(:exsss, {1, 2, 3})

    routes =
      ~w(/v1/embeddings /v1/completions /v1/chat/completions /api/v1/embeddings /api/v1/llm/inference /api/v1/llm/stream)

    values = [nil, true, -1, 0, 1.5e308, "", "x", [], [nil], %{}, %{"a" => [1]}, String.duplicate("é", 50)]

    fields =
      ~w(model input prompt messages max_tokens temperature top_p seed stop stream n encoding_format stream_options)

    for route <- routes, _ <- 1..30 do
      body =
        for _ <- 1..Enum.random(0..5)//1, into: %{} do
          {Enum.random(fields), Enum.random(values)}
        end

      response = call(name, "POST", route, body: body)
      assert response.status in [400, 404], "#{route} #{inspect(body)} -> #{response.status}"
      assert %{"error" => %{"message" => _}} = json(response)
    end

    for _ <- 1..50 do
      garbage = :rand.bytes(Enum.random(0..64))
      assert call(name, "POST", Enum.random(routes), body: garbage).status == 400
    end
  end

  @tag :telemetry
  test "each request emits [:ex_burn, :server, :request]" do
    name = start()
    test = self()
    id = "server-test-#{inspect(self())}"

    :ok =
      apply(:telemetry, :attach, [
        id,
        [:ex_burn, :server, :request],
        fn _event, measurements, metadata, _ ->
          if metadata.server == name, do: send(test, {:event, measurements, metadata})
        end,
        nil
      ])

    try do
      call(name, "GET", "/v1/models/nope")
      assert_receive {:event, %{duration: d}, meta}
      assert is_integer(d) and d >= 0

      assert meta.route == "/v1/models/:id" and meta.status == 404 and meta.method == "GET" and
               meta.aborted == false
    after
      apply(:telemetry, :detach, [id])
    end
  end
end
