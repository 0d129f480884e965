defmodule ExBurn.Bench.Train do
  @moduledoc false
  # The :train suite: one ExBurn.Model.fit epoch of a 784-256-128-10 MLP (batch 128) per device.

  alias ExBurn.{Bench, Model}

  @samples 2048

  def plan(opts),
    do:
      for(device <- opts[:devices], do: %{label: "mlp epoch #{ExBurn.Device.format(device)}", device: device})

  def run(%{device: device}, opts) do
    :rand.seed(:exsss, {1, 2, 3})
    x = for _ <- 1..@samples, do: for(_ <- 1..784, do: :rand.uniform())
    y = for i <- 1..@samples, do: rem(i, 10)

    model =
      Model.input({nil, 784})
      |> Model.dense(256, activation: :relu)
      |> Model.dense(128, activation: :relu)
      |> Model.dense(10)
      |> Model.compile(loss: :cross_entropy, optimizer: :adam, seed: 1, device: device)

    fields = %{
      suite: "train",
      case: "mlp 784-256-128-10 epoch",
      engine: "burn",
      device: ExBurn.Device.format(device),
      implementation: "ExBurn"
    }

    {:ok,
     [
       Bench.measure(fields, max(div(opts[:iterations], 3), 2), @samples, "samples/s", fn ->
         Model.fit(model, {x, y}, epochs: 1, batch_size: 128)
       end)
     ]}
  rescue
    e in ExBurn.Error -> {:skip, Exception.message(e)}
  end
end
