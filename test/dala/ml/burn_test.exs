defmodule Dala.ML.BurnTest do
  use ExUnit.Case, async: false

  alias Dala.ML.Burn
  alias Dala.ML.Burn.Training
  alias ExBurn.{Model, Tensor}
  import ExBurn.ModelTestData
  import ExBurn.TestHelpers, only: [assert_close: 4]

  test "availability and devices" do
    assert Burn.available?() == true
    gpu = Enum.any?(ExBurn.devices(), &(&1.kind != :cpu))
    assert Burn.gpu?() == gpu
    expected = if elem(ExBurn.default_device(), 0) == :cpu, do: :cpu, else: :gpu
    assert Burn.default_device() == expected
  end

  test "configure! sets the default device and rejects what is not there" do
    before = ExBurn.default_device()
    nx? = Code.ensure_loaded?(Nx)
    nx_backend = if nx?, do: apply(Nx, :default_backend, [])

    try do
      assert Burn.configure!(device: :cpu) == :ok
      assert ExBurn.default_device() == {:cpu, 0}

      if nx? and Code.ensure_loaded?(ExBurn.Backend) do
        # a fresh process reads the global default
        task = Task.async(fn -> apply(Nx, :default_backend, []) end)
        assert Task.await(task) == {ExBurn.Backend, [device: {:cpu, 0}]}
      end

      assert Burn.default_device() == :cpu
      assert Burn.configure!() == :ok

      unless Burn.gpu?() do
        e = assert_raise ExBurn.Error, fn -> Burn.configure!(device: :gpu) end
        assert e.reason == "no GPU device is available"
      end

      e = assert_raise ExBurn.Error, fn -> Burn.configure!(devise: :cpu) end
      assert e.details.option == :devise
    after
      Burn.configure!(device: before)
      if nx?, do: apply(Nx, :global_default_backend, [nx_backend])
    end
  end

  test "zeros, ones, from_nx/to_nx without Nx, free" do
    z = Burn.zeros([3, 3], :f32)

    assert {Tensor.shape(z), Tensor.type(z), Tensor.to_flat_list(z)} ==
             {{3, 3}, {:f, 32}, List.duplicate(0.0, 9)}

    o = Burn.ones([2, 4], :f32)
    assert {Tensor.shape(o), Tensor.to_flat_list(o)} == {{2, 4}, List.duplicate(1.0, 8)}
    assert {:error, %ExBurn.Error{op: :from_nx}} = Burn.from_nx([1, 2])
    assert Burn.free(o) == :ok

    unless Code.ensure_loaded?(Nx) do
      # without Nx no input is Nx: serving needs Nx and says so
      e = assert_raise ExBurn.Error, fn -> Burn.Serving.run(:no_serving, z) end
      assert e.reason =~ "Nx is not loaded"

      assert {:error, %ExBurn.Error{op: :to_nx, reason: "Nx is not loaded"}} = Burn.to_nx(z)

      assert {:error, %ExBurn.Error{op: :from_nx, reason: "Nx is not loaded"}} =
               Burn.from_nx(%{__struct__: Nx.Tensor})
    end
  end

  @tag :nx
  test "from_nx/to_nx round trip" do
    t = apply(Nx, :tensor, [[[1.0, 2.0], [3.0, 4.0]], [type: :f32]])
    assert {:ok, bt} = Burn.from_nx(t)
    assert {Tensor.shape(bt), Tensor.to_flat_list(bt)} == {{2, 2}, [1.0, 2.0, 3.0, 4.0]}
    assert {:ok, back} = Burn.to_nx(bt)
    assert apply(Nx, :to_binary, [back]) == apply(Nx, :to_binary, [t])
    assert apply(Nx, :shape, [back]) == {2, 2}
    assert %{__struct__: Nx.Tensor, data: %{__struct__: ExBurn.Backend}} = back
  end

  @tag :tmp_dir
  test "the whole workflow: compile, fit with callbacks, predict, evaluate, summary, save, load, free", %{
    tmp_dir: dir
  } do
    {x, y} = xor()

    model =
      Model.input({nil, 2})
      |> Model.dense(8, activation: :tanh)
      |> Model.dense(2)

    compiled = Burn.compile(model, loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05)
    assert %Model{} = compiled

    callbacks = [
      Training.checkpoint_callback(100, Path.join(dir, "ckpt")),
      Training.screen_callback(self())
    ]

    trained =
      Burn.fit(compiled, {x, y}, epochs: 300, batch_size: 4, validation_data: {x, y}, callbacks: callbacks)

    assert_received {:training_progress, 1, loss, val_loss} when is_float(loss) and is_float(val_loss)

    assert File.ls!(Path.join(dir, "ckpt")) |> Enum.sort() == [
             "epoch_100.model",
             "epoch_200.model",
             "epoch_300.model"
           ]

    assert {:ok, %Tensor{} = predictions} = Burn.predict(trained, x)
    assert {Tensor.shape(predictions), Tensor.type(predictions)} == {{4, 2}, {:f, 32}}
    assert accuracy(predictions, y) == 1.0
    # ExBurn tensors and {binary, type, shape} in give ExBurn tensors out, the same values
    xt = Tensor.tensor(x, type: :f32)

    for input <- [xt, {Tensor.to_binary(xt), {:f, 32}, {4, 2}}] do
      assert {:ok, %Tensor{} = p} = Burn.predict(trained, input)
      assert Tensor.to_binary(p) == Tensor.to_binary(predictions)
    end

    {:ok, one_at_a_time} = Burn.predict(trained, x, batch_size: 1)
    assert_close(one_at_a_time, {4, 2}, :f32, Tensor.to_flat_list(predictions))
    assert {:error, %ExBurn.Error{op: :predict}} = Burn.predict(trained, [[1.0, 2.0, 3.0]])

    avg_loss = Burn.evaluate(trained, {x, y})
    assert is_float(avg_loss) and avg_loss < 0.05

    summary = Burn.summary(trained)
    assert is_binary(summary) and summary =~ "ExBurn Model Summary"
    assert summary =~ ~r/Total params:\s+42 /

    path = Path.join(dir, "my_model.model")
    assert Burn.save(trained, path) == :ok
    assert {:ok, loaded} = Burn.load(trained, path)
    {:ok, p2} = Burn.predict(loaded, x)
    assert Tensor.to_binary(p2) == Tensor.to_binary(predictions)
    assert {:ok, %Model{}} = Burn.load(path)
    assert Burn.free(trained) == :ok
    # fit trains the native model in place: `compiled` and `trained` are one model, now freed
    assert {:error, %ExBurn.Error{reason: "model was freed"}} = Burn.predict(compiled, x)

    fresh = Burn.compile(model, loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05)

    {_m, history} =
      Training.fit_with_progress(fresh, {x, y}, epochs: 3, batch_size: 4, validation_data: {x, y})

    assert [%{epoch: 1, loss: _, val_loss: _}, %{epoch: 2}, %{epoch: 3}] = history

    e = assert_raise ExBurn.Error, fn -> Burn.fit(fresh, {x, y}, epochs: 1, learning_rate: 0.1) end
    assert {e.op, e.details.option} == {:fit, :learning_rate}
  end

  test "optimizer: :sgd uses momentum 0.9 unless given, as the guide's optimizer table says" do
    net = fn -> Model.input({nil, 2}) |> Model.dense(2) end
    assert Burn.compile(net.(), optimizer: :sgd).config.momentum == 0.9
    assert Burn.compile(net.(), optimizer: :sgd, momentum: 0.5).config.momentum == 0.5
    assert Burn.compile(net.(), optimizer: :adam).config.momentum == nil
  end

  test "logging callback" do
    {x, y} = xor()
    m = Burn.compile(Model.input({nil, 2}) |> Model.dense(2), loss: :cross_entropy)

    log =
      ExUnit.CaptureLog.capture_log([level: :info], fn ->
        Burn.fit(m, {x, y}, epochs: 1, callbacks: [Training.logging_callback()])
      end)

    assert log =~ "ExBurn fit epoch 1/1: loss="
  end
end
