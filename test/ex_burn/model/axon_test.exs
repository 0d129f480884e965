defmodule ExBurn.Model.AxonTest do
  use ExUnit.Case, async: true
  @moduletag :axon

  alias ExBurn.Model

  # Axon is only called through apply/3 so this file compiles without it.
  defp ax(fun, args), do: apply(Axon, fun, args)

  test "a sequential Axon MLP converts to the same layer list and trains" do
    axon =
      ax(:input, ["input", [shape: {nil, 2}]])
      |> then(&ax(:dense, [&1, 8, [activation: :tanh]]))
      |> then(&ax(:dropout, [&1, [rate: 0.2]]))
      |> then(&ax(:dense, [&1, 2]))

    model = Model.compile(axon, loss: :cross_entropy, learning_rate: 0.05)

    assert model.spec ==
             Model.input({nil, 2})
             |> Model.dense(8, activation: :tanh)
             |> Model.dropout(rate: 0.2)
             |> Model.dense(2)

    {x, y} = ExBurn.ModelTestData.xor()
    model = Model.fit(model, {x, y}, epochs: 300, batch_size: 4)
    assert ExBurn.ModelTestData.accuracy(Model.predict(model, x), y) == 1.0
  end

  test "conv and pooling layers convert" do
    axon =
      ax(:input, ["img", [shape: {nil, 8, 8, 1}]])
      |> then(&ax(:conv, [&1, 4, [kernel_size: {3, 3}, padding: :same, activation: :relu]]))
      |> then(&ax(:max_pool, [&1, [kernel_size: 2]]))
      |> then(&ax(:flatten, [&1]))
      |> then(&ax(:dense, [&1, 3]))

    spec = apply(ExBurn.Model.Axon, :to_spec, [axon])

    assert Enum.map(spec.layers, &elem(&1, 0)) == [:conv2d, :relu, :max_pool, :flatten, :dense]
    assert {:conv2d, [filters: 4, kernel_size: [3, 3], strides: 1, padding: :same]} = hd(spec.layers)
  end

  test "branches and unsupported layers name the layer" do
    input = ax(:input, ["x", [shape: {nil, 4}]])
    merged = ax(:add, [ax(:dense, [input, 4]), ax(:dense, [input, 4])])
    e = assert_raise ExBurn.Error, fn -> Model.compile(merged) end
    assert e.reason == "only sequential Axon graphs are supported" and e.details.op == :add

    e = assert_raise ExBurn.Error, fn -> Model.compile(ax(:selu, [input])) end
    assert e.reason =~ "unsupported Axon layer" and e.details.op == :selu
  end
end
