Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.PlugTest do
  # ExBurn.Server.Plug through Plug.Test (no HTTP server needed). Plug is not a dependency of
  # ExBurn: this runs where Plug is loaded (EXBURN_LOCAL_DEPS="plug=...,mime=...,plug_crypto=...")
  # and is skipped elsewhere.
  use ExUnit.Case, async: false

  alias ExBurn.ServerTest.Support

  @plug? Code.ensure_loaded?(Plug.Test) and Code.ensure_loaded?(ExBurn.Server.Plug)
  @moduletag skip: !@plug? && "Plug is not loaded"

  # Plug.Test's functions, called at run time (the module compiles without Plug).
  defp conn(method, path, body \\ nil, headers \\ []) do
    conn = apply(Plug.Test, :conn, [method, path, body && ExBurn.JSON.encode!(body)])
    Enum.reduce(headers, conn, fn {k, v}, conn -> apply(Plug.Conn, :put_req_header, [conn, k, v]) end)
  end

  defp call(conn, server),
    do: apply(ExBurn.Server.Plug, :call, [conn, apply(ExBurn.Server.Plug, :init, [[server: server]])])

  defp header(conn, name), do: conn.resp_headers |> List.keyfind(name, 0) |> elem(1)

  defp start(opts) do
    name = :"plug_test_#{System.unique_integer([:positive])}"
    start_supervised!({ExBurn.Server, Keyword.merge([name: name, port: false, token: nil], opts)})
    name
  end

  test "routes, errors, auth and body limits through the plug" do
    server = start(models_dir: Support.empty_dir(), token: "tok", body_limit: 100)

    conn = call(conn(:get, "/api/v1/health"), server)
    assert conn.status == 200
    assert header(conn, "content-type") == "application/json"
    assert %{"status" => "ok"} = ExBurn.JSON.decode!(conn.resp_body)

    conn = call(conn(:get, "/v1/models"), server)
    assert conn.status == 401
    assert %{"error" => %{"type" => "authentication_error"}} = ExBurn.JSON.decode!(conn.resp_body)

    auth = [{"authorization", "Bearer tok"}]
    conn = call(conn(:get, "/v1/models", nil, auth), server)
    assert conn.status == 200 and ExBurn.JSON.decode!(conn.resp_body) == %{"object" => "list", "data" => []}

    conn = call(conn(:post, "/v1/embeddings", %{model: "m", input: String.duplicate("x", 500)}, auth), server)
    assert conn.status == 413

    conn = call(conn(:post, "/v1/embeddings", %{model: "nope", input: "x"}, auth), server)
    assert conn.status == 404
    assert %{"error" => %{"code" => "model_not_found"}} = ExBurn.JSON.decode!(conn.resp_body)
  end

  if Support.skip_without_models(), do: @tag(skip: Support.skip_without_models())

  test "embeddings and a streamed chat through the plug" do
    server = start(preload: :all)
    {:ok, model} = ExBurn.Embedding.load(Support.embedding_id())
    {:ok, llm} = ExBurn.LLM.load(Support.llm_id())

    conn = call(conn(:post, "/v1/embeddings", %{model: Support.embedding_id(), input: ["a", "b c"]}), server)
    assert conn.status == 200
    vectors = ExBurn.JSON.decode!(conn.resp_body)["data"] |> Enum.map(& &1["embedding"])
    assert vectors == ExBurn.Embedding.embed!(model, ["a", "b c"])

    messages = [%{role: "user", content: "Hi"}]
    {:ok, direct} = ExBurn.LLM.generate(llm, messages, max_tokens: 8, greedy: true)
    body = %{model: Support.llm_id(), messages: messages, max_tokens: 8, temperature: 0, stream: true}
    conn = call(conn(:post, "/v1/chat/completions", body), server)
    assert conn.status == 200
    assert conn.state == :chunked
    assert header(conn, "content-type") == "text/event-stream"
    events = Support.sse_data(conn.resp_body)
    assert List.last(events) == :done

    text =
      events
      |> Enum.drop(-1)
      |> Enum.flat_map(& &1["choices"])
      |> Enum.map_join(&(&1["delta"]["content"] || ""))

    assert text == direct.text
  end
end
