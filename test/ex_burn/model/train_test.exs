defmodule ExBurn.Model.TrainTest do
  use ExUnit.Case, async: true

  alias ExBurn.{Model, Tensor}
  import ExBurn.ModelTestData
  import ExBurn.TestHelpers, only: [product_tolerance: 0]

  defp xor_model(opts \\ []) do
    Model.input({nil, 2})
    |> Model.dense(8, activation: :tanh)
    |> Model.dense(2)
    |> Model.compile(Keyword.merge([loss: :cross_entropy, optimizer: :adam, learning_rate: 0.05], opts))
  end

  test "XOR is learned to 100% training accuracy" do
    {x, y} = xor()

    {us, {model, history}} =
      :timer.tc(fn -> Model.fit_with_history(xor_model(), {x, y}, epochs: 300, batch_size: 4) end)

    predictions = Model.predict(model, x)
    assert {Tensor.shape(predictions), Tensor.type(predictions)} == {{4, 2}, {:f, 32}}
    assert accuracy(predictions, y) == 1.0
    assert length(history) == 300
    assert Enum.map(history, & &1.epoch) == Enum.to_list(1..300)
    assert List.last(history).loss < 0.05
    assert model.epochs == 300 and model.halted == nil
    assert Model.evaluate(model, {x, y}) < 0.05
    IO.puts("\n  XOR: accuracy 1.0 in #{div(us, 1000)} ms")
  end

  test "a synthetic 10-class problem reaches >= 95% training accuracy" do
    {x, y} = blobs(1000, 10, 16)

    model =
      Model.input({nil, 16})
      |> Model.dense(64, activation: :relu)
      |> Model.dense(10)
      |> Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 0.01, seed: 3)

    assert accuracy(Model.predict(model, x), y) < 0.5
    {us, model} = :timer.tc(fn -> Model.fit(model, {x, y}, epochs: 20, batch_size: 32) end)
    acc = accuracy(Model.predict(model, x), y)
    assert acc >= 0.95, "accuracy #{acc}"
    IO.puts("\n  10-class blobs: accuracy #{acc} in #{div(us, 1000)} ms")
  end

  test "models compiled with the same seed start from the same weights, also when compiled concurrently" do
    xt = Tensor.tensor(elem(xor(), 0), type: :f32)
    tolerance = product_tolerance()

    by_seed =
      1..12
      |> Task.async_stream(
        fn i ->
          model = xor_model(seed: if(rem(i, 2) == 0, do: 42, else: 7))
          {model.seed, Tensor.to_flat_list(Model.predict(model, xt))}
        end,
        max_concurrency: 12,
        timeout: 120_000
      )
      |> Enum.map(fn {:ok, r} -> r end)
      |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))

    assert Map.keys(by_seed) |> Enum.sort() == [7, 42]

    for {_seed, [first | rest]} <- by_seed, other <- rest, {a, b} <- Enum.zip(first, other) do
      assert abs(a - b) <= tolerance * max(abs(a), 1.0), "#{a} vs #{b}"
    end

    assert hd(by_seed[7]) != hd(by_seed[42])
  end

  test "inputs as ExBurn tensors, {binary, type, shape} tuples and lists give the same training" do
    {x, y} = xor()
    xt = Tensor.tensor(x, type: :f32)
    yt = Tensor.tensor(y, type: :s64)
    xb = {Tensor.to_binary(xt), {:f, 32}, {4, 2}}
    yb = {Tensor.to_binary(yt), {:s, 64}, {4}}

    results =
      for data <- [{x, y}, {xt, yt}, {xb, yb}] do
        # SGD: Adam's first steps are about lr * sign(gradient), which turns a GPU's TF32
        # rounding of a near-zero gradient into a full step (predictions hundredths apart)
        model = Model.fit(xor_model(optimizer: :sgd), data, epochs: 5, batch_size: 2, shuffle: false)
        Tensor.to_flat_list(Model.predict(model, xt))
      end

    # bit-identical on the CPU
    [first | rest] = results
    tolerance = product_tolerance()

    for other <- rest, {a, b} <- Enum.zip(first, other) do
      assert abs(a - b) <= tolerance * max(abs(a), 1.0), "#{a} vs #{b}"
    end
  end

  @tag :nx
  test "Nx tensors as inputs and targets train like lists" do
    {x, y} = xor()
    nx_x = apply(Nx, :tensor, [x, [type: :f32]])
    nx_y = apply(Nx, :tensor, [y, [type: :s64]])
    from_nx = Model.fit(xor_model(), {nx_x, nx_y}, epochs: 5, batch_size: 2, shuffle: false)
    from_lists = Model.fit(xor_model(), {x, y}, epochs: 5, batch_size: 2, shuffle: false)
    got = Tensor.to_flat_list(Model.predict(from_nx, nx_x))
    want = Tensor.to_flat_list(Model.predict(from_lists, x))

    for {a, b} <- Enum.zip(got, want),
        do: assert(abs(a - b) <= product_tolerance() * max(abs(b), 1.0), "#{a} vs #{b}")

    assert is_float(Model.evaluate(from_nx, {nx_x, nx_y}))
  end

  test "one-hot float targets, mse and binary cross-entropy train" do
    {x, y} = xor()
    one_hot = Enum.map(y, &if(&1 == 0, do: [1.0, 0.0], else: [0.0, 1.0]))
    m = Model.fit(xor_model(), {x, one_hot}, epochs: 300, batch_size: 4)
    assert accuracy(Model.predict(m, x), y) == 1.0

    for {loss, last} <- [mse: :sigmoid, binary_cross_entropy: nil] do
      spec = Model.input({nil, 2}) |> Model.dense(8, activation: :tanh) |> Model.dense(1)
      spec = if last, do: Model.activation(spec, last), else: spec
      model = Model.compile(spec, loss: loss, learning_rate: 0.05)
      model = Model.fit(model, {x, Enum.map(y, &[&1])}, epochs: 400, batch_size: 4)
      out = Model.predict(model, x) |> Tensor.to_flat_list()
      # binary cross-entropy without a sigmoid outputs logits
      got = Enum.map(out, &if(last, do: round(&1), else: if(&1 > 0, do: 1, else: 0)))
      assert got == y, "#{loss}: #{inspect(out)}"
    end
  end

  test "lr schedules, clipping and every optimizer keep training finite" do
    {x, y} = blobs(200, 4, 8)

    cases = [
      {[optimizer: :sgd, momentum: 0.9], [lr_schedule: {:step, 0.05, 2, 0.5}, clip_norm: 1.0]},
      {[optimizer: :rmsprop, decay: 0.9], [lr_schedule: {:exponential, 0.01, 0.9}, clip_value: 0.5]},
      {[optimizer: :adamw, weight_decay: 0.01],
       [lr_schedule: {:cosine, 0.01, 1.0e-5}, clip_norm: 1.0, clip_value: 0.1]},
      {[optimizer: :adam, clip_norm: 0.5], [verbose: false]}
    ]

    for {compile_opts, fit_opts} <- cases do
      model =
        Model.input({nil, 8})
        |> Model.dense(16, activation: :relu)
        |> Model.dense(4)
        |> Model.compile([loss: :cross_entropy] ++ compile_opts)

      {model, history} = Model.fit_with_history(model, {x, y}, [epochs: 6, batch_size: 16] ++ fit_opts)
      assert length(history) == 6
      assert Enum.all?(history, &(is_float(&1.loss) and &1.loss >= 0 and &1.loss < 10)), inspect(history)
      assert List.last(history).loss < hd(history).loss, "#{inspect(compile_opts)}: #{inspect(history)}"

      for key <- [:clip_norm, :clip_value],
          Keyword.has_key?(fit_opts, key),
          do: assert(model.config[key] == fit_opts[key])

      assert model.epochs == 6
    end
  end

  test "fit with new clipping options changes the live model and keeps its weights" do
    {x, y} = xor()
    model = Model.fit(xor_model(), {x, y}, epochs: 200, batch_size: 4)
    trained_loss = Model.evaluate(model, {x, y})
    untrained_loss = Model.evaluate(xor_model(), {x, y})
    assert trained_loss < untrained_loss / 4

    clipped = Model.fit(model, {x, y}, epochs: 1, batch_size: 4, clip_norm: 1.0, clip_value: 0.5)
    assert {clipped.config.clip_norm, clipped.config.clip_value} == {1.0, 0.5}
    assert clipped.ref == model.ref
    assert clipped.epochs == 201
    # one clipped epoch continues from the trained weights instead of starting over
    assert Model.evaluate(clipped, {x, y}) < untrained_loss / 4

    unclipped = Model.fit(clipped, {x, y}, epochs: 1, batch_size: 4, clip_norm: nil)
    assert unclipped.config.clip_norm == nil
    assert Model.evaluate(unclipped, {x, y}) < untrained_loss / 4
  end

  test "the epoch NIF reports a cancellation as kind: :cancelled, not by its message" do
    {x, y} = xor()
    model = xor_model()
    xt = Tensor.tensor(x, type: :f32)
    yt = Tensor.tensor(y, type: :s64)
    assert ExBurn.Native.model_cancel(model.ref, true) == {:ok, :ok}

    assert {:error, {:fit, _reason, %{kind: :cancelled}}} =
             ExBurn.Native.model_train_epoch(model.ref, xt.ref, yt.ref, 4, false)
  end

  test "validation data gives val_loss, verbose prints one line per epoch" do
    {x, y} = xor()

    output =
      ExUnit.CaptureIO.capture_io(fn ->
        {_m, history} =
          Model.fit_with_history(xor_model(), {x, y},
            epochs: 3,
            batch_size: 4,
            validation_data: {x, y},
            verbose: true
          )

        send(self(), {:history, history})
      end)

    assert_received {:history, history}
    assert Enum.map(history, &Map.keys/1) == List.duplicate([:epoch, :loss, :val_loss], 3)
    assert Enum.all?(history, &is_float(&1.val_loss))
    assert [l1, l2, l3] = String.split(output, "\n", trim: true)
    assert l1 =~ ~r/^Epoch 1\/3 - loss: \d+\.\d{6} - val_loss: \d+\.\d{6} \(\d+ ms\)$/
    assert l2 =~ "Epoch 2/3" and l3 =~ "Epoch 3/3"
  end

  test "dropout and batch norm train; evaluate and predict run in inference mode" do
    {x, y} = blobs(300, 3, 4)

    model =
      Model.input({nil, 4})
      |> Model.dense(32)
      |> Model.batch_norm()
      |> Model.relu()
      |> Model.dropout(rate: 0.2)
      |> Model.layer_norm()
      |> Model.dense(3)
      |> Model.compile(loss: :cross_entropy, learning_rate: 0.01)

    model = Model.fit(model, {x, y}, epochs: 15, batch_size: 32)
    p1 = Tensor.to_binary(Model.predict(model, x))
    assert Tensor.to_binary(Model.predict(model, x, batch_size: 7)) |> byte_size() == byte_size(p1)
    assert Tensor.to_binary(Model.predict(model, x)) == p1
    assert accuracy(Model.predict(model, x), y) >= 0.9
    assert_in_delta Model.evaluate(model, {x, y}), Model.evaluate(model, {x, y}, batch_size: 300), 1.0e-6
  end

  test "data errors are ExBurn.Error" do
    model = xor_model()

    e = assert_raise ExBurn.Error, fn -> Model.fit(model, {[[1.0, 2.0, 3.0]], [0]}, epochs: 1) end
    assert {e.op, e.reason} == {:fit, "inputs do not match the model's input shape"}

    e = assert_raise ExBurn.Error, fn -> Model.fit(model, {[[1.0, 2.0]], [0, 1]}, epochs: 1) end
    assert {e.op, e.reason} == {:fit, "inputs and targets have different numbers of samples"}

    e = assert_raise ExBurn.Error, fn -> Model.predict(model, [[1.0]]) end
    assert {e.op, e.reason} == {:predict, "inputs do not match the model's input shape"}

    e = assert_raise ExBurn.Error, fn -> Model.fit(model, [[1.0, 2.0]], epochs: 1) end
    assert {e.op, e.reason} == {:fit, "expected data as an {inputs, targets} tuple"}

    e = assert_raise ExBurn.Error, fn -> Model.predict(model, :junk) end
    assert {e.op, e.reason} == {:predict, "cannot use this as inputs"}

    e = assert_raise ExBurn.Error, fn -> Model.evaluate(model, {[[1.0, 2.0]], [[0.1, 0.2, 0.3]]}) end
    assert e.op == :evaluate
  end

  test "a diverging fit raises and leaves the last good model" do
    {x, _} = xor()

    model =
      Model.input({nil, 2})
      |> Model.dense(1)
      |> Model.compile(loss: :mse, optimizer: :sgd, learning_rate: 1.0e30)

    before = Tensor.to_binary(Model.predict(model, x))

    e =
      assert_raise ExBurn.Error, fn ->
        Model.fit(model, {x, [[1.0e30], [-1.0e30], [1.0e30], [0.0]]}, epochs: 3, batch_size: 1)
      end

    assert e.op == :fit and e.reason =~ "training diverged"
    assert Tensor.to_binary(Model.predict(model, x)) == before
  end
end
