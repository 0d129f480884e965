# Compiled only where Nx is present (doctest/Nx calls expand at compile time); the :nx tag
# keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.OpsTest do
    # Each op runs on ExBurn.Backend and on Nx.BinaryBackend from the same inputs; results must
    # agree (floats within a tolerance) and, for ops with a Burn kernel, nothing may fall back.
    use ExUnit.Case, async: false

    @moduletag :nx

    alias ExBurn.Backend.Fallback

    # test/ex_burn/defn/ops_jit_test.exs recompiles this module with @jit true
    @jit false

    defp on(data, type), do: Nx.tensor(data, type: type, backend: Nx.BinaryBackend)

    # Runs `fun` on both backends; `inputs` are {data, type} pairs.
    defp same(fun, inputs, opts \\ []) do
      inputs = Enum.map(inputs, fn {d, t} -> on(d, t) end)
      ExBurn.NxCompare.same(fun, inputs, [jit: @jit] ++ opts)
    end

    @m [[1.5, -2.0, 3.25], [0.0, 4.5, -1.0]]
    @i [[3, 1, 2], [1, 3, 3]]

    test "element-wise ops honour out's type and mix in BinaryBackend scalars" do
      same(&Nx.add(&1, &2), [{@m, :f32}, {@i, :s8}])
      same(&Nx.divide(&1, 3), [{@i, :s32}])
      same(&Nx.pow(&1, 2), [{@i, :u8}])
      same(&Nx.greater(&1, &2), [{@m, :f32}, {@i, :s64}])
      same(&Nx.exp(&1), [{@m, :f64}])
      same(&Nx.bitwise_xor(&1, 5), [{@i, :s16}])
      same(&Nx.add(&1, Nx.tensor(2.5, backend: Nx.BinaryBackend)), [{@i, :s32}])
    end

    test "reductions and arg reductions" do
      same(&Nx.sum(&1, axes: [1]), [{@m, :f32}])
      same(&Nx.product(&1, axes: [0], keep_axes: true), [{@i, :u8}])
      same(&Nx.reduce_max(&1), [{@m, :bf16}])
      same(&Nx.argmax(&1, axis: 1, tie_break: :high), [{@i, :s32}])
      same(&Nx.argmin(&1, axis: 1), [{[[1.0, :nan, 0.0], [2.0, 1.0, 3.0]], :f32}])
      # several NaNs in a slice: BinaryBackend's index is the last NaN's, whatever the tie break
      nans = [{[[1.0, :nan, 2.0, :nan, 0.5], [:nan, 3.0, :nan, 1.0, :nan]], :f32}]

      for op <- [:argmax, :argmin], tie_break <- [:low, :high] do
        same(&apply(Nx, op, [&1, [axis: 1, tie_break: tie_break]]), nans)
        same(&apply(Nx, op, [&1, [tie_break: tie_break]]), nans)
      end

      same(&Nx.all(&1, axes: [0]), [{@i, :s32}])
    end

    test "f32 sums accumulate without drift" do
      data = List.duplicate(0.1, 10_000)
      same(&Nx.sum/1, [{data, :f32}], atol: 1.0e-4)
    end

    test "dot with batch axes, shape ops, select and clip" do
      same(&Nx.dot(&1, [2], [0], &2, [1], [0]), [
        {[@m, @m], :f32},
        {[[[1.0], [2.0], [3.0]], [[0.5], [0.0], [1.0]]], :f32}
      ])

      same(&Nx.transpose(&1, axes: [1, 0]), [{@m, :f32}])
      same(&Nx.slice(&1, [1, 1], [1, 2], strides: [1, 1]), [{@m, :f32}])
      same(&Nx.slice(&1, [Nx.tensor(1), Nx.tensor(5)], [1, 2]), [{@m, :f32}])
      same(&Nx.concatenate([&1, &2], axis: 1), [{@m, :f32}, {@i, :s32}])
      same(&Nx.select(Nx.greater(&1, 1), &1, &2), [{@m, :f32}, {@i, :s32}])
      same(&Nx.clip(&1, 0, 2), [{@m, :f32}])
      same(&Nx.reshape(&1, {3, 2}, names: [:a, :b]), [{@m, :f32}])
    end

    test "reverse, sort, argsort (stable), put_slice, pad" do
      same(&Nx.reverse(&1, axes: [1]), [{@i, :s32}])
      same(&Nx.sort(&1, axis: 1, direction: :desc), [{@m, :f32}])
      same(&Nx.argsort(&1, axis: 1, stable: true), [{@i, :u8}])
      same(&Nx.argsort(&1, axis: 0, direction: :desc, stable: true), [{@i, :s32}])
      same(&Nx.put_slice(&1, [1, 2], Nx.tensor([[9.5, 8.5]])), [{@m, :f32}])
      same(&Nx.pad(&1, 0.5, [{1, -1, 0}, {2, 0, 0}]), [{@m, :f32}])
      same(&Nx.pad(&1, 0, [{0, 0, 1}, {0, 0, 0}]), [{@i, :s32}], native: false)
    end

    test "gather, take, take_along_axis, indexed ops, cumulative ops, top_k" do
      same(&Nx.gather(&1, Nx.tensor([[1, 2], [0, 0], [1, 0]])), [{@m, :f32}])
      same(&Nx.gather(&1, Nx.tensor([[2], [0]]), axes: [1]), [{@i, :s32}])
      same(&Nx.take(&1, Nx.tensor([2, 0, 2]), axis: 1), [{@m, :f32}])
      same(&Nx.take_along_axis(&1, Nx.tensor([[2, 0], [1, 1]]), axis: 1), [{@i, :s64}])
      same(&Nx.indexed_add(&1, Nx.tensor([[0, 1], [0, 1], [1, 2]]), Nx.tensor([1.0, 2.0, 3.0])), [{@m, :f32}])
      same(&Nx.indexed_put(&1, Nx.tensor([[1], [0]]), Nx.tensor([[7, 8], [9, 10]]), axes: [1]), [{@i, :s32}])
      same(&Nx.cumulative_sum(&1, axis: 1), [{@i, :s32}])
      same(&Nx.cumulative_max(&1, axis: 1, reverse: true), [{@m, :f32}])
      same(&Nx.cumulative_product(&1, axis: 0), [{@m, :f64}])
      same(&Nx.top_k(&1, k: 2), [{@m, :f32}])
    end

    test "gather raises on out-of-range coordinates like BinaryBackend" do
      t = Nx.tensor(@m, type: :f32, backend: ExBurn.Backend)
      assert_raise ArgumentError, fn -> Nx.gather(t, Nx.tensor([[0, 3]])) end
    end

    test "reduce and window_reduce take Elixir functions (counted fallback)" do
      same(&Nx.reduce(&1, 0, [axes: [1]], fn x, acc -> Nx.add(x, acc) end), [{@i, :s32}], native: false)
      same(&Nx.window_reduce(&1, 0.0, {1, 2}, fn x, acc -> Nx.max(x, acc) end), [{@m, :f32}], native: false)
    end

    test "types Burn lacks are held on the host and computed by the fallback" do
      c = Nx.complex(Nx.tensor([1.0, 2.0]), Nx.tensor([0.5, -1.0]))
      z = Nx.backend_transfer(c, ExBurn.Backend)
      Fallback.reset()
      r = Nx.multiply(z, z)
      assert r.data.__struct__ == ExBurn.Backend
      assert Nx.backend_copy(r, Nx.BinaryBackend) == Nx.multiply(c, c)
      assert Fallback.counts() == %{multiply: 1}
    end

    test "a copy on the same device outlives the original's deallocation" do
      t = Nx.tensor([1.5, 2.5], backend: ExBurn.Backend)
      copy = Nx.backend_copy(t, ExBurn.Backend)
      assert copy.data.ref != t.data.ref
      assert Nx.backend_deallocate(t) == :ok
      assert Nx.to_flat_list(copy) == [1.5, 2.5]
      assert_raise ExBurn.Error, ~r/deallocated/, fn -> Nx.to_flat_list(t) end
    end

    test "device option, transfer and to_batched" do
      t = Nx.tensor([[1, 2], [3, 4], [5, 6]], backend: {ExBurn.Backend, device: :cpu})
      assert ExBurn.Backend.device(t) == {:cpu, 0}
      batches = t |> Nx.to_batched(2, leftover: :repeat) |> Enum.map(&Nx.to_flat_list/1)
      assert batches == [[1, 2, 3, 4], [5, 6, 1, 2]]
      host = Nx.backend_transfer(t, Nx.BinaryBackend)
      assert host == Nx.tensor([[1, 2], [3, 4], [5, 6]], backend: Nx.BinaryBackend)
    end
  end
end
