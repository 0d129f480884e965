Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.ReplicasHttpTest do
  # The server's :replicas option with the real SmolLM2 model: two copies of the LLM, each with
  # its scheduler (warmed up first), share the HTTP requests, answer with ExBurn.LLM's text, and
  # stop a stream whose client hangs up on whichever replica runs it.
  use ExUnit.Case, async: false
  import ExBurn.TestHelpers, only: [wait_until: 1]

  alias ExBurn.LLM.Scheduler
  alias ExBurn.ServerTest.Support

  @llm Support.llm_id()

  @moduletag skip: Support.installed(:llm, @llm) == nil && "LLM #{@llm} is not installed"
  @moduletag timeout: 300_000

  setup_all do
    name = :replicas_http_test
    opts = [name: name, port: 0, token: nil, preload: [@llm], max_concurrent: 2, warmup: true]
    start_supervised!({ExBurn.Server, opts ++ [replicas: [{:cpu, 0}, {:cpu, 0}]]})
    {:ok, llm} = ExBurn.LLM.load(@llm)

    config = ExBurn.Server.Instance.config(name)
    ExBurn.TestHelpers.wait_until(fn -> ExBurn.Server.Models.lookup(config, @llm) != nil end, 6_000)
    %{name: name, llm: llm, server: ExBurn.Server.Models.lookup(config, @llm).server}
  end

  test "the replicas share the requests and answer with ExBurn.LLM's text", %{
    name: name,
    llm: llm,
    server: server
  } do
    assert {:group, group} = server
    assert [a, b] = Scheduler.members(group)
    assert a != b and node(a) == node() and node(b) == node()
    # `warmup: true` ran each replica at every batch size of its steps before it joined
    for member <- [a, b], do: assert(%{warmup: %{batch_sizes: [1, 2]}} = Scheduler.info(member))

    port = ExBurn.Server.port(name)
    test = self()

    # one at a time, each running before the next comes, so each sees the others' load
    clients =
      for i <- 1..4 do
        pid =
          spawn(fn ->
            body = %{
              model: @llm,
              prompt: "Count to #{i} thousand:",
              max_tokens: 2_000,
              temperature: 0,
              stream: true
            }

            socket = Support.raw_post(port, "/v1/completions", body)
            Support.recv_until(socket, "\"text\":\"")
            send(test, {:streaming, i})
            Process.sleep(:infinity)
          end)

        assert_receive {:streaming, ^i}, 60_000
        pid
      end

    assert %{running: 2, queued: 0} = Scheduler.info(a)
    assert %{running: 2, queued: 0} = Scheduler.info(b)

    # clients that hang up stop their generations, wherever they run
    Enum.each(clients, &Process.exit(&1, :kill))
    wait_until(fn -> Scheduler.info({:group, group}).running == 0 end)

    {:ok, direct} = ExBurn.LLM.generate(llm, "The capital of France is", max_tokens: 8, greedy: true)
    url = ExBurn.Server.url(name)
    request = %{model: @llm, prompt: "The capital of France is", max_tokens: 8, temperature: 0}

    for _ <- 1..2 do
      assert {200, _, body} = Support.http_json(:post, url <> "/v1/completions", body: request)
      assert [%{"text" => text}] = body["choices"]
      assert text == direct.text
    end
  end

  test ":replicas is a count or a list of devices" do
    assert ExBurn.Server.config!(replicas: 2).replicas == [[], []]

    assert ExBurn.Server.config!(replicas: ["cpu", {:cpu, 0}]).replicas == [
             [device: {:cpu, 0}],
             [device: {:cpu, 0}]
           ]

    assert ExBurn.Server.config!([]).replicas == nil

    for bad <- [0, [], :many] do
      assert_raise ExBurn.Error, ~r/:replicas must be/, fn -> ExBurn.Server.config!(replicas: bad) end
    end

    assert_raise ExBurn.Error, ~r/invalid device/, fn -> ExBurn.Server.config!(replicas: [:abacus]) end
  end
end
