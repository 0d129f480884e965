# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.ConvWindowTest do
    # conv, window reductions, window scatters and interior pad run on ExBurn.Backend and on
    # Nx.BinaryBackend from the same inputs: results must agree (floats within a tolerance) and
    # nothing may fall back.
    use ExUnit.Case, async: false

    @moduletag :nx

    alias ExBurn.Backend.Fallback

    # Deterministic, irregular values (no ties by construction unless asked for).
    defp data(shape, type, seed \\ 1) do
      n = Tuple.product(shape)

      values =
        for i <- 0..(n - 1)//1 do
          v = rem(i * 37 + seed * 11, 23) - 11
          if Nx.Type.float?(Nx.Type.normalize!(type)), do: v / 4, else: v
        end

      {values, shape, type}
    end

    defp on(backend, {values, shape, type}) do
      values |> Nx.tensor(type: type, backend: backend) |> Nx.reshape(shape)
    end

    defp same(fun, inputs, opts \\ []) do
      inputs = Enum.map(inputs, &on(Nx.BinaryBackend, &1))
      ExBurn.NxCompare.same(fun, inputs, [atol: 1.0e-4, rtol: 1.0e-4] ++ opts)
    end

    describe "conv" do
      test "1D: valid, same, explicit asymmetric and negative padding, strides" do
        x = data({2, 3, 9}, :f32)
        k = data({4, 3, 3}, :f32, 2)
        same(&Nx.conv(&1, &2), [x, k])
        same(&Nx.conv(&1, &2, padding: :same), [x, k])
        same(&Nx.conv(&1, &2, padding: [{2, 0}], strides: 2), [x, k])
        same(&Nx.conv(&1, &2, padding: [{-1, 3}], strides: [3]), [x, k])
      end

      test "2D: strides, padding, input and kernel dilation" do
        x = data({2, 2, 7, 6}, :f32)
        k = data({3, 2, 3, 2}, :f32, 3)
        same(&Nx.conv(&1, &2, strides: [2, 1], padding: [{1, 2}, {0, 1}]), [x, k])
        same(&Nx.conv(&1, &2, kernel_dilation: [2, 3]), [x, k])
        same(&Nx.conv(&1, &2, input_dilation: [2, 1], padding: :same), [x, k])

        same(&Nx.conv(&1, &2, input_dilation: 2, kernel_dilation: 2, strides: 3, padding: [{2, 2}, {1, 0}]), [
          x,
          k
        ])
      end

      test "3D with f64 and with padding" do
        x = data({1, 2, 4, 5, 3}, :f64)
        k = data({2, 2, 2, 3, 2}, :f64, 4)
        same(&Nx.conv(&1, &2), [x, k])
        same(&Nx.conv(&1, &2, padding: :same, strides: [1, 2, 1]), [x, k])
      end

      test "feature groups and batch groups" do
        x = data({2, 4, 6}, :f32)
        same(&Nx.conv(&1, &2, feature_group_size: 2), [x, data({6, 2, 3}, :f32, 5)])
        same(&Nx.conv(&1, &2, feature_group_size: 4, padding: :same), [x, data({4, 1, 3}, :f32, 6)])
        same(&Nx.conv(&1, &2, batch_group_size: 2), [x, data({4, 4, 2}, :f32, 7)])

        x2 = data({6, 2, 5, 4}, :f32)

        same(&Nx.conv(&1, &2, batch_group_size: 3, strides: 2, padding: :same), [
          x2,
          data({6, 2, 2, 2}, :f32, 8)
        ])
      end

      test "input, kernel and output permutations (non-involutive)" do
        # channels-last input {batch, h, w, c}, kernel {h, w, in, out}
        x = data({2, 5, 4, 3}, :f32)
        k = data({2, 3, 3, 4}, :f32, 9)

        same(
          &Nx.conv(&1, &2,
            input_permutation: [0, 3, 1, 2],
            kernel_permutation: [3, 2, 0, 1],
            output_permutation: [0, 3, 1, 2],
            padding: :same
          ),
          [x, k]
        )

        # a 3-cycle is its own inverse's opposite: catches an inverted output permutation
        x1 = data({4, 3, 5}, :f32)
        perm = [input_permutation: [1, 2, 0], output_permutation: [2, 0, 1], kernel_permutation: [2, 0, 1]]
        same(&Nx.conv(&1, &2, perm), [x1, data({5, 2, 2}, :f32, 10)])
        perm = [input_permutation: [2, 0, 1], output_permutation: [1, 2, 0], kernel_permutation: [1, 2, 0]]
        same(&Nx.conv(&1, &2, perm), [x1, data({2, 2, 4}, :f32, 11)])
      end

      test "integer and narrow float operands give Nx's float output type" do
        x = data({1, 2, 6}, :s32)
        k = data({2, 2, 3}, :s8, 2)
        same(&Nx.conv(&1, &2, padding: :same), [x, k])
        same(&Nx.conv(&1, &2), [data({1, 2, 6}, :u8), data({3, 2, 2}, :u8)])
        same(&Nx.conv(&1, &2), [data({2, 1, 5, 5}, :f16), data({2, 1, 3, 3}, :f16, 3)], atol: 1.0e-2)
        same(&Nx.conv(&1, &2), [data({2, 1, 5, 5}, :bf16), data({2, 1, 3, 3}, :f32, 3)], atol: 5.0e-2)
      end

      test "vectorized conv (batch groups from vectorization)" do
        x = on(ExBurn.Backend, data({2, 1, 3, 6}, :f32)) |> Nx.vectorize(:v)
        k = on(ExBurn.Backend, data({4, 3, 2}, :f32, 2))
        hx = on(Nx.BinaryBackend, data({2, 1, 3, 6}, :f32)) |> Nx.vectorize(:v)
        hk = on(Nx.BinaryBackend, data({4, 3, 2}, :f32, 2))
        Fallback.reset()
        got = Nx.conv(x, k, padding: :same) |> Nx.devectorize()
        assert Fallback.counts() == %{}

        ExBurn.NxCompare.assert_same(got, Nx.conv(hx, hk, padding: :same) |> Nx.devectorize(),
          atol: 1.0e-4,
          rtol: 1.0e-4
        )
      end
    end

    describe "window reductions" do
      test "sum, product, max and min with strides, padding and dilations" do
        for op <- [:window_sum, :window_product, :window_max, :window_min] do
          f = &apply(Nx, op, [&1 | &2])
          x = data({4, 6}, :f32)
          same(&f.(&1, [{2, 3}]), [x])
          same(&f.(&1, [{2, 2}, [strides: [2, 1], padding: :same]]), [x])
          same(&f.(&1, [{3, 2}, [padding: [{1, 2}, {0, 1}], window_dilations: [1, 2]]]), [x])
          same(&f.(&1, [{1, 3}, [strides: 2, padding: :same, window_dilations: 2]]), [x])
          same(&f.(&1, [{2, 2, 2}, [padding: :same]]), [data({3, 3, 4}, :f64)])
        end
      end

      test "negative padding crops before the windows" do
        same(&Nx.window_sum(&1, {2, 2}, padding: [{-1, 1}, {1, -2}]), [data({4, 6}, :f32)])
        same(&Nx.window_max(&1, {2}, padding: [{-2, 0}], strides: 2), [data({7}, :s32)])
      end

      test "integer types keep BinaryBackend's wrapping and identities" do
        for op <- [:window_sum, :window_product, :window_max, :window_min], type <- [:s32, :u8, :s64, :u64] do
          f = &apply(Nx, op, [&1 | &2])
          x = data({5, 4}, type)

          x =
            if elem(Nx.Type.normalize!(type), 0) == :u,
              do: {Enum.map(elem(x, 0), &abs/1), {5, 4}, type},
              else: x

          same(&f.(&1, [{2, 3}, [padding: :same, strides: [1, 2]]]), [x])
        end
      end

      test "NaN and infinities follow BinaryBackend" do
        x = {[1.0, :nan, 3.0, :infinity, -2.0, :neg_infinity], {6}, :f32}
        # Nx.tensor accepts the atoms; window over them
        for op <- [:window_max, :window_min, :window_sum] do
          same(&apply(Nx, op, [&1, {2}, [padding: [{1, 1}]]]), [x])
        end
      end

      test "narrow float sums" do
        same(&Nx.window_sum(&1, {3}, padding: :same), [data({7}, :f16)], atol: 1.0e-2)
        same(&Nx.window_mean(&1, {2, 2}), [data({3, 3}, :bf16)], atol: 5.0e-2)
      end

      test "vectorized window ops" do
        x = on(ExBurn.Backend, data({2, 5}, :f32)) |> Nx.vectorize(:v)
        h = on(Nx.BinaryBackend, data({2, 5}, :f32)) |> Nx.vectorize(:v)
        Fallback.reset()
        got = Nx.window_max(x, {2}, strides: 2) |> Nx.devectorize()
        assert Fallback.counts() == %{}

        ExBurn.NxCompare.assert_same(got, Nx.window_max(h, {2}, strides: 2) |> Nx.devectorize(),
          atol: 1.0e-6,
          rtol: 1.0e-4
        )
      end
    end

    describe "window scatter" do
      test "max and min with strides, padding and overlapping windows" do
        x = data({4, 6}, :f32)

        for op <- [:window_scatter_max, :window_scatter_min] do
          same(&apply(Nx, op, [&1, &2, 0.0, {2, 3}, [strides: [2, 3]]]), [x, data({2, 2}, :f32, 2)])
          same(&apply(Nx, op, [&1, &2, 1.5, {2, 2}, [strides: 1]]), [x, data({3, 5}, :f32, 3)])
          same(&apply(Nx, op, [&1, &2, 0, {3, 3}, [strides: 2, padding: :same]]), [x, data({2, 3}, :f32, 4)])
        end
      end

      test "ties pick the last extreme; integer tensors and sources" do
        ties = {[1, 3, 3, 0, 2, 2, 2, 5], {8}, :s32}

        for op <- [:window_scatter_max, :window_scatter_min] do
          same(&apply(Nx, op, [&1, &2, 0, {3}, [strides: 1]]), [ties, {[1, 2, 3, 4, 5, 6], {6}, :s32}])

          same(&apply(Nx, op, [&1, &2, 10, {2}, [strides: 2, padding: :valid]]), [
            ties,
            {[1, 2, 3, 4], {4}, :u8}
          ])
        end
      end
    end

    test "counted fallbacks: conv with 4 spatial axes, scatter with negative padding" do
      same(&Nx.conv(&1, &2), [data({1, 1, 3, 3, 3, 3}, :f32), data({1, 1, 2, 2, 2, 2}, :f32)], native: false)
      assert Fallback.counts() == %{conv: 1}

      args = [data({6}, :f32), data({3}, :f32, 2)]
      same(&Nx.window_scatter_max(&1, &2, 0.0, {2}, strides: 2, padding: [{-1, 1}]), args, native: false)
      assert Fallback.counts() == %{window_scatter_max: 1}
    end

    describe "pad with interior padding" do
      test "interior, negative and mixed edges" do
        x = data({3, 4}, :f32)
        same(&Nx.pad(&1, 0.5, [{0, 0, 1}, {1, 1, 2}]), [x])
        same(&Nx.pad(&1, -1.0, [{-1, 2, 1}, {2, -3, 1}]), [x])
        same(&Nx.pad(&1, 7, [{1, 0, 3}]), [data({4}, :s16)])
        same(&Nx.pad(&1, &2, [{0, 1, 2}, {0, 0, 1}]), [data({2, 2}, :u8), {[9], {}, :u8}])
        same(&Nx.pad(&1, 0, [{-2, -2, 5}]), [data({2}, :s32)])
      end
    end
  end
end
