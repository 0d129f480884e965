Code.require_file("../server/support.exs", __DIR__)

defmodule ExBurn.LLM.SchedulerTest do
  # ExBurn.LLM.Scheduler with the real SmolLM2 model: same text as ExBurn.LLM alone and in a
  # batch, first come first served, streaming to the caller, the KV budget, and cancellation
  # when the caller dies or cancels.
  use ExUnit.Case, async: false

  alias ExBurn.LLM.Scheduler
  alias ExBurn.ServerTest.Support

  @moduletag skip:
               Support.installed(:llm, Support.llm_id()) == nil && "LLM #{Support.llm_id()} is not installed"
  @moduletag timeout: 300_000

  setup_all do
    {:ok, model} = ExBurn.LLM.load(Support.llm_id())
    %{model: model}
  end

  defp start(model, opts \\ []), do: start_supervised!({Scheduler, Keyword.merge([model: model], opts)})

  # Processes that stay in a generation until killed: a long prompt budget, no stop string.
  defp long(opts \\ []), do: Keyword.merge([max_tokens: 2_000, greedy: true], opts)

  test "generate/3 and stream/3 give ExBurn.LLM's text, usage and finish reason", %{model: model} do
    server = start(model)
    prompt = [%{role: "user", content: "Name a color."}]
    {:ok, direct} = ExBurn.LLM.generate(model, prompt, max_tokens: 12, greedy: true)

    assert {:ok, result} = Scheduler.generate(server, prompt, max_tokens: 12, greedy: true)
    assert result.text == direct.text
    assert result.finish_reason == direct.finish_reason
    assert result.usage == direct.usage

    pieces = Scheduler.stream(server, prompt, max_tokens: 12, greedy: true) |> Enum.to_list()
    assert Enum.join(pieces) == direct.text
    assert length(pieces) > 1

    events =
      Scheduler.stream_events(server, "The capital of France is", max_tokens: 5, greedy: true)
      |> Enum.to_list()

    assert [{:done, %{finish_reason: :length, usage: %{prompt_tokens: p, completion_tokens: 5}}} | _] =
             Enum.reverse(events)

    assert p > 0
  end

  test "the same seed samples the same text", %{model: model} do
    server = start(model)
    opts = [max_tokens: 10, temperature: 0.9, seed: 1234]
    {:ok, a} = Scheduler.generate(server, "Once upon a time", opts)
    {:ok, b} = Scheduler.generate(server, "Once upon a time", opts)
    {:ok, direct} = ExBurn.LLM.generate(model, "Once upon a time", opts)
    assert a.text == b.text and a.text == direct.text
  end

  test "bad prompts and options are errors at once, not after the queue", %{model: model} do
    server = start(model)

    assert {:error, %ExBurn.Error{details: %{kind: :invalid_option}}} =
             Scheduler.request(server, "hi", nope: 1)

    assert {:error, %ExBurn.Error{details: %{kind: :invalid_prompt}}} = Scheduler.request(server, 42, [])

    assert_raise ExBurn.Error, fn ->
      Scheduler.stream(server, "hi", max_tokens: 3, bogus: true) |> Enum.to_list()
    end

    assert Scheduler.info(server).queued == 0
  end

  test "a full batch queues the rest, first come first served", %{model: model} do
    server = start(model, max_concurrent: 1)
    test = self()

    # The first request holds the model until cancelled, so the others queue behind it in order.
    {:ok, blocker} = Scheduler.request(server, "Count to a thousand:", long())
    assert {:text, _} = Scheduler.await(blocker, 60_000)

    for i <- 1..3 do
      spawn_link(fn ->
        {:ok, ref} = Scheduler.request(server, "Say #{i}", max_tokens: 3, greedy: true)
        send(test, {:queued, i})
        collect(ref)
        send(test, {:finished, i})
      end)

      assert_receive {:queued, ^i}, 10_000
    end

    assert %{running: 1, queued: 3} = Scheduler.info(server)
    :ok = Scheduler.cancel(server, blocker)

    order = for _ <- 1..3, do: assert_receive({:finished, i}, 60_000) && i
    assert order == [1, 2, 3]
  end

  @prompts [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
    "Write a haiku about autumn leaves falling on a quiet river at dusk, and explain it.",
    "def fib(n):",
    "The three primary colors are",
    "Translate to French: good morning, my friend.",
    "Water boils at"
  ]

  test "in a batch each request gets the text it gets alone, joining and leaving mid-stream",
       %{model: model} do
    opts = fn i -> [max_tokens: 4 + 3 * i, greedy: true] end
    alone = for {p, i} <- Enum.with_index(@prompts), do: ExBurn.LLM.generate!(model, p, opts.(i)).text

    # a small step budget splits the longer prompts into chunks across steps
    server = start(model, max_concurrent: 5, step_tokens: 12)
    test = self()

    for {p, i} <- Enum.with_index(@prompts) do
      spawn_link(fn ->
        Process.sleep(40 * i)
        send(test, {:result, i, Scheduler.generate(server, p, opts.(i))})
      end)
    end

    got = for _ <- @prompts, into: %{}, do: assert_receive({:result, i, {:ok, r}}, 120_000) && {i, r.text}
    for {want, i} <- Enum.with_index(alone), do: assert(got[i] == want, "prompt #{i}")
  end

  test "the KV budget bounds what runs; a request that can never fit is refused", %{model: model} do
    per_token = model.kv_bytes_per_token
    assert per_token > 0
    # room for two requests of about 60 tokens
    server = start(model, kv_memory: 130 * per_token)
    refs = for p <- Enum.take(@prompts, 4), do: elem(Scheduler.request(server, p, max_tokens: 40), 1)

    # one snapshot: a later one may come after a request finished and a queued one started
    info = first_info(server, &(&1.running == 2))
    assert info.queued == 2 and info.kv_reserved <= info.kv_memory
    for ref <- refs, do: assert(:ok == collect(ref))
    assert %{running: 0, queued: 0, kv_reserved: 0} = Scheduler.info(server)

    assert {:error, %ExBurn.Error{details: %{cause: :overloaded, kv_needed: needed}}} =
             Scheduler.generate(server, "Hi", max_tokens: 500)

    assert needed > 130 * per_token
  end

  test "max_concurrent runs several generations at once", %{model: model} do
    server = start(model, max_concurrent: 2)
    {:ok, a} = Scheduler.request(server, "Count to a thousand:", long())
    {:ok, b} = Scheduler.request(server, "Spell every word:", long())
    assert {:text, _} = Scheduler.await(a, 60_000)
    assert {:text, _} = Scheduler.await(b, 60_000)
    assert %{running: 2, queued: 0} = Scheduler.info(server)
    Scheduler.cancel(server, a)
    Scheduler.cancel(server, b)
    assert %{running: 0} = Scheduler.info(server)
  end

  test "a caller that dies stops its generation; one that dies while queued leaves the queue", %{model: model} do
    server = start(model, max_concurrent: 1)
    test = self()

    running =
      spawn(fn ->
        {:ok, ref} = Scheduler.request(server, "Count to a thousand:", long())
        {:text, _} = Scheduler.await(ref, 60_000)
        send(test, :running)
        Process.sleep(:infinity)
      end)

    assert_receive :running, 60_000

    queued =
      spawn(fn ->
        {:ok, _ref} = Scheduler.request(server, "Hello", long())
        send(test, :queued)
        Process.sleep(:infinity)
      end)

    assert_receive :queued, 10_000
    assert %{running: 1, queued: 1} = Scheduler.info(server)

    Process.exit(queued, :kill)
    ExBurn.TestHelpers.wait_until(fn -> Scheduler.info(server).queued == 0 end)
    assert Scheduler.info(server).running == 1

    Process.exit(running, :kill)
    ExBurn.TestHelpers.wait_until(fn -> Scheduler.info(server).running == 0 end)

    # and the server goes on serving
    assert {:ok, %{finish_reason: :length}} = Scheduler.generate(server, "Hi", max_tokens: 2)
  end

  test "a stream consumer that stops early cancels the rest; cancel/2 leaves no messages", %{model: model} do
    server = start(model)
    assert [_, _] = Scheduler.stream(server, "Count to a thousand:", long()) |> Enum.take(2)
    assert %{running: 0, queued: 0} = Scheduler.info(server)

    {:ok, ref} = Scheduler.request(server, "Count to a thousand:", long())
    assert {:text, _} = Scheduler.await(ref, 60_000)
    :ok = Scheduler.cancel(server, ref)
    refute_received {Scheduler, ^ref, _}
    assert Scheduler.info(server).running == 0
  end

  test ":alive? false cancels a waiting request", %{model: model} do
    server = start(model, max_concurrent: 1)
    {:ok, blocker} = Scheduler.request(server, "Count to a thousand:", long())
    assert {:text, _} = Scheduler.await(blocker, 60_000)

    gone = :atomics.new(1, [])
    alive? = fn -> :atomics.get(gone, 1) == 0 end

    task =
      Task.async(fn ->
        Scheduler.generate(server, "Hi", max_tokens: 2, alive?: alive?, check_interval: 10)
      end)

    ExBurn.TestHelpers.wait_until(fn -> Scheduler.info(server).queued == 1 end)
    :atomics.put(gone, 1, 1)

    assert {:error, %ExBurn.Error{details: %{cause: :cancelled}}} = Task.await(task, 10_000)
    assert Scheduler.info(server).queued == 0
    Scheduler.cancel(server, blocker)
  end

  test "a full queue refuses with :overloaded; a stopped server with :down", %{model: model} do
    server = start(model, max_queue: 1, max_concurrent: 1)
    {:ok, blocker} = Scheduler.request(server, "Count to a thousand:", long())
    assert {:text, _} = Scheduler.await(blocker, 60_000)
    {:ok, _queued} = Scheduler.request(server, "Hi", max_tokens: 2)

    assert {:error, %ExBurn.Error{details: %{cause: :overloaded}}} =
             Scheduler.request(server, "Hi", max_tokens: 2)

    # the blocker's events end with the server's exit
    GenServer.stop(server)
    assert {:error, %ExBurn.Error{details: %{cause: :down}}} = flush_to_error(blocker)
    assert {:error, %ExBurn.Error{details: %{cause: :down}}} = Scheduler.request(server, "Hi", max_tokens: 2)
  end

  defp flush_to_error(ref) do
    case Scheduler.await(ref, 10_000) do
      {:text, _} -> flush_to_error(ref)
      other -> other
    end
  end

  defp first_info(server, pred, tries \\ 300) do
    info = Scheduler.info(server)

    cond do
      pred.(info) -> info
      tries == 0 -> flunk("no snapshot matched: #{inspect(info)}")
      true -> Process.sleep(10) && first_info(server, pred, tries - 1)
    end
  end

  defp collect(ref) do
    case Scheduler.await(ref, 60_000) do
      {:text, _} -> collect(ref)
      {:done, _} -> :ok
    end
  end
end
