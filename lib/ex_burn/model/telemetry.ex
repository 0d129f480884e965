defmodule ExBurn.Model.Telemetry do
  @moduledoc """
  Telemetry events of `ExBurn.Model.fit/3`, emitted through `:telemetry` when it is loaded (a
  no-op otherwise):

    * `[:ex_burn, :fit, :start]` - measurements `%{system_time: t}`; metadata `%{model: m, epochs: n}`
    * `[:ex_burn, :fit, :epoch]` - measurements `%{loss: l, val_loss: v | nil, duration: native_time}`;
      metadata `%{model: m, epoch: e}`
    * `[:ex_burn, :fit, :stop]` - measurements `%{duration: native_time, epochs: completed}`;
      metadata `%{model: m, history: h, halted: reason | nil}`, or `%{model: m, error: exception}`
      (no `:epochs` measurement) when the fit raised
  """

  @doc false
  def execute(event, measurements, metadata) do
    if Code.ensure_loaded?(:telemetry),
      do: apply(:telemetry, :execute, [[:ex_burn, :fit, event], measurements, metadata])

    :ok
  end
end
