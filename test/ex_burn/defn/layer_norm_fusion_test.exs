# The compiler runs Nx's layer norm compositions as one kernel on the CPU (native compiler/fuse.rs).
# Compiled only where Nx is present; the Axon case only where Axon is.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.LayerNormFusionFuns do
    @moduledoc false
    import Nx.Defn

    # a mean of squares, then c * rsqrt(var + eps)
    defn layer_norm(x) do
      c = x - Nx.mean(x, axes: [-1], keep_axes: true)
      c * Nx.rsqrt(Nx.mean(c * c, axes: [-1], keep_axes: true) + 1.0e-5)
    end

    # Nx.variance (its own mean, pow(c, 2)), and ddof: 1 (another count for the variance)
    defn layer_norm_variance(x) do
      c = x - Nx.mean(x, axes: [-1], keep_axes: true)
      c * Nx.rsqrt(Nx.variance(x, axes: [-1], keep_axes: true, ddof: 1) + 1.0e-3)
    end

    # a part read elsewhere: nothing is fused, the same values come out
    defn layer_norm_and_var(x) do
      c = x - Nx.mean(x, axes: [-1], keep_axes: true)
      var = Nx.mean(c * c, axes: [-1], keep_axes: true)
      {c * Nx.rsqrt(var + 1.0e-5), var}
    end
  end

  defmodule ExBurn.Defn.LayerNormFusionTest do
    use ExUnit.Case, async: true
    @moduletag :nx
    alias ExBurn.Defn.LayerNormFusionFuns, as: F

    # rows: ordinary values, a constant row (0 out), one NaN (NaN out), one +inf (NaN out)
    defp input do
      ordinary = for i <- 0..39, do: :math.sin(i * 0.37) * 30 + 5

      rows = [
        ordinary,
        List.duplicate(2.5, 40),
        [:nan | tl(ordinary)],
        [:infinity | tl(ordinary)]
      ]

      Nx.tensor(rows, type: :f32, backend: Nx.BinaryBackend)
    end

    defp bits(t), do: t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.to_binary()

    # the largest distance in ulps between two f32 tensors' values, a NaN only equal to a NaN
    defp ulps_apart(a, b) do
      ordered = fn t ->
        for <<u::32-native <- bits(t)>> do
          cond do
            Bitwise.band(u, 0x7FFFFFFF) > 0x7F800000 -> :nan
            u >= 0x80000000 -> 0x80000000 - u
            true -> u
          end
        end
      end

      Enum.zip(ordered.(a), ordered.(b))
      |> Enum.map(fn
        {:nan, :nan} -> 0
        {x, y} when is_integer(x) and is_integer(y) -> abs(x - y)
        _ -> :infinity
      end)
      |> Enum.max()
    end

    defp jit_vs_eager(fun, args) do
      args = Enum.map(args, &Nx.backend_transfer(&1, ExBurn.Backend))
      jit = apply(Nx.Defn.jit(fun, compiler: ExBurn), args)
      eager = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
      {jit, eager}
    end

    test "a compiled layer norm gives the op-by-op backend's bits and BinaryBackend's values" do
      x = input()

      for fun <- [&F.layer_norm/1, &F.layer_norm_variance/1] do
        {jit, eager} = jit_vs_eager(fun, [x])
        assert bits(jit) == bits(eager)
        assert Nx.type(jit) == {:f, 32} and Nx.shape(jit) == {4, 40}
        reference = fun.(x)

        close =
          Nx.all_close(Nx.backend_copy(jit[0], Nx.BinaryBackend), reference[0], rtol: 1.0e-5, atol: 1.0e-5)

        assert Nx.to_number(close) == 1
        assert jit[1] |> Nx.equal(0) |> Nx.all() |> Nx.to_number() == 1
        for r <- [2, 3], do: assert(jit[r] |> Nx.is_nan() |> Nx.all() |> Nx.to_number() == 1)
      end
    end

    test "a layer norm whose variance is also an output is left composed, with the same values" do
      x = input()
      {{out, var}, {out_eager, var_eager}} = jit_vs_eager(&F.layer_norm_and_var/1, [x])
      assert bits(out) == bits(out_eager)
      assert bits(var) == bits(var_eager)
      {fused, _} = jit_vs_eager(&F.layer_norm/1, [x])
      assert bits(out) == bits(fused)
    end

    if Code.ensure_loaded?(Axon) do
      @tag :axon
      test "Axon's layer norm (scale and shift) through the compiler gives the op-by-op bits" do
        x = input()
        gamma = Nx.iota({40}, type: :f32, backend: Nx.BinaryBackend) |> Nx.multiply(0.05) |> Nx.add(0.5)
        beta = Nx.iota({40}, type: :f32, backend: Nx.BinaryBackend) |> Nx.multiply(-0.01)
        {jit, eager} = jit_vs_eager(&Axon.Layers.layer_norm/3, [x, gamma, beta])
        # one fused kernel on the CPU; a GPU's compiled program and its op-by-op calls fuse
        # differently, and may round a few values an ulp or two apart
        if ExBurn.default_device() == {:cpu, 0},
          do: assert(bits(jit) == bits(eager)),
          else: assert(ulps_apart(jit, eager) <= 2)

        # the constant row: (gamma * r) * 0 + beta
        assert jit[1] |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.equal(beta) |> Nx.all() |> Nx.to_number() ==
                 1
      end
    end
  end
end
