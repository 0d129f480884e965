# Compiled only where Nx is present (Nx calls would warn as undefined); the :nx tag keeps it out
# of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule Dala.ML.BurnNxTest do
    # Every Dala.ML.Burn function that returns tensors answers in the caller's representation:
    # Nx in -> Nx tensors on ExBurn.Backend, ExBurn tensors or lists in -> ExBurn tensors.
    use ExUnit.Case, async: false
    @moduletag :nx

    alias Dala.ML.Burn
    alias ExBurn.{Model, Tensor}
    import ExBurn.ModelTestData
    import ExBurn.TestHelpers, only: [product_tolerance: 1]

    @x [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -0.5, 3.0], [-2.0, 0.25, 0.0, 1.0]]

    defp assert_exburn_nx(%Nx.Tensor{data: %ExBurn.Backend{ref: ref}} = t, shape, type)
         when is_reference(ref) do
      assert {Nx.shape(t), Nx.type(t)} == {shape, type}
      t
    end

    # rows computed two ways (a batch and its rows alone): the device's product bound
    defp assert_close_lists(got, expected) do
      delta = product_tolerance(1.0e-6)
      assert length(got) == length(expected)
      for {g, e} <- Enum.zip(got, expected), do: assert_in_delta(g, e, delta)
    end

    describe "predict" do
      test "Nx in gives Nx on ExBurn.Backend; ExBurn tensors, lists and tuples give ExBurn tensors" do
        model = serving_mlp()
        expected = model |> Model.predict(@x) |> Tensor.to_flat_list()
        assert length(expected) == 9

        # Nx input on the binary backend and on ExBurn.Backend
        for backend <- [Nx.BinaryBackend, ExBurn.Backend] do
          x = Nx.tensor(@x, type: :f32, backend: backend)
          assert {:ok, preds} = Burn.predict(model, x)
          assert_exburn_nx(preds, {3, 3}, {:f, 32})
          assert ExBurn.Backend.device(preds) == model.device
          assert Nx.to_flat_list(preds) == expected
          # Nx works on it directly: Nx.argmax takes it without a FunctionClauseError
          argmax = Nx.argmax(preds, axis: 1)
          assert_exburn_nx(argmax, {3}, {:s, 32})

          assert Nx.to_flat_list(argmax) ==
                   model |> Model.predict(@x) |> Tensor.argmax(axis: 1) |> Tensor.to_flat_list()
        end

        # integer Nx input is read as f32, like integer lists
        assert {:ok, preds} = Burn.predict(model, Nx.tensor([[1, 2, 3, 4]]))
        assert_exburn_nx(preds, {1, 3}, {:f, 32})
        {:ok, from_list} = Burn.predict(model, [[1.0, 2.0, 3.0, 4.0]])
        assert Nx.to_flat_list(preds) == Tensor.to_flat_list(from_list)

        # ExBurn inputs and plain lists keep giving ExBurn tensors
        et = Tensor.tensor(@x, type: :f32)
        bin = {Tensor.to_binary(et), {:f, 32}, {3, 4}}

        for input <- [et, @x, bin] do
          assert {:ok, %Tensor{} = preds} = Burn.predict(model, input)
          assert {Tensor.shape(preds), Tensor.type(preds)} == {{3, 3}, {:f, 32}}
          assert Tensor.to_flat_list(preds) == expected
        end

        # options reach ExBurn.Model.predict/3; errors stay {:error, _} for Nx input too
        {:ok, batched} = Burn.predict(model, Nx.tensor(@x), batch_size: 1)
        assert_close_lists(Nx.to_flat_list(batched), expected)
        assert {:error, %ExBurn.Error{op: :predict}} = Burn.predict(model, Nx.tensor([[1.0, 2.0]]))
      end
    end

    test "evaluate takes Nx data and gives the float the ExBurn path gives" do
      model = serving_mlp()
      y = [0, 2, 1]
      model = Burn.compile(model, loss: :cross_entropy, seed: 3)
      expected = Burn.evaluate(model, {@x, y})
      assert is_float(expected) and expected > 0.0

      for x <- [Nx.tensor(@x), Nx.tensor(@x, backend: ExBurn.Backend)],
          y <- [Nx.tensor(y), Nx.tensor(y, type: :s64, backend: ExBurn.Backend)] do
        got = Burn.evaluate(model, {x, y})
        assert is_float(got)
        assert_in_delta got, expected, 1.0e-6
      end

      assert_in_delta Burn.evaluate(model, {Nx.tensor(@x), Nx.tensor(y)}, batch_size: 1),
                      expected,
                      product_tolerance(1.0e-5)
    end

    test "from_nx/to_nx: no copy, independent references, ExBurn.Backend out" do
      et = Tensor.tensor([[1.5, -2.0], [3.0, 4.25]], type: :f32)
      assert {:ok, nx} = Burn.to_nx(et)
      assert_exburn_nx(nx, {2, 2}, {:f, 32})
      assert ExBurn.Backend.device(nx) == et.device
      assert Nx.to_flat_list(nx) == [1.5, -2.0, 3.0, 4.25]
      # freeing the ExBurn tensor leaves the Nx tensor alive
      assert Burn.free(et) == :ok
      assert Nx.to_flat_list(Nx.multiply(nx, 2)) == [3.0, -4.0, 6.0, 8.5]

      assert {:ok, back} = Burn.from_nx(nx)

      assert {Tensor.shape(back), Tensor.type(back), Tensor.to_flat_list(back)} ==
               {{2, 2}, {:f, 32}, [1.5, -2.0, 3.0, 4.25]}

      # freeing the Nx tensor (free/1 takes Nx tensors) leaves the ExBurn tensor alive
      assert Burn.free(nx) == :ok
      assert_raise ExBurn.Error, fn -> Nx.to_flat_list(nx) end
      assert Tensor.to_flat_list(back) == [1.5, -2.0, 3.0, 4.25]

      # s64 survives both ways; Nx.Batch is not a tensor
      {:ok, ints} = Burn.from_nx(Nx.tensor([1, -2, 3], type: :s64))
      assert {Tensor.type(ints), Tensor.to_flat_list(ints)} == {{:s, 64}, [1, -2, 3]}
      {:ok, nx_ints} = Burn.to_nx(ints)
      assert_exburn_nx(nx_ints, {3}, {:s, 64})
      assert {:error, %ExBurn.Error{op: :from_nx}} = Burn.from_nx(Nx.Batch.stack([Nx.tensor([1])]))
    end

    describe "Serving" do
      test "run: Nx and Nx.Batch in give Nx; ExBurn tensors, lists and numbers give ExBurn tensors" do
        model = serving_mlp()
        serving = Burn.Serving.build(model, batch_size: 4)
        [r0, r1 | _] = model |> Model.predict(@x) |> Tensor.to_flat_list() |> Enum.chunk_every(3)

        row = Burn.Serving.run(serving, Nx.tensor(Enum.at(@x, 0)))
        assert_exburn_nx(row, {3}, {:f, 32})
        assert_close_lists(Nx.to_flat_list(row), r0)

        batch = Nx.Batch.stack([Nx.tensor(Enum.at(@x, 0)), Nx.tensor(Enum.at(@x, 1))])
        out = Burn.Serving.run(serving, batch)
        assert_exburn_nx(out, {2, 3}, {:f, 32})
        assert_close_lists(Nx.to_flat_list(out), r0 ++ r1)

        for input <- [Tensor.tensor(Enum.at(@x, 1), type: :f32), Enum.at(@x, 1)] do
          assert %Tensor{} = row = Burn.Serving.run(serving, input)
          assert {Tensor.shape(row), Tensor.type(row)} == {{3}, {:f, 32}}
          assert_close_lists(Tensor.to_flat_list(row), r1)
        end

        square = Burn.Serving.build(fn x -> {Nx.multiply(x, x), %{neg: Nx.negate(x)}} end)
        assert {%Tensor{} = sq, %{neg: %Tensor{} = neg}} = Burn.Serving.run(square, 3.0)
        assert {Tensor.shape(sq), Tensor.to_flat_list(sq), Tensor.to_flat_list(neg)} == {{}, [9.0], [-3.0]}

        {sq, %{neg: neg}} = Burn.Serving.run(square, Nx.tensor([1, 2, 3], type: :s32))
        assert_exburn_nx(sq, {3}, {:s, 32})
        assert_exburn_nx(neg, {3}, {:s, 32})
        assert {Nx.to_flat_list(sq), Nx.to_flat_list(neg)} == {[1, 4, 9], [-1, -2, -3]}
      end

      test "batched_run on a supervised serving answers in the caller's representation" do
        model = serving_mlp()
        {:ok, sup} = DynamicSupervisor.start_link(strategy: :one_for_one)
        name = :"dala_burn_serving_#{System.unique_integer([:positive])}"
        {:ok, _} = Burn.Serving.supervise(model, name: name, supervisor: sup, batch_size: 4)
        rows = model |> Model.predict(@x) |> Tensor.to_flat_list() |> Enum.chunk_every(3)

        results =
          [
            Task.async(fn -> Burn.Serving.batched_run(name, Nx.tensor(Enum.at(@x, 0))) end),
            Task.async(fn -> Burn.Serving.batched_run(name, Tensor.tensor(Enum.at(@x, 1), type: :f32)) end),
            Task.async(fn -> Burn.Serving.batched_run(name, Enum.at(@x, 2)) end)
          ]
          |> Enum.map(&Task.await/1)

        [nx_row, et_row, list_row] = results
        assert_exburn_nx(nx_row, {3}, {:f, 32})
        assert_close_lists(Nx.to_flat_list(nx_row), Enum.at(rows, 0))
        assert %Tensor{shape: {3}, type: {:f, 32}} = et_row
        assert_close_lists(Tensor.to_flat_list(et_row), Enum.at(rows, 1))
        assert %Tensor{shape: {3}, type: {:f, 32}} = list_row
        assert_close_lists(Tensor.to_flat_list(list_row), Enum.at(rows, 2))
      end
    end
  end
