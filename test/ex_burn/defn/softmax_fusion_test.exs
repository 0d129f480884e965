# The compiler runs Nx's softmax compositions as one kernel on the CPU (native compiler/fuse.rs).
# Compiled only where Nx is present; the Axon case only where Axon is.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.SoftmaxFusionFuns do
    @moduledoc false
    import Nx.Defn

    # the textbook form: e / sum(e)
    defn softmax_divide(x) do
      e = Nx.exp(x - stop_grad(Nx.reduce_max(x, axes: [-1], keep_axes: true)))
      e / Nx.sum(e, axes: [-1], keep_axes: true)
    end

    # a part read elsewhere: nothing is fused, the same values come out
    defn softmax_and_exp(x) do
      e = Nx.exp(x - Nx.reduce_max(x, axes: [-1], keep_axes: true))
      {e / Nx.sum(e, axes: [-1], keep_axes: true), e}
    end
  end

  defmodule ExBurn.Defn.SoftmaxFusionTest do
    use ExUnit.Case, async: true
    @moduletag :nx
    alias ExBurn.Defn.SoftmaxFusionFuns, as: F

    # rows: ordinary values, -inf everywhere (NaN out), one +inf (NaN out), ±0 and huge values
    defp input do
      ordinary = for i <- 0..39, do: :math.sin(i * 0.37) * 30

      rows = [
        ordinary,
        List.duplicate(:neg_infinity, 40),
        [:infinity | tl(ordinary)],
        [-0.0, 0.0, 3.0e38, -3.0e38 | Enum.drop(ordinary, 4)]
      ]

      Nx.tensor(rows, type: :f32, backend: Nx.BinaryBackend)
    end

    defp bits(t), do: t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.to_binary()

    defp jit_vs_eager(fun, x) do
      jit = Nx.Defn.jit(fun, compiler: ExBurn).(Nx.backend_transfer(x, ExBurn.Backend))
      eager = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(Nx.backend_transfer(x, ExBurn.Backend))
      {jit, eager}
    end

    test "a compiled softmax gives the op-by-op backend's bits and BinaryBackend's values" do
      x = input()
      {jit, eager} = jit_vs_eager(&F.softmax_divide/1, x)
      assert bits(jit) == bits(eager)
      assert Nx.type(jit) == {:f, 32} and Nx.shape(jit) == {4, 40}

      reference = F.softmax_divide(x)
      ok_rows = jit |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.take(Nx.tensor([0, 3]))

      assert Nx.all_close(ok_rows, Nx.take(reference, Nx.tensor([0, 3])), rtol: 1.0e-6, atol: 1.0e-30)
             |> Nx.to_number() == 1

      # -inf - -inf and inf - inf are NaN, in both
      for r <- [1, 2], do: assert(jit[r] |> Nx.is_nan() |> Nx.all() |> Nx.to_number() == 1)
      assert jit[0] |> Nx.sum() |> Nx.to_number() |> Kernel.-(1.0) |> abs() < 1.0e-6
    end

    test "a softmax whose exp is also an output is left composed, with the same values" do
      x = input()
      {{soft, e}, {soft_eager, e_eager}} = jit_vs_eager(&F.softmax_and_exp/1, x)
      assert bits(soft) == bits(soft_eager)
      assert bits(e) == bits(e_eager)
      {fused, _} = jit_vs_eager(&F.softmax_divide/1, x)
      assert bits(soft) == bits(fused)
    end

    if Code.ensure_loaded?(Axon) do
      @tag :axon
      test "Axon's softmax (multiply by 1 / sum) through the compiler gives the op-by-op bits" do
        x = input()
        {jit, eager} = jit_vs_eager(&Axon.Activations.softmax/1, x)
        assert bits(jit) == bits(eager)
        {log_jit, log_eager} = jit_vs_eager(&Axon.Activations.log_softmax/1, x)
        assert bits(log_jit) == bits(log_eager)
      end
    end
  end
end
