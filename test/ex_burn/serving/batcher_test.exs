defmodule ExBurn.Serving.BatcherTest do
  use ExUnit.Case, async: true
  import ExBurn.TestHelpers, only: [wait_until: 1, product_tolerance: 1, call_timeout: 0]

  alias ExBurn.{Error, Model, Tensor}
  alias ExBurn.Serving.Batcher

  # Exact integer arithmetic: row [a, b] -> [2a + 1, 2b + 1]; reports each batch's size.
  defp affine(test_pid) do
    fn batch ->
      send(test_pid, {:batch_rows, elem(Tensor.shape(batch), 0)})
      batch |> Tensor.multiply(2) |> Tensor.add(1)
    end
  end

  defp mlp, do: ExBurn.ModelTestData.serving_mlp()

  # A batcher of one-sample batches, each of which waits for a :go from the test; returns it,
  # the task whose request is running, and that batch's process.
  defp gated_batcher(opts) do
    parent = self()

    fun = fn batch ->
      send(parent, {:running, self()})
      receive do: (:go -> batch)
    end

    {:ok, server} = Batcher.start_link(fun, [batch_size: 1, batch_timeout: 0] ++ opts)
    first = Task.async(fn -> Batcher.run(server, [0], call_timeout()) end)
    assert_receive {:running, batch_pid}, 2_000
    {server, first, batch_pid}
  end

  defp rows_seen(acc \\ []) do
    receive do
      {:batch_rows, n} -> rows_seen([n | acc])
    after
      0 -> Enum.reverse(acc)
    end
  end

  defp concurrently(clients, per_client, fun) do
    1..clients
    |> Enum.map(fn c -> Task.async(fn -> for r <- 1..per_client, do: fun.(c * 1000 + r) end) end)
    |> Enum.flat_map(&Task.await(&1, :infinity))
  end

  test "256 requests from 64 processes get their own rows (exact, function target)" do
    {:ok, server} = Batcher.start_link(affine(self()), batch_size: 16, batch_timeout: 5)

    results =
      concurrently(64, 4, fn i ->
        {i, Batcher.run(server, Tensor.tensor([i, -i], type: :s32), call_timeout())}
      end)

    assert length(results) == 256

    for {i, result} <- results do
      assert {:ok, row} = result
      assert {Tensor.shape(row), Tensor.type(row)} == {{2}, {:s, 32}}
      assert Tensor.to_flat_list(row) == [2 * i + 1, -2 * i + 1]
    end

    sizes = rows_seen()
    assert Enum.sum(sizes) == 256
    assert Enum.max(sizes) > 1, "requests were never batched: #{inspect(sizes)}"
    assert Enum.max(sizes) <= 16
  end

  test "256 requests from 64 processes on an MLP match per-sample predictions" do
    model = mlp()
    {:ok, server} = Batcher.start_link(model, batch_size: 32, batch_timeout: 5)
    input = &ExBurn.ModelTestData.serving_input/1

    results = concurrently(64, 4, fn i -> {i, Batcher.run(server, input.(i), call_timeout())} end)
    assert length(results) == 256
    # a batch row and a one-row call take different kernels (about 1.6e-5 apart on a GPU)
    tolerance = product_tolerance(1.0e-5)

    for {i, result} <- results do
      assert {:ok, row} = result
      expected = model |> Model.predict([input.(i)]) |> Tensor.to_flat_list()
      got = Tensor.to_flat_list(row)
      assert Tensor.shape(row) == {3}
      for {g, e} <- Enum.zip(got, expected), do: assert_in_delta(g, e, tolerance)
    end
  end

  test ":warmup runs the target on one sample and on a full batch before the server starts" do
    {:ok, server} = Batcher.start_link(affine(self()), batch_size: 5, warmup: [1, 2])
    assert rows_seen() == [1, 5]
    assert Tensor.to_flat_list(Batcher.run!(server, [3, 4], call_timeout())) == [7, 9]

    fun = fn batch ->
      if Enum.any?(Tensor.to_flat_list(batch), &(&1 < 0)), do: raise(ArgumentError, "negative input")
      batch
    end

    assert {:error, %Error{op: :serving, reason: "the serving function raised: negative input"}} =
             Batcher.start_link(fun, warmup: [-1])

    assert {:error, %Error{op: :serving, details: %{got: :junk}}} = Batcher.start_link(fun, warmup: :junk)
    assert {:ok, _} = Batcher.start_link(fun, warmup: [1])
  end

  test "inputs may be lists, tensors and {binary, type, shape}; run! raises" do
    {:ok, server} = Batcher.start_link(affine(self()), batch_timeout: 0)
    assert Tensor.to_flat_list(Batcher.run!(server, [1, 2], call_timeout())) == [3, 5]

    assert Tensor.to_flat_list(
             Batcher.run!(
               server,
               {<<7::signed-native-32, 8::signed-native-32>>, {:s, 32}, {2}},
               call_timeout()
             )
           ) == [15, 17]

    assert {:error, %Error{op: :serving}} = Batcher.run(server, :junk, call_timeout())
    assert_raise Error, fn -> Batcher.run!(server, %{}, call_timeout()) end
  end

  test "an erroring function fails only the requests that fail on their own" do
    fun = fn batch ->
      if Enum.any?(Tensor.to_flat_list(batch), &(&1 < 0)), do: raise(ArgumentError, "negative input")
      Tensor.add(batch, 10)
    end

    {:ok, server} = Batcher.start_link(fun, batch_size: 8, batch_timeout: 20)

    results =
      concurrently(10, 10, fn i ->
        {i, Batcher.run(server, [if(rem(i, 7) == 0, do: -i, else: i)], call_timeout())}
      end)

    for {i, result} <- results do
      if rem(i, 7) == 0 do
        assert {:error, %Error{op: :serving, reason: "the serving function raised: negative input"}} = result
      else
        assert {:ok, row} = result
        assert Tensor.to_flat_list(row) == [i + 10]
      end
    end

    # 16 of the 100 ids are multiples of 7: the batches they shared must still have succeeded.
    assert Enum.count(results, &match?({_, {:error, _}}, &1)) == 16
  end

  test "a bad sample fails alone when batched with good ones for a model" do
    model = mlp()
    {:ok, server} = Batcher.start_link(model, batch_size: 4, batch_timeout: 50)

    [good1, bad, good2] =
      [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0], [0.0, 0.5, 0.0, -1.0]]
      |> Enum.map(fn x -> Task.async(fn -> Batcher.run(server, x, call_timeout()) end) end)
      |> Enum.map(&Task.await(&1, :infinity))

    assert {:error, %Error{op: :predict}} = bad

    for {{:ok, row}, x} <- [{good1, [1.0, 2.0, 3.0, 4.0]}, {good2, [0.0, 0.5, 0.0, -1.0]}] do
      expected = model |> Model.predict([x]) |> Tensor.to_flat_list()
      for {g, e} <- Enum.zip(Tensor.to_flat_list(row), expected), do: assert_in_delta(g, e, 1.0e-5)
    end
  end

  test "a function returning the wrong number of rows fails with a clear error" do
    {:ok, server} = Batcher.start_link(fn batch -> Tensor.sum(batch) end, batch_timeout: 0)

    assert {:error, %Error{op: :serving, reason: "the model must return a tensor with one row per input"}} =
             Batcher.run(server, [1, 2], call_timeout())
  end

  test "callers killed while queued are dropped from the batch; the others get their rows" do
    # a batch timeout long enough that all ten are queued before it fires on a loaded machine
    {:ok, server} = Batcher.start_link(affine(self()), batch_size: 100, batch_timeout: 2_000)
    parent = self()

    callers =
      for i <- 1..10 do
        spawn(fn -> send(parent, {:result, i, Batcher.run(server, [i, i], call_timeout())}) end)
      end

    # All ten are queued (the batch waits for its timeout), then every odd one dies.
    wait_until(fn -> :sys.get_state(server).queued == 10 end)
    for {pid, i} <- Enum.with_index(callers, 1), rem(i, 2) == 1, do: Process.exit(pid, :kill)

    for i <- 2..10//2 do
      assert_receive {:result, ^i, {:ok, row}}, call_timeout()
      assert Tensor.to_flat_list(row) == [2 * i + 1, 2 * i + 1]
    end

    assert rows_seen() == [5]
    refute_received {:result, _, _}
    assert {:ok, _} = Batcher.run(server, [0, 0], call_timeout())
  end

  test "a caller killed while its batch runs does not break the batch for the others" do
    fun = fn batch ->
      Process.sleep(100)
      Tensor.add(batch, 1)
    end

    {:ok, server} = Batcher.start_link(fun, batch_size: 4, batch_timeout: 0)
    parent = self()

    pids =
      for i <- 1..4, do: spawn(fn -> send(parent, {:result, i, Batcher.run(server, [i], call_timeout())}) end)

    wait_until(fn -> :sys.get_state(server).task != nil end)
    Process.exit(hd(pids), :kill)

    # The first request may have run alone (batch_timeout 0); either way the survivors answer.
    # (generous: on a GPU the first add compiles its kernel, which takes seconds)
    for i <- 2..4, do: assert_receive({:result, ^i, {:ok, _}}, 60_000)
    assert Process.alive?(server)
    assert {:ok, row} = Batcher.run(server, [41], call_timeout())
    assert Tensor.to_flat_list(row) == [42]
  end

  test "a batch process that dies fails its requests only; the server keeps serving" do
    fun = fn batch ->
      if Tensor.to_flat_list(batch) == [13], do: Process.exit(self(), :kill)
      batch
    end

    {:ok, server} = Batcher.start_link(fun, batch_timeout: 0)

    assert {:error, %Error{details: %{cause: :batch_exit, exit: :killed}}} =
             Batcher.run(server, [13], call_timeout())

    assert {:ok, row} = Batcher.run(server, [12], call_timeout())
    assert Tensor.to_flat_list(row) == [12]
  end

  test "the queue is bounded: overload is refused at once with a clear error" do
    {server, first, batch_pid} = gated_batcher(max_queue: 3)

    queued = for i <- 1..3, do: Task.async(fn -> Batcher.run(server, [i], call_timeout()) end)
    wait_until(fn -> :sys.get_state(server).queued == 3 end)

    assert {:error, %Error{op: :serving, details: %{cause: :overloaded, max_queue: 3}} = e} =
             Batcher.run(server, [99], call_timeout())

    assert Exception.message(e) =~ "overloaded"

    send(batch_pid, :go)
    assert {:ok, _} = Task.await(first, :infinity)

    # The queued three run one at a time, in whatever order they arrived.
    for _ <- 1..3 do
      assert_receive {:running, pid}, 2_000
      send(pid, :go)
    end

    for {task, i} <- Enum.with_index(queued, 1) do
      assert {:ok, row} = Task.await(task, :infinity)
      assert Tensor.to_flat_list(row) == [i]
    end
  end

  test "a request that times out is reported and skipped" do
    fun = fn batch ->
      Process.sleep(200)
      batch
    end

    {:ok, server} = Batcher.start_link(fun, batch_size: 1, batch_timeout: 0)
    busy = Task.async(fn -> Batcher.run(server, [1], call_timeout()) end)
    wait_until(fn -> :sys.get_state(server).task != nil end)
    assert {:error, %Error{details: %{cause: :timeout, timeout: 50}}} = Batcher.run(server, [2], 50)
    assert {:ok, _} = Task.await(busy, :infinity)
    assert {:error, %Error{details: %{cause: :down}}} = Batcher.run(:no_such_server, [1])
  end

  describe "run_many/3" do
    test "a request's samples share batches and come back in order, without a process each" do
      {:ok, server} = Batcher.start_link(affine(self()), batch_size: 4, batch_timeout: 1_000)
      parent = self()

      caller =
        spawn(fn ->
          receive do:
                    (:go ->
                       send(
                         parent,
                         {:result, Batcher.run_many(server, Enum.map(1..10, &[&1, -&1]), call_timeout())}
                       ))
        end)

      # the caller is traced for the processes it spawns
      :erlang.trace(caller, true, [:procs])
      send(caller, :go)
      assert_receive {:result, {:ok, rows}}, call_timeout()
      assert Enum.map(rows, &Tensor.to_flat_list/1) == Enum.map(1..10, &[2 * &1 + 1, -2 * &1 + 1])
      assert_receive {:trace, ^caller, :exit, :normal}, call_timeout()
      refute_received {:trace, ^caller, :spawn, _, _}

      # queued at once: two full batches at once, the rest after its timeout (not one batch each)
      assert rows_seen() == [4, 4, 2]
      assert Batcher.run_many(server, [], call_timeout()) == {:ok, []}
    end

    test "requests of many samples from concurrent callers each get their own rows" do
      {:ok, server} = Batcher.start_link(affine(self()), batch_size: 16, batch_timeout: 5)

      results =
        concurrently(16, 4, fn i ->
          {i,
           Batcher.run_many(
             server,
             Enum.map(0..(rem(i, 5) + 1), &Tensor.tensor([i, &1], type: :s32)),
             call_timeout()
           )}
        end)

      for {i, result} <- results do
        assert {:ok, rows} = result

        assert Enum.map(rows, &Tensor.to_flat_list/1) ==
                 Enum.map(0..(rem(i, 5) + 1), &[2 * i + 1, 2 * &1 + 1])
      end

      assert Enum.max(rows_seen()) > 1
      # every caller's monitor was released with its last sample (this one stays alive)
      assert {:ok, [_, _]} = Batcher.run_many(server, [[1, 1], [2, 2]], call_timeout())
      wait_until(fn -> :sys.get_state(server).holds == %{} end)
      wait_until(fn -> Process.info(server, :monitors) == {:monitors, []} end)
    end

    test "a failing sample fails its request with the first failure; others' samples are unaffected" do
      fun = fn batch ->
        if Enum.any?(Tensor.to_flat_list(batch), &(&1 < 0)), do: raise(ArgumentError, "negative input")
        Tensor.add(batch, 10)
      end

      {:ok, server} = Batcher.start_link(fun, batch_size: 8, batch_timeout: 50)
      other = Task.async(fn -> Batcher.run_many(server, [[1], [2]], call_timeout()) end)

      assert {:error, %Error{reason: "the serving function raised: negative input"}} =
               Batcher.run_many(server, [[3], [-4], [5], [-6]], call_timeout())

      assert {:ok, rows} = Task.await(other, :infinity)
      assert Enum.map(rows, &Tensor.to_flat_list/1) == [[11], [12]]
      assert {:error, %Error{op: :serving}} = Batcher.run_many(server, [[1], :junk], call_timeout())
      assert {:error, %Error{details: %{kind: :argument}}} = Batcher.run_many(server, :junk, call_timeout())
    end

    test "a request the queue cannot take now is overloaded; one it can never take is an argument error" do
      {server, first, batch_pid} = gated_batcher(max_queue: 3)
      queued = Task.async(fn -> Batcher.run_many(server, [[1], [2]], call_timeout()) end)
      wait_until(fn -> :sys.get_state(server).queued == 2 end)

      assert {:error, %Error{details: %{cause: :overloaded, max_queue: 3}}} =
               Batcher.run_many(server, [[3], [4]], call_timeout())

      assert {:error, %Error{details: %{kind: :argument, samples: 4, max_queue: 3}}} =
               Batcher.run_many(server, [[3], [4], [5], [6]], call_timeout())

      # nothing of the refused requests was queued
      assert :sys.get_state(server).queued == 2

      send(batch_pid, :go)
      assert {:ok, _} = Task.await(first, :infinity)

      for _ <- 1..2 do
        assert_receive {:running, pid}, 2_000
        send(pid, :go)
      end

      assert {:ok, rows} = Task.await(queued, :infinity)
      assert Enum.map(rows, &Tensor.to_flat_list/1) == [[1], [2]]
    end

    test "a request that times out is reported, and its late rows never reach the caller" do
      fun = fn batch ->
        Process.sleep(150)
        batch
      end

      {:ok, server} = Batcher.start_link(fun, batch_size: 2, batch_timeout: 0)

      assert {:error, %Error{details: %{cause: :timeout, timeout: 50}}} =
               Batcher.run_many(server, [[1], [2], [3]], 50)

      # the running batch finishes and answers the expired request; the third sample is skipped
      wait_until(fn ->
        match?(%{queued: 0, task: nil, holds: holds} when holds == %{}, :sys.get_state(server))
      end)

      assert {:messages, []} = Process.info(self(), :messages)
      assert {:ok, [row]} = Batcher.run_many(server, [[7]], call_timeout())
      assert Tensor.to_flat_list(row) == [7]
    end

    test "no server, or one that dies while the request waits, is :down" do
      assert {:error, %Error{details: %{cause: :down}}} = Batcher.run_many(:no_such_server, [[1]])

      # the server is linked: its death must not take the test down
      Process.flag(:trap_exit, true)
      {:ok, server} = Batcher.start_link(affine(self()), batch_size: 100, batch_timeout: 5_000)
      waiting = Task.async(fn -> Batcher.run_many(server, [[1], [2]], 10_000) end)
      wait_until(fn -> :sys.get_state(server).queued == 2 end)
      Process.exit(server, :kill)
      assert {:error, %Error{details: %{cause: :down, exit: :killed}}} = Task.await(waiting, :infinity)
    end

    test "a caller killed while its samples are queued takes all of them out of the queue" do
      {:ok, server} = Batcher.start_link(affine(self()), batch_size: 100, batch_timeout: 2_000)
      parent = self()
      doomed = spawn(fn -> Batcher.run_many(server, Enum.map(1..5, &[&1]), call_timeout()) end)
      spawn(fn -> send(parent, {:result, Batcher.run_many(server, [[10], [11]], call_timeout())}) end)
      wait_until(fn -> :sys.get_state(server).queued == 7 end)

      Process.exit(doomed, :kill)
      wait_until(fn -> :sys.get_state(server).queued == 2 end)
      assert map_size(:sys.get_state(server).holds) == 1

      assert_receive {:result, {:ok, rows}}, call_timeout()
      assert Enum.map(rows, &Tensor.to_flat_list/1) == [[21], [23]]
      assert rows_seen() == [2]
    end
  end

  test "a supervised server is restarted and serves again" do
    name = :"serving_restart_#{System.unique_integer([:positive])}"
    children = [{Batcher, model: affine(self()), name: name, batch_timeout: 0}]

    start_supervised!(%{
      id: :sup,
      type: :supervisor,
      start: {Supervisor, :start_link, [children, [strategy: :one_for_one]]}
    })

    old = Process.whereis(name)
    assert {:ok, _} = Batcher.run(name, [1, 1], call_timeout())

    ref = Process.monitor(old)
    Process.exit(old, :kill)
    assert_receive {:DOWN, ^ref, :process, ^old, :killed}
    wait_until(fn -> Process.whereis(name) not in [nil, old] end)

    assert {:ok, row} = Batcher.run(name, [20, 21], call_timeout())
    assert Tensor.to_flat_list(row) == [41, 43]
  end

  @tag :telemetry
  test "each batch emits [:ex_burn, :serving, :batch] with its size, queue and execution times" do
    parent = self()
    id = "serving-telemetry-#{inspect(parent)}"
    handler = fn _event, measurements, metadata, _ -> send(parent, {:telemetry, measurements, metadata}) end
    :ok = apply(:telemetry, :attach, [id, [:ex_burn, :serving, :batch], handler, nil])
    on_exit(fn -> apply(:telemetry, :detach, [id]) end)

    fun = fn batch ->
      if Enum.any?(Tensor.to_flat_list(batch), &(&1 < 0)), do: raise("negative")
      batch
    end

    {:ok, server} = Batcher.start_link(fun, batch_size: 3, batch_timeout: 1_000)
    tasks = for x <- [1, -2, 3], do: Task.async(fn -> Batcher.run(server, [x], call_timeout()) end)
    # the test's own timeout bounds the wait: a cold GPU compiles the batch's kernels first
    assert [{:ok, _}, {:error, _}, {:ok, _}] = Enum.map(tasks, &Task.await(&1, :infinity))

    assert_receive {:telemetry, %{batch_size: 3, queue_time: q, execution_time: e},
                    %{server: ^server, errors: 1, fallback: true}}

    assert is_integer(q) and q >= 0 and is_integer(e) and e > 0
  end

  test "without Nx, ExBurn.Serving and Dala.ML.Burn.Serving point to this server" do
    if Code.ensure_loaded?(ExBurn.Serving.Nx) do
      assert %{__struct__: Nx.Serving} = Dala.ML.Burn.Serving.build(& &1)
    else
      assert_raise Error, ~r/Nx is not loaded; use ExBurn.Serving.Batcher/, fn ->
        Dala.ML.Burn.Serving.build(& &1)
      end
    end
  end

  test "options are validated" do
    assert_raise Error, ~r/unknown option :batch/, fn -> Batcher.start_link(& &1, batch: 3) end

    assert_raise Error, ~r/:batch_size must be a positive integer/, fn ->
      Batcher.start_link(& &1, batch_size: 0)
    end

    assert_raise Error, ~r/expected an ExBurn.Model/, fn -> Batcher.start_link(:nope, []) end
    assert %{id: :x, start: {Batcher, :start_link, [_]}} = Batcher.child_spec(model: & &1, name: :x)
  end
end
