# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.LoweringFuns do
    @moduledoc false
    import Nx.Defn

    defn branch(x) do
      if Nx.sum(x) > 0, do: x + 1, else: x * 10
    end

    defn multi(x, k) do
      cond do
        k == 0 -> {x, Nx.sum(x)}
        k == 1 -> {x * 2, Nx.reduce_max(x)}
        true -> {Nx.exp(x), Nx.reduce_min(x)}
      end
    end

    # the untaken branch divides by zero (an error for integers): it must not run
    defn safe_divide(x, d) do
      if d == 0, do: x, else: Nx.quotient(x, d)
    end

    defn nested(x, k) do
      y = Nx.sin(x)

      if k > 0 do
        z = if k > 1, do: y * 3, else: y - 1
        z + y
      else
        y
      end
    end

    defn power_loop(x, n) do
      {_i, _n, _x, acc} =
        while {i = 0, n, x, acc = Nx.broadcast(1.0, x)}, i < n do
          {i + 1, n, x, acc * x}
        end

      acc
    end

    # a cond in a while
    defn collatz_steps(x) do
      {_x, steps} =
        while {x, steps = 0}, x > 1 do
          x = if Nx.remainder(x, 2) == 0, do: Nx.quotient(x, 2), else: 3 * x + 1
          {x, steps + 1}
        end

      steps
    end

    # a while in a while in a cond
    defn nested_loops(x) do
      if Nx.sum(x) > 0 do
        {_, acc} =
          while {i = 0, acc = x}, i < 3 do
            {_, inner} =
              while {j = 0, inner = acc}, j < 2 do
                {j + 1, inner + 1}
              end

            {i + 1, inner * 2}
          end

        acc
      else
        x
      end
    end

    defn single_state(x) do
      while x, Nx.sum(x) < 100 do
        x * 2
      end
    end

    defn cond_grad(x) do
      grad(x, fn x -> Nx.sum(if Nx.sum(x) > 0, do: x * x, else: Nx.exp(x)) end)
    end
  end

  defmodule ExBurn.Defn.LoweringTest do
    # Each op lowered into the native program: the jitted result must equal Nx.BinaryBackend's
    # and the graph must have run natively (no fallback to the Evaluator, whole or per node).
    use ExUnit.Case, async: false

    @moduletag :nx
    @moduletag :capture_log

    alias ExBurn.Defn.Compiler

    setup {ExBurn.NxCompare, :binary_default}

    defp native(fun, inputs, atol \\ 1.0e-5) do
      Compiler.reset_stats()
      burn = Enum.map(inputs, &Nx.backend_copy(&1, ExBurn.Backend))
      got = apply(Nx.Defn.jit(fun, compiler: Compiler), burn)
      stats = Compiler.stats()
      assert {stats[:fallback], stats[:hosted]} == {nil, nil}, "fell back: #{inspect(stats)}"
      assert stats[:native_runs] == 1
      # the reference is traced too (the Evaluator on BinaryBackend), so both sides see the same
      # defn types and grad may close over its inputs
      want = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), inputs)
      ExBurn.NxCompare.assert_same(got, want, atol: atol)
    end

    defp iota(shape, type \\ :f32), do: Nx.iota(shape, type: type)

    test "conv: 1d/2d/3d, strides, padding, dilations, groups, permutations" do
      x = Nx.divide(iota({2, 4, 6, 5}), 10)
      k = Nx.subtract(Nx.divide(iota({6, 2, 3, 2}), 7), 1)
      native(&Nx.conv(&1, &2, strides: [2, 1], padding: :same, feature_group_size: 2), [x, k])

      native(&Nx.conv(&1, &2, padding: [{1, 0}, {-1, 2}], input_dilation: [1, 2], kernel_dilation: [2, 1]), [
        x,
        Nx.divide(iota({3, 4, 2, 2}), 5)
      ])

      native(&Nx.conv(&1, &2), [iota({1, 2, 7}), iota({3, 2, 2})])

      native(&Nx.conv(&1, &2, input_permutation: [0, 3, 1, 2], output_permutation: [0, 3, 1, 2]), [
        Nx.divide(iota({1, 5, 5, 2}), 9),
        iota({3, 2, 2, 2})
      ])

      native(&Nx.conv(&1, &2), [iota({1, 1, 3, 3, 3}), iota({1, 1, 2, 2, 2})])
      # integer operands convert to the float output
      native(&Nx.conv(&1, &2), [iota({1, 1, 4, 4}, :s32), iota({1, 1, 2, 2}, :s32)])
    end

    test "window reductions and window scatters" do
      x = Nx.subtract(Nx.divide(iota({2, 5, 6}), 11), 2)
      opts = [strides: [1, 2, 1], padding: [{0, 0}, {1, 1}, {0, 2}]]
      native(&Nx.window_sum(&1, {1, 3, 2}, opts), [x])
      native(&Nx.window_max(&1, {2, 2, 3}, padding: :same), [x])
      native(&Nx.window_min(&1, {1, 2, 2}, window_dilations: [1, 2, 1]), [x])
      native(&Nx.window_product(&1, {1, 2, 2}, strides: [1, 2, 2]), [Nx.divide(x, 2)])
      native(&Nx.window_max(&1, {2, 2}), [iota({4, 4}, :s32)])

      t = Nx.tensor([[7, 2, 5, 3], [10, 1, 4, 6], [2, 8, 9, 0]], type: :f32)
      source = Nx.tensor([[1.0, 2.0], [3.0, 4.0]])

      native(&Nx.window_scatter_max(&1, &2, 0.0, {2, 2}, strides: [1, 2], padding: [{0, 0}, {0, 0}]), [
        t,
        source
      ])

      native(&Nx.window_scatter_min(&1, &2, 0.0, {2, 2}, strides: [1, 2]), [t, source])
    end

    test "the gradient of max pooling runs natively" do
      pool_loss = fn x -> Nx.Defn.grad(x, &Nx.sum(Nx.window_max(&1, {1, 2, 2}, strides: [1, 2, 2]))) end
      native(pool_loss, [Nx.divide(iota({1, 4, 4}), 3) |> Nx.sin()])
    end

    test "pad: edges, negative edges, interior padding, type casts" do
      x = iota({2, 3})
      native(&Nx.pad(&1, 0.5, [{1, 2, 0}, {0, 1, 0}]), [x])
      native(&Nx.pad(&1, -1.0, [{-1, 1, 1}, {2, -2, 2}]), [x])
      native(&Nx.pad(&1, &2, [{0, 0, 1}, {1, 0, 0}]), [iota({2, 2}, :s32), Nx.tensor(9, type: :s32)])
      native(&Nx.pad(&1, 7, [{1, 1, 0}]), [iota({3}, :u8)])
      native(&Nx.pad(&1, &2, [{1, -1, 1}]), [iota({3}, :s64), Nx.tensor(5, type: :s16)])
    end

    test "gather, indexed_add, indexed_put" do
      m = Nx.divide(iota({3, 4}), 2)
      native(&Nx.gather(&1, &2), [m, Nx.tensor([[1, 2], [0, 0], [2, 3]])])
      native(&Nx.gather(&1, &2, axes: [1]), [iota({3, 4}, :s32), Nx.tensor([[3], [0]])])
      native(&Nx.gather(&1, &2, axes: [0, 2]), [iota({2, 3, 4}), Nx.tensor([[[1, 1], [0, 3]]])])

      native(&Nx.indexed_add(&1, &2, &3), [m, Nx.tensor([[0, 1], [0, 1], [1, 2]]), Nx.tensor([1.0, 2.0, 3.0])])

      native(&Nx.indexed_put(&1, &2, &3, axes: [1]), [
        iota({2, 3}, :s32),
        Nx.tensor([[2], [0]]),
        Nx.tensor([[7, 8], [9, 10]])
      ])

      native(&Nx.indexed_add(&1, &2, &3, axes: [1]), [
        iota({2, 3, 2}),
        Nx.tensor([[2], [0]]),
        Nx.broadcast(1.0, {2, 2, 2})
      ])

      # Nx.take and the embedding-style gradient go through gather/indexed_add
      native(fn w, i -> Nx.Defn.grad(w, &Nx.sum(Nx.multiply(Nx.take(&1, i), 2))) end, [
        m,
        Nx.tensor([2, 0, 2])
      ])
    end

    test "out-of-range gather coordinates raise Nx's ArgumentError, jitted and op by op alike" do
      t = Nx.backend_copy(iota({2, 2}), ExBurn.Backend)
      message = "index 3 is out of bounds for axis 1 in shape {2, 2}"

      for gather <- [Nx.Defn.jit(&Nx.gather/2, compiler: Compiler), &Nx.gather/2] do
        assert_raise ArgumentError, message, fn -> gather.(t, Nx.tensor([[0, 3]])) end
      end

      indexed_add = &Nx.indexed_add(&1, Nx.tensor([[0, -1]]), Nx.tensor([1]))

      for fun <- [Nx.Defn.jit(indexed_add, compiler: Compiler), indexed_add] do
        assert_raise ArgumentError, "index -1 is out of bounds for axis 1 in shape {2, 2}", fn -> fun.(t) end
      end
    end

    test "sort and argsort" do
      x = Nx.tensor([[3.0, -1.0, 2.5, 2.5], [0.0, 9.0, -4.0, 1.0]])
      native(&Nx.sort(&1), [x])
      native(&Nx.sort(&1, axis: 0, direction: :desc), [x])
      native(&Nx.argsort(&1, direction: :desc), [x])
      native(&Nx.argsort(&1, axis: 0, type: :s32), [x])
      native(&Nx.sort(&1), [Nx.tensor([5, 1, 4], type: :u8)])
    end

    test "float argmax and argmin, NaN ranked like Nx" do
      x = Nx.tensor([[1.0, 3.0, 3.0], [2.0, :nan, 0.0], [-1.0, -1.0, :nan]])
      plain = Nx.tensor([[1.0, 3.0, 3.0], [2.0, 5.0, 0.0], [-1.0, -1.0, 4.0]])

      # Over the whole tensor BinaryBackend returns the last NaN's index, along an axis the
      # first; ExBurn.Backend (and so the program) returns the first NaN's: only axis cases
      # compare NaN here.
      for op <- [&Nx.argmax/2, &Nx.argmin/2] do
        native(&op.(&1, []), [plain])
        native(&op.(&1, tie_break: :high), [plain])

        for opts <- [[axis: 1], [axis: 0, keep_axis: true], [axis: 1, tie_break: :high]] do
          native(&op.(&1, opts), [x])
          native(&op.(&1, opts), [plain])
        end
      end
    end

    test "dynamic slice and put_slice, starts clamped like Nx" do
      x = iota({4, 5})

      for i <- [0, 2, 7, -3] do
        native(&Nx.slice(&1, [&2, 1], [2, 3]), [x, Nx.tensor(i)])
        native(&Nx.slice(&1, [1, &2], [3, 2], strides: [2, 1]), [x, Nx.tensor(i, type: :u8) |> Nx.abs()])
        native(&Nx.put_slice(&1, [&2, 2], &3), [x, Nx.tensor(i), Nx.negate(iota({2, 2}))])
      end

      native(&Nx.put_slice(&1, [1, 1], &2), [iota({3, 3}, :s32), Nx.tensor([[1.5, 2.5]])])
      native(fn x, i -> Nx.Defn.grad(x, &Nx.sum(Nx.exp(Nx.slice(&1, [i, 0], [2, 5])))) end, [x, Nx.tensor(1)])
    end

    test "cond runs the chosen branch natively" do
      alias ExBurn.Defn.LoweringFuns, as: F
      x = Nx.tensor([[1.0, -2.0], [0.5, 3.0]])
      native(&F.branch/1, [x])
      native(&F.branch/1, [Nx.negate(x)])

      for k <- [0, 1, 5], do: native(&F.multi/2, [x, Nx.tensor(k)])
      for k <- [0, 1, 2], do: native(&F.nested/2, [x, Nx.tensor(k)])
      native(&F.cond_grad/1, [x])
      native(&F.cond_grad/1, [Nx.negate(x)])
      native(&F.safe_divide/2, [Nx.tensor([7, 9]), Nx.tensor(2)])
      native(&F.safe_divide/2, [Nx.tensor([7, 9]), Nx.tensor(0)])
    end

    test "while loops run natively" do
      alias ExBurn.Defn.LoweringFuns, as: F
      x = Nx.tensor([1.5, -2.0, 0.5])
      for n <- [0, 1, 4], do: native(&F.power_loop/2, [x, Nx.tensor(n)])
      for v <- [1, 6, 27], do: native(&F.collatz_steps/1, [Nx.tensor(v)])
      native(&F.nested_loops/1, [x])
      native(&F.nested_loops/1, [Nx.negate(x)])
      native(&F.single_state/1, [Nx.tensor([1, 2, 3])])
    end

    test "shifts, and negative shift amounts raise" do
      x = Nx.tensor([1, -8, 255, 3], type: :s32)
      native(&Nx.left_shift(&1, &2), [x, Nx.tensor([0, 1, 2, 3], type: :s32)])
      native(&Nx.right_shift(&1, &2), [x, Nx.tensor([1, 2, 3, 0], type: :s32)])
      native(&Nx.right_shift(&1, 2), [Nx.tensor([200, 7], type: :u8)])
      jitted = Nx.Defn.jit(&Nx.left_shift/2, compiler: Compiler)
      burn = Nx.backend_copy(x, ExBurn.Backend)

      for shift <- [jitted, &Nx.left_shift/2] do
        assert_raise ArgumentError, "cannot left shift by -1", fn ->
          shift.(burn, Nx.tensor([0, -1, 0, 0], type: :s32))
        end
      end
    end
  end
end
