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

# Training: a small classifier on the default device, trained natively by Burn (autodiff + Adam
# inside the NIF, one dirty-scheduler call per epoch).
alias ExBurn.Model

IO.puts("\n-- training on #{inspect(device)} --")

# 600 points around 3 centers in 2-D, made deterministically.
:rand.seed(:exsss, {1, 2, 3})
centers = [[-2.0, 0.0], [2.0, 1.0], [0.0, -2.5]]

{points, labels} =
  for i <- 0..599 do
    label = rem(i, 3)
    [cx, cy] = Enum.at(centers, label)
    {[cx + :rand.normal() * 0.6, cy + :rand.normal() * 0.6], label}
  end
  |> Enum.unzip()

model =
  Model.input({nil, 2})
  |> Model.dense(16, activation: :relu)
  |> Model.dense(3)
  |> Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 0.02, device: device)

IO.puts(Model.summary_string(model))

{us, {model, history}} =
  :timer.tc(fn ->
    Model.fit_with_history(model, {points, labels},
      epochs: 20,
      batch_size: 32,
      validation_data: {points, labels}
    )
  end)

for %{epoch: e, loss: l, val_loss: v} <- history, rem(e, 5) == 0 do
  IO.puts(
    "epoch #{String.pad_leading(to_string(e), 2)}  loss #{Float.round(l, 4)}  val_loss #{Float.round(v, 4)}"
  )
end

predicted = Model.predict(model, points) |> T.argmax(axis: 1) |> T.to_flat_list()
correct = Enum.count(Enum.zip(predicted, labels), fn {p, l} -> p == l end)

IO.puts(
  "trained #{length(history)} epochs in #{div(us, 1000)} ms; training accuracy #{correct}/#{length(labels)}"
)

new_points = [[-2.1, 0.2], [1.8, 1.1], [0.1, -2.4]]

IO.puts(
  "predict #{inspect(new_points)} -> classes #{inspect(Model.predict(model, new_points) |> T.argmax(axis: 1) |> T.to_flat_list())}"
)
