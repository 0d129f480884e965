# Axon and Nx are optional: the module exists only when both are loaded (on Elixir 1.14 macros in
# a module body expand even inside a false `if`, so the whole module is conditional).
if Code.ensure_loaded?(Axon) and Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.AxonLoopTest do
    use ExUnit.Case, async: false
    @moduletag :axon

    setup do
      previous = Nx.default_backend(ExBurn.Backend)
      on_exit(fn -> Nx.default_backend(previous) end)
    end

    test "Axon.Loop trains XOR end to end with compiler: ExBurn" do
      {x, y} = ExBurn.ModelTestData.xor()
      x = Nx.tensor(x, type: :f32)
      y = y |> Nx.tensor() |> Nx.new_axis(-1) |> Nx.equal(Nx.iota({1, 2}, axis: 1)) |> Nx.as_type(:f32)

      model =
        Axon.input("x", shape: {nil, 2})
        |> Axon.dense(8, activation: :tanh)
        |> Axon.dense(2, activation: :softmax)

      data = Stream.repeatedly(fn -> {x, y} end)
      optimizer = Polaris.Optimizers.adam(learning_rate: 0.05)

      state =
        model
        |> Axon.Loop.trainer(:categorical_cross_entropy, optimizer, log: 0)
        |> Axon.Loop.run(data, Axon.ModelState.empty(), epochs: 1, iterations: 300, compiler: ExBurn)

      {_init, predict} = Axon.build(model, compiler: ExBurn)
      predictions = predict.(state, x)
      assert predictions.data.__struct__ == ExBurn.Backend
      assert predictions |> Nx.argmax(axis: 1) |> Nx.to_flat_list() == [0, 1, 1, 0]
    end
  end
end
