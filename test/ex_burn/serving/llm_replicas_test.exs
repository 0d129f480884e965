Code.require_file("../server/support.exs", __DIR__)

defmodule ExBurn.LLM.ReplicasTest do
  # Replica groups of ExBurn.LLM.Scheduler on this node, with the real SmolLM2 model loaded
  # twice: requests go to the least loaded member, give the text of ExBurn.LLM alone, stay
  # bound to their member (cancel, timeout, alive?, the caller's death), and a stopped member
  # is passed over.
  use ExUnit.Case, async: false
  import ExBurn.TestHelpers, only: [wait_until: 1]

  alias ExBurn.LLM.Scheduler
  alias ExBurn.ServerTest.Support

  @moduletag skip:
               Support.installed(:llm, Support.llm_id()) == nil && "LLM #{Support.llm_id()} is not installed"
  @moduletag timeout: 300_000

  @prompt [%{role: "user", content: "Name a color."}]

  setup_all do
    # one copy of the model per replica, as on separate devices
    {:ok, a} = ExBurn.LLM.load(Support.llm_id())
    {:ok, b} = ExBurn.LLM.load(Support.llm_id())

    # the direct answers are taken before the model serves anything: its saved prompt prefixes
    # are shared by direct calls and its scheduler's, and the reference is the plain path
    direct =
      for n <- [8, 12], into: %{}, do: {n, ExBurn.LLM.generate!(a, @prompt, max_tokens: n, greedy: true)}

    %{models: [a, b], direct: direct}
  end

  setup do
    %{group: {:replicas_test, System.unique_integer([:positive])}}
  end

  defp replicas(models, group, opts \\ []) do
    for {model, i} <- Enum.with_index(models) do
      spec = {Scheduler, [model: model, group: group] ++ opts}
      # not restarted: a test that stops a member wants it gone
      start_supervised!(Supervisor.child_spec(spec, id: {:replica, i}, restart: :temporary))
    end
  end

  defp long(opts \\ []), do: Keyword.merge([max_tokens: 2_000, greedy: true], opts)

  defp held(pid) do
    info = Scheduler.info(pid)
    info.queued + info.running
  end

  test "requests go to the least loaded member and give ExBurn.LLM's text", %{
    models: models,
    group: group,
    direct: %{12 => direct}
  } do
    [a, b] = replicas(models, group, max_concurrent: 4)
    assert Enum.sort(Scheduler.members(group)) == Enum.sort([a, b])

    prompts = ["Count to a thousand:", "Count to a million:", "Name every city:", "Spell every word:"]
    refs = for p <- prompts, do: elem({:ok, _} = Scheduler.request({:group, group}, p, long()), 1)

    # each request went to the member holding fewer at that moment: two each
    assert {held(a), held(b)} == {2, 2}
    for ref <- refs, do: assert({:text, _} = Scheduler.await(ref, 60_000))
    assert %{running: 2} = Scheduler.info(a)
    assert %{running: 2} = Scheduler.info(b)

    info = Scheduler.info({:group, group})
    assert %{group: ^group, running: 4, queued: 0, members: members} = info
    assert Enum.sort(Enum.map(members, & &1.pid)) == Enum.sort([a, b])
    assert Enum.all?(members, &(&1.node == node() and &1.running == 2 and &1.model == hd(models).name))

    for ref <- refs, do: :ok = Scheduler.cancel({:group, group}, ref)
    assert {held(a), held(b)} == {0, 0}
    for ref <- refs, do: refute_received({Scheduler, ^ref, _})

    assert {:ok, result} = Scheduler.generate({:group, group}, @prompt, max_tokens: 12, greedy: true)

    assert {result.text, result.finish_reason, result.usage} ==
             {direct.text, direct.finish_reason, direct.usage}

    pieces = Scheduler.stream({:group, group}, @prompt, max_tokens: 12, greedy: true) |> Enum.to_list()
    assert Enum.join(pieces) == direct.text
  end

  test "a request stays bound to its member: cancel, timeout, alive? and the caller's death",
       %{models: models, group: group} do
    [a, b] = replicas(models, group, max_concurrent: 1)
    {:ok, r1} = Scheduler.request({:group, group}, "Count to a thousand:", long())
    # prompts whose greedy answers run to max_tokens: one that meets its end-of-sequence (a
    # short list) could finish before the assertions below
    {:ok, r2} = Scheduler.request({:group, group}, "Spell every word:", long())
    assert {:text, _} = Scheduler.await(r1, 60_000)
    assert {:text, _} = Scheduler.await(r2, 60_000)
    assert {held(a), held(b)} == {1, 1}

    # cancelled through the group, on whichever member runs it
    :ok = Scheduler.cancel({:group, group}, r1)
    assert held(a) + held(b) == 1

    # the next request goes to the member left idle, and its timeout cancels it there
    assert {:error, %ExBurn.Error{details: %{cause: :timeout}}} =
             Scheduler.generate({:group, group}, "Name every city:", long(timeout: 1_000))

    assert held(a) + held(b) == 1

    # both busy: a request queues on one; alive? false takes it out of that queue
    {:ok, r3} = Scheduler.request({:group, group}, "Count to a thousand:", long())
    assert {:text, _} = Scheduler.await(r3, 60_000)
    gone = :atomics.new(1, [])

    task =
      Task.async(fn ->
        alive? = fn -> :atomics.get(gone, 1) == 0 end
        Scheduler.generate({:group, group}, "Hi", max_tokens: 2, alive?: alive?, check_interval: 10)
      end)

    wait_until(fn -> Scheduler.info({:group, group}).queued == 1 end)
    :atomics.put(gone, 1, 1)
    assert {:error, %ExBurn.Error{details: %{cause: :cancelled}}} = Task.await(task, 10_000)
    assert %{queued: 0, running: 2} = Scheduler.info({:group, group})

    # a caller that dies takes its request away from the member that ran it
    test = self()
    Scheduler.cancel({:group, group}, r2)

    caller =
      spawn(fn ->
        {:ok, ref} = Scheduler.request({:group, group}, "Spell every word:", long())
        {:text, _} = Scheduler.await(ref, 60_000)
        send(test, :running)
        Process.sleep(:infinity)
      end)

    assert_receive :running, 60_000
    assert %{running: 2} = Scheduler.info({:group, group})
    Process.exit(caller, :kill)
    wait_until(fn -> Scheduler.info({:group, group}).running == 1 end)
    Scheduler.cancel({:group, group}, r3)
  end

  test "a stopped member is passed over; an empty group is :down",
       %{models: models, group: group} = context do
    [a, b] = replicas(models, group)
    direct = context.direct[8].text

    # killed: :pg may still list it for a moment, and routing skips it either way
    Process.exit(a, :kill)

    for _ <- 1..3 do
      assert {:ok, %{text: ^direct}} =
               Scheduler.generate({:group, group}, @prompt, max_tokens: 8, greedy: true)
    end

    wait_until(fn -> Scheduler.members(group) == [b] end)
    assert [%{pid: ^b}] = Scheduler.info({:group, group}).members

    GenServer.stop(b)
    assert Scheduler.members(group) == []

    assert {:error, %ExBurn.Error{details: %{cause: :down, group: ^group}}} =
             Scheduler.generate({:group, group}, "Hi", max_tokens: 2)

    assert {:error, %ExBurn.Error{details: %{cause: :down}}} = Scheduler.request({:group, group}, "Hi", [])

    assert_raise ExBurn.Error, ~r/no LLM server of group/, fn ->
      Scheduler.stream({:group, group}, "Hi") |> Enum.to_list()
    end

    assert %{members: [], running: 0, queued: 0} = Scheduler.info({:group, group})
    assert :ok = Scheduler.cancel({:group, group}, make_ref())
  end

  test "a member whose queue is full is passed over; all full is :overloaded", %{
    models: [ma, mb],
    group: group
  } do
    # a: two run, one may wait; b: one runs, three may wait
    [a] = replicas([ma], group, max_concurrent: 2, max_queue: 1)

    b =
      start_supervised!(
        {Scheduler, model: mb, group: group, max_concurrent: 1, max_queue: 3, name: :replicas_b}
      )

    # requests join at step boundaries: wait for them to run before queuing the last
    on_a = for p <- ["Count to a thousand:", "Spell every word:"], do: request!(a, p)
    on_b = [request!(b, "Spell every word:")]
    wait_until(fn -> Scheduler.info(a).running == 2 and Scheduler.info(b).running == 1 end)
    on_a = on_a ++ [request!(a, "Name every city:")]
    on_b = on_b ++ [request!(b, "Count to a million:")]
    assert {held(a), held(b)} == {3, 2}

    # a is the less loaded (3 for 2 slots against 2 for 1) but full: the request goes to b
    {:ok, ref} = Scheduler.request({:group, group}, "Hi", max_tokens: 2)
    assert {held(a), held(b)} == {3, 3}

    on_b = on_b ++ [ref, request!(b, "Hello")]

    assert {:error, %ExBurn.Error{details: %{cause: :overloaded}}} =
             Scheduler.request({:group, group}, "Hi", max_tokens: 2)

    for r <- on_a, do: :ok = Scheduler.cancel(a, r)
    for r <- on_b, do: :ok = Scheduler.cancel(b, r)
  end

  defp request!(server, prompt) do
    {:ok, ref} = Scheduler.request(server, prompt, long())
    ref
  end
end