end

if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(Axon) do
  defmodule Dala.ML.BurnAxonWorkflowTest do
    # The Dala.ML.Burn workflow end to end with Nx: an Axon model compiled through it, trained
    # on Nx tensors (with validation data and callbacks), predictions used as an Nx tensor.
    use ExUnit.Case, async: false
    @moduletag :nx
    @moduletag :axon

    alias Dala.ML.Burn
    alias Dala.ML.Burn.Training
    # Three well separated classes in 4-D: class k sits around 4 * e_k, jittered by less than 1.
    defp separable(n) do
      Enum.map(0..(n - 1), fn i ->
        label = rem(i, 3)
        row = for d <- 0..3, do: if(d == label, do: 4.0, else: 0.0) + 0.8 * :math.sin(i * 7 + d * 3)
        {row, label}
      end)
      |> Enum.unzip()
    end

    @tag :tmp_dir
    test "compile an Axon model, fit on Nx, predict, Nx.argmax, evaluate, save/load, serve", %{tmp_dir: dir} do
      {rows, labels} = separable(90)
      x = Nx.tensor(rows, type: :f32)
      y = Nx.tensor(labels)
      {val_x, val_y} = {x[0..29], y[0..29]}

      model =
        Axon.input("input", shape: {nil, 4})
        |> Axon.dense(32, activation: :relu)
        |> Axon.dropout(rate: 0.2)
        |> Axon.dense(16, activation: :relu)
        |> Axon.dense(3)

      compiled = Burn.compile(model, loss: :cross_entropy, optimizer: :adam, learning_rate: 0.01)

      trained =
        Burn.fit(compiled, {x, y},
          epochs: 40,
          batch_size: 32,
          validation_data: {val_x, val_y},
          callbacks: [Training.screen_callback(self())]
        )

      assert_received {:training_progress, 40, loss, val_loss} when is_float(loss) and is_float(val_loss)
      assert length(trained.history) == 40

      {:ok, predictions} = Burn.predict(trained, x)
      assert %Nx.Tensor{data: %ExBurn.Backend{}, shape: {90, 3}, type: {:f, 32}} = predictions
      predicted = Nx.argmax(predictions, axis: 1)
      assert Nx.to_flat_list(predicted) == labels
      # what the ExBurn path predicts, value for value
      {:ok, et_preds} = Burn.predict(trained, rows)
      assert Nx.to_flat_list(predictions) == ExBurn.Tensor.to_flat_list(et_preds)

      # evaluate returns the average loss as a float
      avg_loss = Burn.evaluate(trained, {x, y})
      assert is_float(avg_loss) and avg_loss >= 0.0 and avg_loss < 0.1
      assert_in_delta avg_loss, Burn.evaluate(trained, {rows, labels}), 1.0e-6

      {trained, history} =
        Training.fit_with_progress(trained, {x, y},
          epochs: 2,
          batch_size: 32,
          validation_data: {val_x, val_y}
        )

      assert [%{epoch: 1, loss: l, val_loss: v}, %{epoch: 2}] = history
      assert is_float(l) and is_float(v)

      path = Path.join(dir, "my_model.model")
      assert Burn.save(trained, path) == :ok
      assert {:ok, loaded} = Burn.load(trained, path)
      {:ok, again} = Burn.predict(loaded, x)
      {:ok, now} = Burn.predict(trained, x)
      assert Nx.to_binary(again) == Nx.to_binary(now)

      output = Burn.Serving.run(Burn.Serving.build(trained, batch_size: 16), x[0])
      assert %Nx.Tensor{data: %ExBurn.Backend{}, shape: {3}} = output
      assert Nx.to_number(Nx.argmax(output)) == hd(labels)

      assert Burn.free(predictions) == :ok
      assert Burn.free(trained) == :ok
    end

    test "the guide's own model (784 -> 256 -> 128 -> 10) compiles, summarises and predicts Nx" do
      model =
        Axon.input("input", shape: {nil, 784})
        |> Axon.dense(256, activation: :relu)
        |> Axon.dropout(rate: 0.2)
        |> Axon.dense(128, activation: :relu)
        |> Axon.dense(10)

      compiled = Burn.compile(model, loss: :cross_entropy, optimizer: :adam, learning_rate: 0.001)
      summary = Burn.summary(compiled)
      assert summary =~ "ExBurn Model Summary"
      assert summary =~ ~r/Total params:\s+235146 /
      assert summary =~ ~r/Trainable params:\s+235146 /
      assert summary =~ ~r/Non-trainable:\s+0 /
      assert summary =~ ~r/Formatted:\s+235.1K /

      input_tensor = Nx.iota({2, 784}, type: :f32) |> Nx.divide(784)
      {:ok, predictions} = Burn.predict(compiled, input_tensor)
      assert %Nx.Tensor{data: %ExBurn.Backend{}, shape: {2, 10}, type: {:f, 32}} = predictions
      assert Nx.shape(Nx.argmax(predictions, axis: 1)) == {2}
      {:ok, et} = Burn.predict(compiled, Nx.to_list(input_tensor))
      # the same bits on the CPU; a GPU's autotuning may pick another product kernel per call
      for {a, b} <- Enum.zip(Nx.to_flat_list(predictions), ExBurn.Tensor.to_flat_list(et)),
          do: assert_in_delta(a, b, ExBurn.TestHelpers.product_tolerance(0.0))

      assert Burn.free(compiled) == :ok
    end
  end
end
