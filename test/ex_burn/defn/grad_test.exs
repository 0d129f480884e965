# Compiled only where Nx is present (defn expands at compile time); the :nx tag keeps it out of
# runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.GradFuns do
    @moduledoc false
    # Each function takes a tensor {2, 3} (and for some a second operand) and returns a scalar
    # loss; the tests differentiate them symbolically with Nx.Defn.grad.
    import Nx.Defn

    @k Nx.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])

    defn sin(x), do: Nx.sum(Nx.sin(x))
    defn cos(x), do: Nx.sum(Nx.cos(x) * x)
    defn exp(x), do: Nx.sum(Nx.exp(x / 2))
    defn log(x), do: Nx.sum(Nx.log(Nx.abs(x) + 1))
    defn tanh(x), do: Nx.sum(Nx.tanh(x))
    defn sigmoid(x), do: Nx.sum(Nx.sigmoid(x * 2))
    defn sqrt(x), do: Nx.sum(Nx.sqrt(x * x + 1))
    defn poly(x), do: Nx.sum(x * x + 3 * x - 1)
    defn divide(x), do: Nx.sum(x / (1 + x * x))
    defn pow(x), do: Nx.sum(Nx.pow(x, 3))
    defn abs(x), do: Nx.sum(Nx.abs(x) * 2)
    defn relu(x), do: Nx.sum(Nx.max(x, 0) * x)
    defn min(x), do: Nx.sum(Nx.min(x, 0.5))
    defn leaky(x), do: Nx.sum(Nx.select(x > 0, x, 0.1 * x))
    defn erf(x), do: Nx.sum(Nx.erf(x))
    defn softplus(x), do: Nx.sum(Nx.log1p(Nx.exp(x)))
    defn atan(x), do: Nx.sum(Nx.atan(x))
    defn rsqrt(x), do: Nx.sum(Nx.rsqrt(x * x + 2))
    defn clip(x), do: Nx.sum(Nx.clip(x, -1, 1) * x)
    defn expm1(x), do: Nx.sum(Nx.expm1(x) - x)
    defn mean(x), do: Nx.mean(x * x)
    defn product(x), do: Nx.product(x + 3)
    defn reduce_max(x), do: Nx.reduce_max(x * @k)
    defn sum_axis(x), do: Nx.sum(Nx.pow(Nx.sum(x, axes: [1]), 2))
    defn logsumexp(x), do: Nx.sum(Nx.logsumexp(x, axes: [1]))
    defn variance(x), do: Nx.variance(x)

    defn softmax_xent(x) do
      logits = x - Nx.reduce_max(x, axes: [1], keep_axes: true)
      log_probs = logits - Nx.log(Nx.sum(Nx.exp(logits), axes: [1], keep_axes: true))
      -Nx.mean(Nx.sum(log_probs * Nx.tensor([[0, 1, 0], [0, 0, 1]]), axes: [1]))
    end

    defn dot(x), do: Nx.sum(Nx.dot(x, Nx.transpose(@k)))
    defn dot_chain(x), do: Nx.sum(Nx.tanh(Nx.dot(Nx.transpose(x), x)))

    defn batched_dot(x),
      do: Nx.sum(Nx.dot(Nx.reshape(x, {2, 3, 1}), [2], [0], Nx.reshape(x, {2, 1, 3}), [1], [0]))

    defn shapes(x),
      do: Nx.sum(Nx.concatenate([x[[.., 0..1]], Nx.reverse(x)], axis: 1) * Nx.reshape(Nx.iota({10}), {2, 5}))

    defn broadcast(x), do: Nx.sum(Nx.new_axis(x, 0) * Nx.broadcast(Nx.sum(x, axes: [0]), {4, 2, 3}))
    defn pad(x), do: Nx.sum(Nx.pad(x, 0.0, [{1, 0, 0}, {0, 2, 0}]) * Nx.iota({3, 5}))
    defn cumsum(x), do: Nx.sum(Nx.cumulative_sum(x, axis: 1) * x)
    defn stopped(x), do: Nx.sum(x * stop_grad(x * x))

    defn conv1d(x) do
      input = Nx.reshape(x, {1, 2, 3})
      kernel = Nx.reshape(@k, {3, 2, 1})
      Nx.sum(Nx.pow(Nx.conv(input, kernel), 2))
    end

    defn conv2d(x) do
      input = Nx.reshape(x, {1, 1, 2, 3})
      kernel = Nx.tensor([[[[1.0, -0.5], [0.25, 2.0]]]])
      Nx.sum(Nx.tanh(Nx.conv(input, kernel, padding: :same)))
    end

    defn while_power(x) do
      {_i, acc, _x} =
        while {i = 0, acc = x, x}, i < 3 do
          {i + 1, acc * Nx.sin(x) + 0.5, x}
        end

      Nx.sum(acc)
    end

    defn while_decay(x) do
      {_i, y} =
        while {i = 0, y = x}, i < 4 do
          {i + 1, y * 0.9 + Nx.tanh(y)}
        end

      Nx.sum(y * y)
    end

    defn cond_sign(x) do
      s = Nx.sum(x)

      y =
        if s > 0 do
          x * x
        else
          Nx.exp(x)
        end

      Nx.sum(y)
    end

    defn cond_branches(x) do
      y =
        cond do
          Nx.reduce_max(x) > 10 -> Nx.sin(x)
          Nx.reduce_min(x) < 0 -> Nx.cos(x) * x
          true -> x
        end

      Nx.sum(y)
    end

    # two-argument losses: gradient with respect to both operands
    defn mlp({w1, b1, w2}, x) do
      h = Nx.max(Nx.dot(x, w1) + b1, 0)
      out = Nx.dot(h, w2)
      Nx.mean(out * out)
    end

    defn bilinear({a, b}, x), do: Nx.sum(Nx.dot(x, a) * Nx.dot(x, b))
  end

  defmodule ExBurn.Defn.GradTest do
    # Nx.Defn.grad compiled with ExBurn.Defn.Compiler on ExBurn.Backend must match the
    # Evaluator on Nx.BinaryBackend (floats within a tolerance).
    use ExUnit.Case, async: false

    @moduletag :nx
    @moduletag :capture_log

    alias ExBurn.Defn.GradFuns, as: F

    @x [[0.3, -1.2, 0.8], [1.5, -0.4, 0.1]]

    @unary [
      :sin,
      :cos,
      :exp,
      :log,
      :tanh,
      :sigmoid,
      :sqrt,
      :poly,
      :divide,
      :pow,
      :abs,
      :relu,
      :min,
      :leaky,
      :erf,
      :softplus,
      :atan,
      :rsqrt,
      :clip,
      :expm1,
      :mean,
      :product,
      :reduce_max,
      :sum_axis,
      :logsumexp,
      :variance,
      :softmax_xent,
      :dot,
      :dot_chain,
      :batched_dot,
      :shapes,
      :broadcast,
      :pad,
      :cumsum,
      :stopped,
      :conv1d,
      :conv2d,
      :while_power,
      :while_decay,
      :cond_sign,
      :cond_branches
    ]

    setup {ExBurn.NxCompare, :binary_default}

    defp grad_fun(name), do: fn x -> Nx.Defn.grad(x, &apply(F, name, [&1])) end

    defp both(fun, args) do
      burn = Enum.map(args, &Nx.backend_copy(&1, ExBurn.Backend))
      got = apply(Nx.Defn.jit(fun, compiler: ExBurn.Defn.Compiler), burn)
      want = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
      {got, want}
    end

    defp compare(got, want), do: ExBurn.NxCompare.assert_same(got, want, atol: 1.0e-4, rtol: 1.0e-4)

    test "at least 30 functions are checked" do
      assert length(@unary) + 2 >= 30
    end

    for name <- @unary do
      test "grad of #{name}" do
        x = Nx.tensor(@x)
        {got, want} = both(grad_fun(unquote(name)), [x])
        compare(got, want)
      end
    end

    test "grad of an MLP loss with respect to a tuple of parameters" do
      w1 = Nx.tensor([[0.1, -0.2, 0.3, 0.05], [0.4, 0.1, -0.3, 0.2], [-0.1, 0.25, 0.2, -0.4]])
      b1 = Nx.tensor([0.01, -0.02, 0.03, 0.0])
      w2 = Nx.tensor([[0.5], [-0.3], [0.2], [0.1]])
      x = Nx.tensor(@x)
      fun = fn params, x -> Nx.Defn.grad(params, &F.mlp(&1, x)) end

      burn_params =
        {Nx.backend_copy(w1, ExBurn.Backend), Nx.backend_copy(b1, ExBurn.Backend),
         Nx.backend_copy(w2, ExBurn.Backend)}

      got = Nx.Defn.jit(fun, compiler: ExBurn.Defn.Compiler).(burn_params, Nx.backend_copy(x, ExBurn.Backend))
      want = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).({w1, b1, w2}, x)
      compare(got, want)
    end

    test "grad of a bilinear form with respect to two matrices" do
      a = Nx.tensor([[1.0, 0.5], [-0.5, 0.2], [0.3, 0.3]])
      b = Nx.tensor([[0.2, -1.0], [0.7, 0.1], [0.0, 0.4]])
      x = Nx.tensor(@x)
      fun = fn params, x -> Nx.Defn.grad(params, &F.bilinear(&1, x)) end

      got =
        Nx.Defn.jit(fun, compiler: ExBurn.Defn.Compiler).(
          {Nx.backend_copy(a, ExBurn.Backend), Nx.backend_copy(b, ExBurn.Backend)},
          Nx.backend_copy(x, ExBurn.Backend)
        )

      want = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).({a, b}, x)
      compare(got, want)
    end

    test "value_and_grad of an elementwise loss runs as one native program" do
      ExBurn.Defn.Compiler.reset_stats()
      fun = fn x -> Nx.Defn.value_and_grad(x, &F.softplus/1) end
      {got, want} = both(fun, [Nx.tensor(@x)])
      compare(got, want)
      stats = ExBurn.Defn.Compiler.stats()
      assert stats[:native_runs] == 1 and stats[:fallback_runs] == nil, inspect(stats)
    end
  end
end
