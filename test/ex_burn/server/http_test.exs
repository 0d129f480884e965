Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.HttpTest do
  # The :httpd adapter over real sockets (:httpc, curl, raw TCP), without models: status codes
  # and JSON errors on the wire, body limits, keep-alive, restarts by the supervisor, and
  # requests no HTTP client would send.
  use ExUnit.Case, async: false

  alias ExBurn.ServerTest.Support

  defp start(opts \\ []) do
    name = :"http_test_#{System.unique_integer([:positive])}"
    opts = Keyword.merge([name: name, port: 0, models_dir: Support.empty_dir(), token: nil], opts)
    start_supervised!({ExBurn.Server, opts})
    {name, ExBurn.Server.url(name)}
  end

  test "JSON answers and errors over HTTP" do
    {_name, url} = start()

    assert {200, headers, %{"status" => "ok"}} = Support.http_json(:get, url <> "/api/v1/health")
    assert headers["content-type"] == "application/json"
    assert {200, _, %{"object" => "list", "data" => []}} = Support.http_json(:get, url <> "/v1/models")
    assert {404, _, %{"error" => %{"code" => "not_found"}}} = Support.http_json(:get, url <> "/v2/nothing")

    assert {400, _, %{"error" => %{"code" => "invalid_json", "type" => "invalid_request_error"}}} =
             Support.http_json(:post, url <> "/v1/embeddings", body: "{\"model\": ")

    assert {404, _, %{"error" => %{"code" => "model_not_found"}}} =
             Support.http_json(:post, url <> "/v1/embeddings", body: %{model: "nope", input: "hi"})

    assert {405, headers, _} = Support.http_json(:put, url <> "/api/v1/health", body: "{}")
    assert headers["allow"] == "GET"
  end

  test "auth and rate limits over HTTP" do
    {_name, url} = start(token: "tok", rate_limit: [per_second: 0.2, burst: 2])
    auth = [headers: [{"authorization", "Bearer tok"}]]

    assert {401, headers, %{"error" => %{"type" => "authentication_error"}}} =
             Support.http_json(:get, url <> "/v1/models")

    assert headers["www-authenticate"] =~ "Bearer"
    assert {200, _, _} = Support.http_json(:get, url <> "/v1/models", auth)
    assert {200, _, _} = Support.http_json(:get, url <> "/v1/models", auth)

    assert {429, headers, %{"error" => %{"code" => "rate_limit_exceeded"}}} =
             Support.http_json(:get, url <> "/v1/models", auth)

    assert String.to_integer(headers["retry-after"]) >= 1
  end

  test "a body over the limit is read, dropped and answered with a JSON 413" do
    # over the limit, under the 8x limit where :httpd refuses without reading; more than one
    # 64 KiB piece
    {_name, url} = start(body_limit: 20_000)
    big = ExBurn.JSON.encode!(%{model: "m", input: String.duplicate("word ", 30_000)})

    assert {413, _, %{"error" => %{"code" => "body_too_large", "type" => "invalid_request_error"}}} =
             Support.http_json(:post, url <> "/v1/embeddings", body: big)

    # the server still serves
    assert {200, _, _} = Support.http_json(:get, url <> "/api/v1/health")
  end

  test "a declared length far over the limit is refused before the body is read" do
    {name, _url} = start(body_limit: 1_000)
    port = ExBurn.Server.port(name)
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])

    :ok =
      :gen_tcp.send(socket, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")

    {:ok, answer} = :gen_tcp.recv(socket, 0, 10_000)
    assert answer =~ ~r{^HTTP/1.1 413}
    :gen_tcp.close(socket)
  end

  unless System.find_executable("curl"), do: @tag(skip: "curl is not installed")

  test "curl gets the same answers" do
    curl = System.find_executable("curl")
    {_name, url} = start(token: "tok")

    {out, 0} = System.cmd(curl, ["-s", "-w", "\n%{http_code}", url <> "/api/v1/health"])
    [body, code] = String.split(out, "\n")
    assert code == "200"
    assert %{"status" => "ok"} = ExBurn.JSON.decode!(body)

    {out, 0} =
      System.cmd(curl, ["-s", "-w", "\n%{http_code}", "-H", "Authorization: Bearer tok", url <> "/v1/models"])

    assert String.ends_with?(out, "\n200")

    {out, 0} =
      System.cmd(curl, [
        "-s",
        "-w",
        "\n%{http_code}",
        "-d",
        "{oops",
        "-H",
        "Authorization: Bearer tok",
        url <> "/v1/completions"
      ])

    [body, code] = String.split(out, "\n")
    assert code == "400"
    assert %{"error" => %{"code" => "invalid_json"}} = ExBurn.JSON.decode!(body)
  end

  test "keep-alive connections serve several requests, and bad requests do not hurt the server" do
    {name, url} = start()
    port = ExBurn.Server.port(name)
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])

    for _ <- 1..3 do
      :ok = :gen_tcp.send(socket, "GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
      answer = Support.recv_until(socket, &String.ends_with?(&1, "}"))
      assert answer =~ ~r{^HTTP/1.1 200}
      assert answer =~ ~s("status":"ok")
    end

    :gen_tcp.close(socket)

    for garbage <- [
          "\r\n\r\n",
          "GET\r\n\r\n",
          "FOO / HTTP/1.1\r\n\r\n",
          :rand.bytes(300),
          "GET / HTTP/9.9\r\n\r\n"
        ] do
      {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])
      :gen_tcp.send(socket, garbage)
      :gen_tcp.recv(socket, 0, 2_000)
      :gen_tcp.close(socket)
    end

    assert {200, _, _} = Support.http_json(:get, url <> "/api/v1/health")
  end

  test "a listener killed under its supervisor comes back on the same port and serves" do
    port = Support.free_port()
    {name, url} = start(port: port)
    assert {200, _, _} = Support.http_json(:get, url <> "/api/v1/health")

    # three times (the supervisor's default intensity allows three restarts in five seconds):
    # the restarted listener can meet its predecessor's :httpd still stopping
    for _ <- 1..3 do
      {_, listener, _, _} = Supervisor.which_children(name) |> List.keyfind(ExBurn.Server.Httpd, 0)
      ref = Process.monitor(listener)

      # (the killed :httpd supervisor's report is not this test's output)
      ExUnit.CaptureLog.capture_log(fn ->
        Process.exit(listener, :kill)
        assert_receive {:DOWN, ^ref, :process, _, :killed}

        ExBurn.TestHelpers.wait_until(fn ->
          match?(
            {_, pid, _, _} when is_pid(pid) and pid != listener,
            Supervisor.which_children(name) |> List.keyfind(ExBurn.Server.Httpd, 0)
          )
        end)
      end)

      assert ExBurn.Server.port(name) == port
      # :httpc may first reuse its kept-alive connection to the killed listener, which the
      # server closed: a client's stale connection, not the server's answer
      ExBurn.TestHelpers.wait_until(fn ->
        match?({:ok, {{_, 200, _}, _, _}}, :httpc.request(:get, {url <> "/api/v1/health", []}, [], []))
      end)

      assert {200, _, %{"status" => "ok"}} = Support.http_json(:get, url <> "/api/v1/health")
    end
  end

  test "stopping the server closes its port" do
    {name, url} = start()
    port = ExBurn.Server.port(name)
    assert {200, _, _} = Support.http_json(:get, url <> "/api/v1/health")
    :ok = stop_supervised(name)
    # the listener may still be closing when stop returns (a connect then gets :econnreset)
    ExBurn.TestHelpers.wait_until(fn ->
      :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false]) == {:error, :econnrefused}
    end)
  end
end
