defmodule ExBurn.Model.FreeTest do
  # Not async: the memory test reads this OS process's resident set size, which concurrent tests
  # would move.
  use ExUnit.Case, async: false

  alias ExBurn.{Model, Tensor}
  import ExBurn.ModelTestData

  defp xor_model do
    Model.input({nil, 2})
    |> Model.dense(8, activation: :tanh)
    |> Model.dense(2)
    |> Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05)
  end

  test "free releases the native model at once; a second free answers :already_deallocated" do
    {x, y} = xor()
    model = Model.fit(xor_model(), {x, y}, epochs: 1, batch_size: 4)
    assert Model.free(model) == :ok
    assert Model.free(model) == :already_deallocated
    # the summary is kept beside the native model
    assert Model.summary(model).params == 42

    for {op, fun} <- [
          predict: fn -> Model.predict(model, x) end,
          evaluate: fn -> Model.evaluate(model, {x, y}) end,
          fit: fn -> Model.fit(model, {x, y}, epochs: 1) end,
          save: fn -> Model.save!(model, Path.join(System.tmp_dir!(), "exburn_never_written.model")) end
        ] do
      error = assert_raise ExBurn.Error, fun
      assert {error.op, error.reason, error.details} == {op, "model was freed", %{kind: :freed}}
    end

    path = Path.join(System.tmp_dir!(), "exburn_free_#{System.unique_integer([:positive])}.model")
    assert {:error, %ExBurn.Error{reason: "model was freed"}} = Model.save(model, path)
    refute File.exists?(path)

    try do
      :ok = Model.save(xor_model(), path)
      assert {:error, %ExBurn.Error{op: :load, reason: "model was freed"}} = Model.load(model, path)
    after
      File.rm(path)
    end
  end

  test "every resource answers a second free as Nx's backend_deallocate does" do
    model = xor_model()
    tensor = Tensor.iota({3}, :f32)
    assert {Model.free(model), Tensor.deallocate(tensor)} == {:ok, :ok}
    assert {Model.free(model), Tensor.deallocate(tensor)} == {:already_deallocated, :already_deallocated}
  end

  @tag :nx
  test "Nx.backend_deallocate on an ExBurn tensor: :ok, then :already_deallocated" do
    t = apply(Nx, :iota, [{3}, [backend: ExBurn.Backend]])
    assert apply(Nx, :backend_deallocate, [t]) == :ok
    assert apply(Nx, :backend_deallocate, [t]) == :already_deallocated
  end

  # Resident set size of this OS process (Linux), in bytes.
  defp rss do
    case File.read("/proc/self/statm") do
      {:ok, statm} -> statm |> String.split() |> Enum.at(1) |> String.to_integer() |> Kernel.*(4096)
      {:error, _} -> nil
    end
  end

  test "free returns the weights' memory to the system before the struct is collected" do
    # one 4096 x 4096 f32 weight: 64 MiB, above glibc's mmap threshold, so freeing it unmaps it
    # (host memory: on a GPU the weights would not be in this process's RSS)
    model = Model.input({nil, 4096}) |> Model.dense(4096) |> Model.compile(device: :cpu)
    :erlang.garbage_collect()
    before = rss()
    assert Model.free(model) == :ok

    if before do
      released = before - rss()
      assert released > 48 * 1024 * 1024, "RSS fell by #{div(released, 1024 * 1024)} MiB"
    end

    # `model` is still referenced here: the memory went back through free/1, not through GC
    assert Model.summary(model).params == 4096 * 4096 + 4096
  end

  test "free cancels a running fit, during an epoch or between two" do
    # 10_000 one-sample batches: an epoch lasts long enough to be freed in its middle
    {x, y} = blobs(10_000, 4, 8)

    for free_at <- [:during_epoch, :between_epochs] do
      model =
        Model.input({nil, 8})
        |> Model.dense(16, activation: :relu)
        |> Model.dense(4)
        |> Model.compile(loss: :cross_entropy)

      test = self()

      # reports epoch 1's end, then (between_epochs) waits until the model is freed
      gate = fn %{epoch: epoch} ->
        send(test, {:epoch, epoch, self()})
        if free_at == :between_epochs, do: receive(do: (:freed -> :ok))
      end

      task =
        Task.async(fn ->
          Model.fit_with_history(model, {x, y}, epochs: 1000, batch_size: 1, callbacks: [gate])
        end)

      assert_receive {:epoch, 1, pid}, 60_000
      if free_at == :during_epoch, do: Process.sleep(50)
      assert Model.free(model) == :ok
      send(pid, :freed)
      {stopped, history} = Task.await(task, 60_000)

      assert stopped.halted == :cancelled, "#{free_at}"
      assert List.last(history).halted == :cancelled
      # the epoch in progress (the second at most) was discarded
      assert length(history) in 1..2
      assert stopped.epochs == length(history)
      assert_raise ExBurn.Error, ~r/model was freed/, fn -> Model.predict(stopped, x) end
    end
  end
end
