# An MLP training step (forward, Nx.Defn.grad, SGD update) on ExBurn.Backend tensors, run
# three ways in the same VM:
#
#   * ExBurn.Defn.Compiler            - one cached native program per step (one NIF call)
#   * Nx.Defn.Evaluator, jit          - what `Nx.Defn.jit` does by default: trace + evaluate
#                                       node by node on ExBurn.Backend every call
#   * Nx.Defn.Evaluator, compile once - `Nx.Defn.compile`: traced once, evaluated node by node
#
#   mix run bench/defn_mlp.exs [batch] [hidden] [steps]
#
# Needs Nx (see guides/compiler.md).
unless Code.ensure_loaded?(Nx) do
  IO.puts("bench/defn_mlp.exs needs Nx: skipped")
  System.halt(0)
end

defmodule DefnMlpBench do
  import Nx.Defn

  defn loss({w1, b1, w2, b2}, x, y) do
    h = Nx.max(Nx.dot(x, w1) + b1, 0)
    logits = Nx.dot(h, w2) + b2
    shifted = logits - stop_grad(Nx.reduce_max(logits, axes: [1], keep_axes: true))
    log_probs = shifted - Nx.log(Nx.sum(Nx.exp(shifted), axes: [1], keep_axes: true))
    -Nx.mean(Nx.sum(log_probs * y, axes: [1]))
  end

  defn step(params, x, y) do
    {loss, grads} = value_and_grad(params, &loss(&1, x, y))
    {w1, b1, w2, b2} = params
    {g1, gb1, g2, gb2} = grads
    lr = 0.1
    {{w1 - lr * g1, b1 - lr * gb1, w2 - lr * g2, b2 - lr * gb2}, loss}
  end

  def time(fun, params, x, y, steps) do
    # warm-up: compile/cache and first-touch allocations
    {params, _} = fun.(params, x, y)

    {us, {params, loss}} =
      :timer.tc(fn ->
        Enum.reduce(1..steps, {params, nil}, fn _, {p, _} -> fun.(p, x, y) end)
      end)

    {us / steps, Nx.to_number(loss), params}
  end
end

{batch, hidden, steps} =
  case System.argv() do
    [b, h, s] -> {String.to_integer(b), String.to_integer(h), String.to_integer(s)}
    _ -> {32, 64, 200}
  end

{features, classes} = {16, 10}
Nx.default_backend(ExBurn.Backend)
key = Nx.Random.key(7)
{x, key} = Nx.Random.normal(key, shape: {batch, features}, type: :f32)
{w1, key} = Nx.Random.normal(key, 0.0, 0.3, shape: {features, hidden}, type: :f32)
{w2, _key} = Nx.Random.normal(key, 0.0, 0.3, shape: {hidden, classes}, type: :f32)
labels = Nx.remainder(Nx.iota({batch}), classes)
y = Nx.equal(Nx.new_axis(labels, 1), Nx.iota({1, classes})) |> Nx.as_type(:f32)
params = {w1, Nx.broadcast(0.0, {hidden}), w2, Nx.broadcast(0.0, {classes})}

compiled = Nx.Defn.jit(&DefnMlpBench.step/3, compiler: ExBurn.Defn.Compiler)
evaluator = Nx.Defn.jit(&DefnMlpBench.step/3, compiler: Nx.Defn.Evaluator)
once = Nx.Defn.compile(&DefnMlpBench.step/3, [params, x, y], compiler: Nx.Defn.Evaluator)

ExBurn.Defn.Compiler.reset_stats()
{c_us, c_loss, _} = DefnMlpBench.time(compiled, params, x, y, steps)
{e_us, e_loss, _} = DefnMlpBench.time(evaluator, params, x, y, steps)
{o_us, o_loss, _} = DefnMlpBench.time(once, params, x, y, steps)
stats = ExBurn.Defn.Compiler.stats()

IO.puts(
  "MLP step #{features}->#{hidden}->#{classes}, batch #{batch}, #{steps} steps, device #{inspect(ExBurn.default_device())}"
)

IO.puts(
  "  ExBurn.Defn.Compiler           #{Float.round(c_us, 1)} us/step  (final loss #{Float.round(c_loss, 5)})"
)

IO.puts(
  "  Evaluator, jit each call       #{Float.round(e_us, 1)} us/step  (final loss #{Float.round(e_loss, 5)})"
)

IO.puts(
  "  Evaluator, compiled once       #{Float.round(o_us, 1)} us/step  (final loss #{Float.round(o_loss, 5)})"
)

IO.puts("  speed-up vs Evaluator jit:      #{Float.round(e_us / c_us, 2)}x")
IO.puts("  speed-up vs Evaluator compiled: #{Float.round(o_us / c_us, 2)}x")
IO.puts("  compiler stats: #{inspect(stats)}")
