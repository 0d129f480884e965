defmodule ExBurn.Bench.Ops do
  @moduledoc false
  # The :ops suite: common tensor ops through ExBurn.Tensor, per device. The same cases (names,
  # shapes, types) run in priv/bench/reference.py for --compare python.

  alias ExBurn.Bench
  alias ExBurn.Tensor, as: T

  @cases ["add 1M f32", "exp 1M f32", "sum 1M f32", "softmax 256x1024 f32", "dot 512x512 f32"]

  def cases, do: @cases

  def plan(opts) do
    for device <- opts[:devices],
        c <- @cases,
        do: %{label: "#{c} #{ExBurn.Device.format(device)}", case: c, device: device}
  end

  def run(%{case: name, device: device}, opts) do
    fields = %{
      suite: "ops",
      case: name,
      engine: "burn",
      device: ExBurn.Device.format(device),
      implementation: "ExBurn"
    }

    {fun, items} = op(name, device)
    # Read one element back (the op has run, whatever the device queues), then free the result
    # at once, as PyTorch's refcounting does: left to the garbage collector, every call would
    # fault in fresh pages for its output.
    run = fn ->
      r = fun.()
      T.to_binary(r, 1)
      T.deallocate(r)
    end

    {:ok, [Bench.measure(fields, opts[:iterations], items, "elements/s", run)]}
  rescue
    e in ExBurn.Error -> {:skip, Exception.message(e)}
  end

  defp data(shape, device), do: T.iota(shape, :f32, device: device) |> T.multiply(1.0e-6) |> T.sin()

  defp op("add 1M f32", d),
    do: with(x = data({1_000_000}, d), y = data({1_000_000}, d), do: {fn -> T.add(x, y) end, 1_000_000})

  defp op("exp 1M f32", d), do: with(x = data({1_000_000}, d), do: {fn -> T.exp(x) end, 1_000_000})
  defp op("sum 1M f32", d), do: with(x = data({1_000_000}, d), do: {fn -> T.sum(x) end, 1_000_000})

  defp op("softmax 256x1024 f32", d) do
    x = data({256, 1024}, d)

    {fn ->
       e = T.exp(T.subtract(x, T.reduce_max(x, axes: [1], keep_axes: true)))
       T.divide(e, T.sum(e, axes: [1], keep_axes: true))
     end, 256 * 1024}
  end

  defp op("dot 512x512 f32", d),
    do:
      with(a = data({512, 512}, d), b = data({512, 512}, d), do: {fn -> T.dot(a, b) end, 512 * 512 * 512 * 2})
end
