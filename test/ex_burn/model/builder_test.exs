defmodule ExBurn.Model.BuilderTest do
  use ExUnit.Case, async: true

  alias ExBurn.{Model, Tensor}
  alias ExBurn.Model.Spec

  defp rows(model), do: Enum.map(Model.summary(model).layers, &{&1.name, &1.output_shape, &1.params})

  test "the builder fills every default into the layer list" do
    spec =
      Model.input({nil, 28, 28, 1})
      |> Model.conv2d(4, kernel_size: {3, 3}, activation: :relu)
      |> Model.max_pool()
      |> Model.flatten()
      |> Model.dropout()
      |> Model.dense(10, use_bias: false)
      |> Model.leaky_relu(alpha: 0.2)

    assert spec == %Spec{
             input_shape: [28, 28, 1],
             input_type: {:f, 32},
             layers: [
               {:conv2d, filters: 4, kernel_size: [3, 3], strides: 1, padding: :valid},
               {:relu, []},
               {:max_pool, kernel_size: 2, strides: 2},
               {:flatten, []},
               {:dropout, rate: 0.5},
               {:dense, units: 10, use_bias: false},
               {:leaky_relu, alpha: 0.2}
             ]
           }
  end

  test "an MLP summary: parameters, shapes and the formatted box" do
    model =
      Model.input({nil, 784})
      |> Model.dense(256, activation: :relu)
      |> Model.dropout(rate: 0.2)
      |> Model.dense(128, activation: :relu)
      |> Model.dense(10)
      |> Model.compile(loss: :cross_entropy)

    summary = Model.summary(model)
    assert {summary.params, summary.trainable, summary.non_trainable} == {235_146, 235_146, 0}
    assert summary.input_shape == {nil, 784}

    assert rows(model) == [
             {"dense_0", {nil, 256}, 200_960},
             {"relu_0", {nil, 256}, 0},
             {"dropout_0", {nil, 256}, 0},
             {"dense_1", {nil, 128}, 32_896},
             {"relu_1", {nil, 128}, 0},
             {"dense_2", {nil, 10}, 1290}
           ]

    text = Model.summary_string(model)
    lines = String.split(text, "\n")
    assert Enum.all?(lines, &(String.length(&1) == 60))
    assert "║  Total params:                                   235146  ║" in lines
    assert "║  Formatted:                                      235.1K  ║" in lines
    assert Enum.any?(lines, &(&1 =~ ~r/dense_0\s+\{nil, 256\}\s+200960/))

    assert inspect(model) =~
             "#ExBurn.Model<dense_0, relu_0, dropout_0, dense_1, relu_1, dense_2; 235146 params, 0 epochs"
  end

  test "conv2d + pooling: summary shapes, and a few training steps" do
    model =
      Model.input({nil, 8, 8, 1})
      |> Model.conv2d(4, kernel_size: 3, padding: :same, activation: :relu)
      |> Model.max_pool(kernel_size: 2)
      |> Model.conv2d(6, kernel_size: {3, 3}, strides: {1, 1})
      |> Model.avg_pool(kernel_size: {2, 2}, strides: 1)
      |> Model.batch_norm()
      |> Model.flatten()
      |> Model.dense(3)
      |> Model.compile(loss: :cross_entropy, learning_rate: 0.01)

    assert rows(model) == [
             {"conv2d_0", {nil, 8, 8, 4}, 40},
             {"relu_0", {nil, 8, 8, 4}, 0},
             {"max_pool_0", {nil, 4, 4, 4}, 0},
             {"conv2d_1", {nil, 2, 2, 6}, 222},
             {"avg_pool_0", {nil, 1, 1, 6}, 0},
             {"batch_norm_0", {nil, 1, 1, 6}, 24},
             {"flatten_0", {nil, 6}, 0},
             {"dense_0", {nil, 3}, 21}
           ]

    assert Model.summary(model).non_trainable == 12
    assert Model.summary(model).trainable == 40 + 222 + 12 + 21
    train_a_few_steps(model, {12, 8, 8, 1}, 3)
  end

  test "global average pooling and conv1d on sequences" do
    model =
      Model.input({nil, 10, 3})
      |> Model.conv1d(5, kernel_size: 3, activation: :gelu)
      |> Model.max_pool(kernel_size: 2)
      |> Model.global_avg_pool()
      |> Model.dense(2, activation: :softmax)
      |> Model.compile(loss: :cross_entropy)

    assert rows(model) == [
             {"conv1d_0", {nil, 8, 5}, 50},
             {"gelu_0", {nil, 8, 5}, 0},
             {"max_pool_0", {nil, 4, 5}, 0},
             {"global_avg_pool_0", {nil, 5}, 0},
             {"dense_0", {nil, 2}, 12},
             {"softmax_0", {nil, 2}, 0}
           ]

    train_a_few_steps(model, {6, 10, 3}, 2)
  end

  test "embedding + lstm / gru on integer tokens" do
    for {rnn, per_unit} <- [lstm: 4, gru: 3] do
      model =
        Model.input({nil, 5}, type: :s64)
        |> Model.embedding(20, 4)
        |> then(&apply(Model, rnn, [&1, 6, [return_sequences: true]]))
        |> then(&apply(Model, rnn, [&1, 3, [return_sequences: false]]))
        |> Model.dense(2)
        |> Model.compile(loss: :cross_entropy, learning_rate: 0.01)

      [emb, r1, r2, dense] = rows(model)
      assert emb == {"embedding_0", {nil, 5, 4}, 80}
      assert {elem(r1, 0), elem(r1, 1)} == {"#{rnn}_0", {nil, 5, 6}}
      assert {elem(r2, 0), elem(r2, 1)} == {"#{rnn}_1", {nil, 3}}
      # each gate has input and hidden weights plus biases (Burn's layout has one or two bias vectors)
      assert elem(r1, 2) >= per_unit * 6 * (4 + 6 + 1)
      assert dense == {"dense_0", {nil, 2}, 8}

      tokens = for i <- 0..7, do: for(j <- 0..4, do: rem(i * 3 + j, 20))
      labels = for i <- 0..7, do: rem(i, 2)
      {_m, history} = Model.fit_with_history(model, {tokens, labels}, epochs: 3, batch_size: 4)
      assert length(history) == 3 and Enum.all?(history, &(&1.loss > 0 and &1.loss < 5))
      out = Model.predict(model, Tensor.tensor(tokens, type: :s64))
      assert Tensor.shape(out) == {8, 2}

      e =
        assert_raise ExBurn.Error, fn ->
          Model.predict(model, Tensor.tensor([[0.5, 1.0, 2.0, 3.0, 4.0]], type: :f32))
        end

      assert e.reason == "token inputs must be integers"
    end
  end

  test "activation shorthands build the named layers" do
    spec = Model.input({nil, 3})

    spec =
      Enum.reduce([:relu, :gelu, :sigmoid, :tanh, :softmax, :log_softmax, :silu, :leaky_relu], spec, fn name,
                                                                                                        acc ->
        apply(Model, name, [acc])
      end)

    assert Enum.map(spec.layers, &elem(&1, 0)) == [
             :relu,
             :gelu,
             :sigmoid,
             :tanh,
             :softmax,
             :log_softmax,
             :silu,
             :leaky_relu
           ]

    assert List.last(spec.layers) == {:leaky_relu, alpha: 0.01}
    model = Model.compile(spec)
    assert Tensor.shape(Model.predict(model, [[1.0, 2.0, 3.0]])) == {1, 3}
  end

  test "builder and compile errors name the option or layer" do
    base = Model.input({nil, 4})

    cases = [
      {fn -> Model.dense(base, 4, activaton: :relu) end, :dense, :activaton},
      {fn -> Model.dense(base, 0) end, :dense, :units},
      {fn -> Model.dense(base, 4, activation: :swish) end, :activation, :activation},
      {fn -> Model.conv2d(base, 4, padding: :full) end, :conv2d, :padding},
      {fn -> Model.conv2d(base, 4, kernel_size: {0, 2}) end, :conv2d, :kernel_size},
      {fn -> Model.dropout(base, rate: 1.5) end, :dropout, :rate},
      {fn -> Model.lstm(base, 4, return_sequences: :yes) end, :lstm, :return_sequences},
      {fn -> Model.input({nil, 4}, type: :f64) end, :input, :type},
      {fn -> Model.compile(Model.dense(base, 2), loss: :hinge) end, :compile, :loss},
      {fn -> Model.compile(Model.dense(base, 2), optimizer: :lbfgs) end, :compile, :optimizer},
      {fn -> Model.compile(Model.dense(base, 2), learning_rate: -1) end, :compile, :learning_rate},
      {fn -> Model.compile(Model.dense(base, 2), learning_rte: 0.1) end, :compile, :learning_rte},
      {fn -> Model.compile(Model.dense(base, 2), decay: 0.9) end, :compile, :decay},
      {fn -> Model.compile(Model.dense(base, 2), clip_norm: 0) end, :compile, :clip_norm},
      {fn -> Model.compile(Model.dense(base, 2), seed: -3) end, :compile, :seed}
    ]

    for {fun, op, option} <- cases do
      e = assert_raise ExBurn.Error, fun
      assert {e.op, e.details[:option]} == {op, option}, inspect(e)
      assert e.reason =~ inspect(option)
    end

    e = assert_raise ExBurn.Error, fn -> Model.compile(base) end
    assert e.reason == "the model has no layers"

    e = assert_raise ExBurn.Error, fn -> Model.embedding(base, 10, 4) end
    assert e.op == :embedding

    # a layer that cannot take its input's shape: the native side names it
    e = assert_raise ExBurn.Error, fn -> base |> Model.conv2d(2) |> Model.compile() end
    assert e.op == :compile and e.reason =~ "conv2d"

    e =
      assert_raise ExBurn.Error, fn -> Model.compile(%Spec{input_shape: [4], layers: [{:frobnicate, []}]}) end

    assert {e.op, e.reason, e.details} ==
             {:compile, "unknown layer :frobnicate", %{argument: "layer", variant: "frobnicate", index: 0}}

    e = assert_raise ExBurn.Error, fn -> Model.compile(:nope) end
    assert e.op == :compile
  end

  test "fit, predict and evaluate reject unknown and invalid options, naming them" do
    model = Model.input({nil, 2}) |> Model.dense(2) |> Model.compile(loss: :cross_entropy)
    data = {[[0.0, 1.0]], [1]}

    cases = [
      {fn -> Model.fit(model, data, epoch: 3) end, :fit, :epoch},
      {fn -> Model.fit(model, data, epochs: 0) end, :fit, :epochs},
      {fn -> Model.fit(model, data, batch_size: -1) end, :fit, :batch_size},
      {fn -> Model.fit(model, data, shuffle: 1) end, :fit, :shuffle},
      {fn -> Model.fit(model, data, lr_schedule: {:linear, 0.1}) end, :fit, :lr_schedule},
      {fn -> Model.fit(model, data, lr_schedule: {:step, 0.1, 0, 0.5}) end, :fit, :lr_schedule},
      {fn -> Model.fit(model, data, lr_schedule: {:cosine, -0.1, 0.0}) end, :fit, :lr_schedule},
      {fn -> Model.fit(model, data, clip_norm: "1") end, :fit, :clip_norm},
      {fn -> Model.fit(model, data, callbacks: [fn -> :ok end]) end, :fit, :callbacks},
      {fn -> Model.fit(model, data, validation_data: [1]) end, :fit, :validation_data},
      {fn -> Model.fit(model, data, verbose: :loud) end, :fit, :verbose},
      {fn -> Model.predict(model, [[0.0, 1.0]], batch: 2) end, :predict, :batch},
      {fn -> Model.evaluate(model, data, batch_size: 0) end, :evaluate, :batch_size}
    ]

    for {fun, op, option} <- cases do
      e = assert_raise ExBurn.Error, fun
      assert {e.op, e.details[:option]} == {op, option}, inspect(e)
    end
  end

  defp train_a_few_steps(model, shape, classes) do
    n = elem(shape, 0)
    x = Tensor.iota(shape, :f32) |> Tensor.divide(Tensor.size(Tensor.iota(shape, :f32)))
    y = Enum.map(0..(n - 1), &rem(&1, classes))
    {model, history} = Model.fit_with_history(model, {x, y}, epochs: 3, batch_size: 4)
    assert length(history) == 3
    assert Enum.all?(history, &(is_float(&1.loss) and &1.loss > 0 and &1.loss < 10)), inspect(history)
    out = Model.predict(model, x)
    assert {Tensor.shape(out), Tensor.type(out)} == {{n, classes}, {:f, 32}}
  end
end
