defmodule ExBurn.Model.CallbacksTest do
  use ExUnit.Case, async: true

  alias ExBurn.{Model, Tensor}
  alias ExBurn.Model.Callbacks
  import ExBurn.ModelTestData
  import ExUnit.CaptureLog

  defp model(opts \\ []) do
    Model.input({nil, 2})
    |> Model.dense(8, activation: :tanh)
    |> Model.dense(2)
    |> Model.compile(Keyword.merge([loss: :cross_entropy, learning_rate: 0.05], opts))
  end

  test "early stopping halts after `patience` epochs without improvement" do
    {x, y} = xor()
    # learning rate 0: the loss stays the same every epoch (a plateau). Exactly on the CPU; on a
    # GPU the first epoch runs while kernel autotuning still picks among TF32 kernels, so its
    # loss may differ from later ones by ~1e-4, hence min_delta 1e-3.
    {m, history} =
      Model.fit_with_history(model(learning_rate: 0.0), {x, y},
        epochs: 20,
        batch_size: 4,
        shuffle: false,
        callbacks: [Callbacks.early_stopping(3, 1.0e-3)]
      )

    assert Enum.map(history, & &1.epoch) == [1, 2, 3, 4]
    [first | rest] = Enum.map(history, & &1.loss)
    assert Enum.all?(rest, &(abs(&1 - first) < 1.0e-3))
    assert m.halted == :early_stopping and List.last(history).halted == :early_stopping
    assert m.epochs == 4

    # a learning model is not stopped; val_loss is monitored when present. (Patience 10: with
    # another device's initial weights XOR can sit on a short plateau, as it did on CUDA.)
    {m, history} =
      Model.fit_with_history(model(), {x, y},
        epochs: 30,
        batch_size: 4,
        validation_data: {x, y},
        callbacks: [Callbacks.early_stopping(10, 1.0e-4)]
      )

    assert m.halted == nil
    assert length(history) == 30

    # min_delta larger than any improvement: stops after patience + 1 epochs
    {_m, history} =
      Model.fit_with_history(model(), {x, y},
        epochs: 30,
        batch_size: 4,
        callbacks: [Callbacks.early_stopping(2, 100.0)]
      )

    assert length(history) == 3
  end

  test "early stopping monitors val_loss when given" do
    cb = Callbacks.early_stopping(2, 0.0)

    h = fn pairs ->
      Enum.with_index(pairs, 1) |> Enum.map(fn {{l, v}, e} -> %{epoch: e, loss: l, val_loss: v} end)
    end

    # loss improves every epoch but val_loss does not
    assert cb.(%{history: h.([{3.0, 1.0}, {2.0, 1.5}])}) == :cont
    assert cb.(%{history: h.([{3.0, 1.0}, {2.0, 1.5}, {1.0, 1.2}])}) == {:halt, :early_stopping}
    # without val_loss the loss is used
    assert cb.(%{history: h.([{3.0, nil}, {2.0, nil}, {1.0, nil}])}) == :cont
    assert_raise ExBurn.Error, fn -> Callbacks.early_stopping(0, 0.0) end
  end

  @tag :tmp_dir
  test "checkpoint files appear every N epochs and load", %{tmp_dir: dir} do
    {x, y} = xor()
    ckpt = Path.join(dir, "ckpt")
    m = Model.fit(model(), {x, y}, epochs: 7, batch_size: 4, callbacks: [Callbacks.checkpoint(3, ckpt)])
    assert Enum.sort(File.ls!(ckpt)) == ["epoch_3.model", "epoch_6.model"]
    assert {:ok, %Model{epochs: 6} = at6} = Model.load(Path.join(ckpt, "epoch_6.model"))
    assert Tensor.to_binary(Model.predict(at6, x)) != Tensor.to_binary(Model.predict(m, x))
  end

  test "screen callback messages arrive in order with the right shape" do
    {x, y} = xor()

    Model.fit(model(), {x, y},
      epochs: 3,
      batch_size: 4,
      validation_data: {x, y},
      callbacks: [Callbacks.screen(self())]
    )

    for epoch <- 1..3 do
      assert_received {:training_progress, ^epoch, loss, val_loss}
      assert is_float(loss) and is_float(val_loss)
    end

    Model.fit(model(), {x, y}, epochs: 1, batch_size: 4, callbacks: [Callbacks.screen(self())])
    assert_received {:training_progress, 1, loss, nil} when is_float(loss)
    refute_received {:training_progress, _, _, _}
  end

  test "logging callback logs each epoch" do
    {x, y} = xor()

    log =
      capture_log([level: :info], fn ->
        Model.fit(model(), {x, y}, epochs: 2, batch_size: 4, callbacks: [Callbacks.logging()])
      end)

    assert log =~ ~r/ExBurn fit epoch 1\/2: loss=\d/
    assert log =~ ~r/ExBurn fit epoch 2\/2: loss=\d/
  end

  test "custom callbacks see the epoch info and can halt with a reason" do
    {x, y} = xor()
    parent = self()

    cb = fn info ->
      send(parent, {:info, Map.keys(info), info.epoch, info.model.epochs, length(info.history)})
      if info.epoch == 2, do: {:halt, :enough}, else: :ok
    end

    {m, history} = Model.fit_with_history(model(), {x, y}, epochs: 5, batch_size: 4, callbacks: [cb])
    assert_received {:info, [:epoch, :epochs, :history, :loss, :model, :val_loss], 1, 1, 1}
    assert_received {:info, _, 2, 2, 2}
    assert m.halted == :enough and length(history) == 2
    assert Enum.map(history, &Map.get(&1, :halted)) == [nil, :enough]
  end

  test "a raising callback stops fit, re-raises, and leaves a usable model at the last epoch" do
    {x, y} = xor()
    m = model()
    parent = self()

    cb = fn %{epoch: e, model: current} ->
      send(parent, {:snapshot, e, Tensor.to_binary(Model.predict(current, x))})
      if e == 3, do: raise("boom at #{e}")
    end

    assert_raise RuntimeError, "boom at 3", fn ->
      Model.fit(m, {x, y}, epochs: 10, batch_size: 4, callbacks: [cb])
    end

    assert_received {:snapshot, 3, at3}
    refute_received {:snapshot, 4, _}
    assert Tensor.to_binary(Model.predict(m, x)) == at3
    # and it keeps training
    assert %Model{halted: nil} = Model.fit(m, {x, y}, epochs: 1, batch_size: 4)
  end

  test "cancel between epochs from another process stops before the next epoch" do
    {x, y} = xor()
    m = model()
    test = self()

    gate = fn %{epoch: e} ->
      if e == 2 do
        send(test, {:at, e, self()})
        receive do: (:go -> :ok)
      end
    end

    task =
      Task.async(fn -> Model.fit_with_history(m, {x, y}, epochs: 50, batch_size: 1, callbacks: [gate]) end)

    # generous: on a GPU the first epochs include compiling the kernels (seconds)
    assert_receive {:at, 2, _pid}, 120_000
    assert Model.cancel(m) == :ok
    send(task.pid, :go)
    {m2, history} = Task.await(task)
    assert Enum.map(history, & &1.epoch) == [1, 2]
    assert m2.halted == :cancelled and List.last(history).halted == :cancelled
    assert m2.epochs == 2
    assert Tensor.shape(Model.predict(m2, x)) == {4, 2}

    # the next fit clears the request
    assert %Model{halted: nil, epochs: 3} = Model.fit(m2, {x, y}, epochs: 1, batch_size: 4)
  end

  test "cancel during a long epoch discards that epoch" do
    # 50_000 one-sample batches: the first epoch takes seconds
    x = Tensor.iota({50_000, 32}, :f32) |> Tensor.multiply(0.37) |> Tensor.sin()
    y = x |> Tensor.slice([0, 0], [50_000, 10]) |> Tensor.argmax(axis: 1)

    m =
      Model.input({nil, 32})
      |> Model.dense(64, activation: :relu)
      |> Model.dense(10)
      |> Model.compile(loss: :cross_entropy)

    before = Tensor.to_binary(Model.predict(m, x))

    task =
      Task.async(fn -> :timer.tc(fn -> Model.fit_with_history(m, {x, y}, epochs: 100, batch_size: 1) end) end)

    Process.sleep(300)
    Model.cancel(m)
    {us, {m2, history}} = Task.await(task, 30_000)
    assert history == [] and m2.halted == :cancelled and m2.epochs == 0
    # 100 epochs of 50k batches would take many minutes; on a GPU the first batch alone
    # compiles kernels for seconds (cancel is seen between batches)
    assert us < 60_000_000
    now = Tensor.to_binary(Model.predict(m2, x))

    if m2.device == {:cpu, 0} do
      assert now == before
    else
      # a GPU runs the dense layers on Burn's TF32 kernels, and the first calls of a shape run
      # while autotuning still picks one (about 1 ulp apart)
      for {u, v} <- Enum.zip(floats(now), floats(before)), do: assert(abs(u - v) <= 2.0e-3 * max(abs(u), 1.0))
    end
  end

  @tag :telemetry
  test "telemetry events" do
    {x, y} = xor()
    ref = make_ref()
    parent = self()
    handler = fn event, measurements, meta, _ -> send(parent, {ref, event, measurements, Map.keys(meta)}) end
    events = for e <- [:start, :epoch, :stop], do: [:ex_burn, :fit, e]
    apply(:telemetry, :attach_many, ["exburn-test-#{inspect(ref)}", events, handler, nil])

    try do
      Model.fit(model(), {x, y}, epochs: 2, batch_size: 4)
      assert_received {^ref, [:ex_burn, :fit, :start], %{system_time: _}, [:epochs, :model]}

      assert_received {^ref, [:ex_burn, :fit, :epoch], %{loss: _, val_loss: nil, duration: _},
                       [:epoch, :model]}

      assert_received {^ref, [:ex_burn, :fit, :epoch], _, _}
      assert_received {^ref, [:ex_burn, :fit, :stop], %{epochs: 2, duration: _}, [:halted, :history, :model]}
    after
      apply(:telemetry, :detach, ["exburn-test-#{inspect(ref)}"])
    end
  end

  defp floats(bin), do: for(<<v::float-32-native <- bin>>, do: v)
end
