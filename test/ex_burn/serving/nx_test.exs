# Compiled only where Nx is present (Nx calls would warn as undefined); the :nx tag keeps it
# out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.NxTest do
    use ExUnit.Case, async: true
    import ExBurn.TestHelpers, only: [wait_until: 1, product_tolerance: 1, call_timeout: 0]
    @moduletag :nx

    alias ExBurn.{Error, Model, Tensor}

    defp mlp, do: ExBurn.ModelTestData.serving_mlp()

    defp input(i), do: ExBurn.ModelTestData.serving_input(i)

    defp expected(model, i), do: model |> Model.predict([input(i)]) |> Tensor.to_flat_list()

    defp assert_row(row, expected) do
      assert Nx.shape(row) == {length(expected)}

      for {g, e} <- Enum.zip(Nx.to_flat_list(row), expected),
          do: assert_in_delta(g, e, product_tolerance(1.0e-5))
    end

    defp unique(prefix), do: :"#{prefix}_#{System.unique_integer([:positive])}"

    test "run/2 inline: one sample comes back as its row, a batch keeps the batch axis" do
      model = mlp()
      serving = ExBurn.Serving.build(model, batch_size: 4)
      assert serving.__struct__ == Nx.Serving

      row = ExBurn.Serving.run(serving, Nx.tensor(input(1)))
      assert_row(row, expected(model, 1))
      assert ExBurn.Backend.device(row) == ExBurn.default_device()

      # 6 rows with batch_size 4: Nx.Serving splits the batch into 4 + 2 and joins the outputs.
      batch = Nx.Batch.stack(for i <- 1..6, do: Nx.tensor(input(i)))
      out = ExBurn.Serving.run(serving, batch)
      assert Nx.shape(out) == {6, 3}
      for i <- 1..6, do: assert_row(out[i - 1], expected(model, i))
    end

    test "a function target runs on ExBurn.Backend with the evaluator (exact values)" do
      serving = ExBurn.Serving.build(fn x -> x |> Nx.multiply(2) |> Nx.add(1) end)
      assert ExBurn.Serving.Nx.inner_compiler() in [Nx.Defn.Evaluator, ExBurn.Defn.Compiler]

      out =
        ExBurn.Serving.run(
          serving,
          Nx.Batch.stack([Nx.tensor([1, 2], type: :s32), Nx.tensor([3, -4], type: :s32)])
        )

      assert Nx.to_flat_list(out) == [3, 5, 7, -7]
      assert Nx.type(out) == {:s, 32}
      assert out.data.__struct__ == ExBurn.Backend

      # an ExBurn.Tensor or a list as the sample
      assert Nx.to_flat_list(ExBurn.Serving.run(serving, Tensor.tensor([5, 6], type: :s32))) == [11, 13]
      assert Nx.to_flat_list(ExBurn.Serving.run(serving, [7])) == [15]
    end

    test "256 batched requests from 64 processes on a supervised serving get their own rows" do
      model = mlp()
      name = unique(:serving_mlp)
      sup = start_supervised!({DynamicSupervisor, name: unique(:dyn)})

      assert {:ok, _} =
               ExBurn.Serving.supervise(model, name: name, supervisor: sup, batch_size: 16, batch_timeout: 5)

      results =
        1..64
        |> Enum.map(fn c ->
          Task.async(fn ->
            for r <- 1..4, i = c * 10 + r, do: {i, ExBurn.Serving.batched_run(name, Nx.tensor(input(i)))}
          end)
        end)
        |> Enum.flat_map(&Task.await(&1, max(30_000, call_timeout())))

      assert length(results) == 256
      for {i, row} <- results, do: assert_row(row, expected(model, i))
    end

    test "partitions: one worker per requested count, round robin over devices" do
      opts =
        ExBurn.Serving.Partitions.__partitions_options__(
          exburn_devices: [{:cpu, 0}],
          exburn_partitions: 3,
          compiler: ExBurn.Serving.Partitions
        )

      assert Enum.map(opts, &{&1[:exburn_partition], &1[:exburn_device]}) == [
               {0, {:cpu, 0}},
               {1, {:cpu, 0}},
               {2, {:cpu, 0}}
             ]

      model = mlp()
      name = unique(:serving_parts)
      sup = start_supervised!({DynamicSupervisor, name: unique(:dyn)})

      {:ok, _} =
        ExBurn.Serving.supervise(model,
          name: name,
          supervisor: sup,
          partitions: 2,
          device: [:cpu],
          batch_size: 2,
          batch_timeout: 0
        )

      # Nx.Serving keeps one free slot per partition until work arrives.
      assert :queue.len(:sys.get_state(name).out_queue) == 2

      results =
        1..40
        |> Enum.map(fn i ->
          Task.async(fn -> {i, ExBurn.Serving.batched_run(name, Nx.tensor(input(i)))} end)
        end)
        |> Enum.map(&Task.await/1)

      for {i, row} <- results, do: assert_row(row, expected(model, i))
    end

    test "a serving killed under its DynamicSupervisor is restarted and serves again" do
      sup = start_supervised!({DynamicSupervisor, name: unique(:dyn)})
      name = unique(:serving_restart)

      {:ok, _} =
        Dala.ML.Burn.Serving.supervise(fn x -> Nx.add(x, 1) end, name: name, supervisor: sup, batch_size: 4)

      assert Nx.to_flat_list(ExBurn.Serving.batched_run(name, Nx.tensor([1, 2]))) == [2, 3]

      old = Process.whereis(name)
      ref = Process.monitor(old)
      Process.exit(old, :kill)
      assert_receive {:DOWN, ^ref, :process, ^old, :killed}
      wait_until(fn -> Process.whereis(name) not in [nil, old] end)

      assert Nx.to_flat_list(Dala.ML.Burn.Serving.batched_run(name, Nx.tensor([41, 42]))) == [42, 43]
    end

    test "Dala.ML.Burn.Serving builds, supervises and serves as a plain child" do
      model = mlp()
      serving = Dala.ML.Burn.Serving.build(model, batch_size: 16, batch_timeout: 100)
      assert_row(Dala.ML.Burn.Serving.run(serving, Nx.tensor(input(3))), expected(model, 3))

      sup = start_supervised!({DynamicSupervisor, name: unique(:dyn)})
      name = unique(:my_model_serving)
      assert {:ok, pid} = Dala.ML.Burn.Serving.supervise(model, name: name, supervisor: sup)
      assert is_pid(pid)
      assert_row(Nx.Serving.batched_run(name, Nx.tensor(input(4))), expected(model, 4))

      # as a plain child of the application's tree
      name2 = unique(:child_serving)
      start_supervised!({Nx.Serving, serving: Dala.ML.Burn.Serving.build(model, batch_size: 32), name: name2})
      assert_row(Nx.Serving.batched_run(name2, Nx.tensor(input(5))), expected(model, 5))
    end

    test "bad options raise ExBurn.Error naming them" do
      assert_raise Error, ~r/unknown options/, fn -> ExBurn.Serving.build(& &1, batch: 2) end

      assert_raise Error, ~r/:partitions must be a positive integer/, fn ->
        ExBurn.Serving.build(& &1, partitions: 0)
      end

      assert_raise Error, ~r/invalid device/, fn -> ExBurn.Serving.build(& &1, device: :tpu) end
      assert_raise Error, ~r/expected an ExBurn.Model/, fn -> ExBurn.Serving.build(:nope) end
    end
  end
end
