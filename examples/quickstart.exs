# ExBurn quickstart: `mix run examples/quickstart.exs` (or `mix quickstart`).
alias ExBurn.Tensor, as: T

device = ExBurn.default_device()

IO.puts(
  "ExBurn on #{inspect(device)}; devices: #{inspect(Enum.map(ExBurn.devices(), &{&1.kind, &1.index, &1.name}))}"
)

a = T.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], type: :f32, device: device)
b = T.tensor([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]], type: :f32, device: device)

show = fn label, t ->
  IO.puts("#{String.pad_trailing(label, 24)} #{inspect(t)} #{inspect(T.to_flat_list(t))}")
end

show.("a", a)
show.("b", b)
show.("a + b", T.add(a, b))
show.("a * 2", T.multiply(a, 2))
show.("a / b", T.divide(a, b))
show.("exp(b)", T.exp(b))
show.("a . transpose(b)", T.dot(a, T.transpose(b)))
show.("sum(a)", T.sum(a))
show.("sum(a, axes: [1])", T.sum(a, axes: [1]))
show.("mean(a, axes: [0])", T.mean(a, axes: [0]))
show.("argmax(b, axis: 1)", T.argmax(b, axis: 1))
show.("a > 2.5", T.greater(a, 2.5))
show.("as_type(b, :s32)", T.as_type(b, :s32))
show.("iota({2, 3}, axis: 1)", T.iota({2, 3}, :s64, axis: 1))
show.("slice(a, [0, 1], [2, 2])", T.slice(a, [0, 1], [2, 2]))

m = T.iota({1024, 1024}, :f32) |> T.divide(1024 * 1024)
{us, c} = :timer.tc(fn -> T.dot(m, m) |> T.sum() end)
IO.puts("1024x1024 f32 matmul + sum: #{Float.round(us / 1000, 1)} ms -> #{inspect(T.to_flat_list(c))}")
