Code.require_file("../server/support.exs", __DIR__)

defmodule ExBurn.LLM.ReplicasPeerTest.Distribution do
  @moduledoc false
  # Whether this node can take part in distribution (epmd, :peer): nil, or why not. Probed when
  # the test module compiles, so that the tests skip with that reason instead of failing.

  def unavailable do
    cond do
      not Code.ensure_loaded?(:peer) -> "OTP's :peer module is missing (OTP 25 or later needed)"
      Node.alive?() -> nil
      epmd() == nil -> "epmd was not found (needed for distribution)"
      true -> probe()
    end
  end

  # In an OS process of its own: this runs while ExUnit compiles the test files in parallel, and
  # starting and stopping distribution in this VM then renames the pids the compiler's servers
  # hand out ("no connection to ex_burn_replicas_probe_...").
  defp probe do
    erl = System.find_executable("erl")

    with {_, 0} <- System.cmd(epmd(), ["-daemon"], stderr_to_stdout: true),
         true <- erl != nil || {"erl was not found", 1},
         name = "ex_burn_replicas_probe_#{System.unique_integer([:positive])}@127.0.0.1",
         {_, 0} <- System.cmd(erl, ["-name", name, "-noshell", "-eval", "halt(0)."], stderr_to_stdout: true) do
      nil
    else
      {out, status} -> "distribution could not start (exit #{status}): #{String.trim(out)}"
    end
  end

  def epmd do
    System.find_executable("epmd") ||
      List.first(Path.wildcard(Path.join(:code.root_dir(), "erts-*/bin/epmd")))
  end
end

defmodule ExBurn.LLM.ReplicasPeerTest do
  # A replica group across two nodes of this machine: a peer node (OTP's :peer) loads the
  # model and starts a scheduler in the group; requests from this node reach it through
  # :pg, and give the text of ExBurn.LLM here.
  use ExUnit.Case, async: false
  import ExBurn.TestHelpers, only: [wait_until: 1]

  alias ExBurn.LLM.ReplicasPeerTest.Distribution
  alias ExBurn.LLM.Scheduler
  alias ExBurn.ServerTest.Support

  @moduletag :distributed
  @moduletag timeout: 300_000
  @moduletag skip:
               (Support.installed(:llm, Support.llm_id()) == nil && "LLM #{Support.llm_id()} is not installed") ||
                 Distribution.unavailable()

  # NIF resources do not cross nodes, and functions of this (in-memory) test module cannot run
  # on the peer: the peer loads its own model through this module, loaded there as object code.
  @peer_helper """
  defmodule ExBurn.LLM.ReplicasPeerTest.Replica do
    def start(id, dir, group) do
      {:ok, model} = ExBurn.LLM.load(id, dir: dir)
      {:ok, pid} = ExBurn.LLM.Scheduler.start_link(model, group: group, max_concurrent: 2)
      # outlives the erpc call that started it (the peer itself is stopped by on_exit)
      Process.unlink(pid)
      pid
    end
  end
  """

  setup_all do
    started_dist? =
      if Node.alive?() do
        false
      else
        {:ok, _} =
          Node.start(:"ex_burn_replicas_test_#{System.unique_integer([:positive])}@127.0.0.1", :longnames)

        true
      end

    name = :"ex_burn_replicas_peer_#{System.unique_integer([:positive])}"
    {:ok, peer, node} = :peer.start(%{name: name, host: ~c"127.0.0.1", longnames: true})

    on_exit(fn ->
      :peer.stop(peer)
      if started_dist?, do: Node.stop()
    end)

    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])

    for app <- [:elixir, :logger, :ex_burn],
        do: {:ok, _} = :erpc.call(node, :application, :ensure_all_started, [app])

    [{mod, bin}] = Code.compile_string(@peer_helper)
    {:module, ^mod} = :erpc.call(node, :code, :load_binary, [mod, ~c"replica.ex", bin])

    {:ok, model} = ExBurn.LLM.load(Support.llm_id())
    %{node: node, helper: mod, model: model}
  end

  test "a request from this node is served by the replica on the peer", %{
    node: node,
    helper: helper,
    model: model
  } do
    group = {:replicas_peer_test, System.unique_integer([:positive])}
    remote = :erpc.call(node, helper, :start, [Support.llm_id(), ExBurn.Models.dir(), group], 120_000)
    assert node(remote) == node

    # :pg on this node learns of the peer's member
    wait_until(fn -> Scheduler.members(group) == [remote] end)

    prompt = [%{role: "user", content: "Name a color."}]
    direct = ExBurn.LLM.generate!(model, prompt, max_tokens: 12, greedy: true)
    assert {:ok, result} = Scheduler.generate({:group, group}, prompt, max_tokens: 12, greedy: true)
    assert {result.text, result.usage} == {direct.text, direct.usage}

    assert Scheduler.stream({:group, group}, prompt, max_tokens: 12, greedy: true) |> Enum.join() ==
             direct.text

    # with a busy replica here, the next request goes to the idle one there
    local = start_supervised!({Scheduler, model: model, group: group, max_concurrent: 1})
    wait_until(fn -> length(Scheduler.members(group)) == 2 end)
    {:ok, blocker} = Scheduler.request(local, "Count to a thousand:", max_tokens: 2_000, greedy: true)
    assert {:text, _} = Scheduler.await(blocker, 60_000)

    {:ok, ref} = Scheduler.request({:group, group}, "Spell every word:", max_tokens: 2_000, greedy: true)
    assert {:text, _} = Scheduler.await(ref, 60_000)
    assert %{running: 1} = Scheduler.info(remote)
    assert %{running: 1} = Scheduler.info(local)

    members = Scheduler.info({:group, group}).members
    assert Enum.sort(Enum.map(members, &{&1.node, &1.running})) == Enum.sort([{node(), 1}, {node, 1}])

    # cancelled there through the group
    :ok = Scheduler.cancel({:group, group}, ref)
    assert %{running: 0, queued: 0} = Scheduler.info(remote)
    refute_received {Scheduler, ^ref, _}
    :ok = Scheduler.cancel(local, blocker)

    # the peer's replica stops: it leaves the group here too
    :ok = :erpc.call(node, GenServer, :stop, [remote])
    wait_until(fn -> Scheduler.members(group) == [local] end)
  end
end
