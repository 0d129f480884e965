defmodule ExBurn.Model.Callbacks do
  @moduledoc """
  Ready-made `fit/3` callbacks.

  A callback is a function of one argument, called after every epoch (after validation) with

      %{epoch: e, epochs: total, loss: l, val_loss: v | nil, history: [entry], model: %ExBurn.Model{}}

  Returning `:halt` or `{:halt, reason}` stops the fit after this epoch's callbacks have all run
  (`model.halted` is then the first `reason`, or `:halted`); any other value continues. A callback that raises stops the fit and the exception
  reaches the caller of `fit/3`; the model keeps the last completed epoch.
  """

  require Logger
  alias ExBurn.Model

  @doc "Logs every epoch's loss (and val_loss) with `Logger.info/1`."
  def logging do
    fn %{epoch: epoch, epochs: epochs, loss: loss, val_loss: val_loss} ->
      val = if val_loss, do: " val_loss=#{val_loss}", else: ""
      Logger.info("ExBurn fit epoch #{epoch}/#{epochs}: loss=#{loss}#{val}")
      :cont
    end
  end

  @doc """
  Stops the fit with `{:halt, :early_stopping}` once the monitored value (val_loss when every
  epoch has one, else loss) has not improved by more than `min_delta` on its best for `patience`
  consecutive epochs.
  """
  def early_stopping(patience, min_delta \\ 0.0)

  def early_stopping(patience, min_delta)
      when is_integer(patience) and patience > 0 and is_number(min_delta) and min_delta >= 0 do
    fn %{history: history} ->
      key = if Enum.all?(history, &(&1.val_loss != nil)), do: :val_loss, else: :loss

      {_best, wait} =
        Enum.reduce(history, {nil, 0}, fn entry, {best, wait} ->
          value = Map.fetch!(entry, key)
          if best == nil or value < best - min_delta, do: {value, 0}, else: {best, wait + 1}
        end)

      if wait >= patience, do: {:halt, :early_stopping}, else: :cont
    end
  end

  def early_stopping(patience, min_delta) do
    raise ExBurn.Error,
      op: :early_stopping,
      reason: "expected a positive integer patience and a non-negative min_delta",
      details: %{patience: patience, min_delta: min_delta}
  end

  @doc "Saves the model to `dir/epoch_N.model` every `every` epochs (creating `dir`)."
  def checkpoint(every, dir) when is_integer(every) and every > 0 and is_binary(dir) do
    fn %{epoch: epoch, model: model} ->
      if rem(epoch, every) == 0 do
        File.mkdir_p!(dir)
        Model.save!(model, Path.join(dir, "epoch_#{epoch}.model"))
      end

      :cont
    end
  end

  def checkpoint(every, dir) do
    raise ExBurn.Error,
      op: :checkpoint,
      reason: "expected a positive integer interval and a directory path",
      details: %{every: every, dir: dir}
  end

  @doc "Sends `{:training_progress, epoch, loss, val_loss}` to `pid` after every epoch."
  def screen(pid) when is_pid(pid) or is_atom(pid) do
    fn %{epoch: epoch, loss: loss, val_loss: val_loss} ->
      send(pid, {:training_progress, epoch, loss, val_loss})
      :cont
    end
  end

  def screen(other),
    do:
      raise(ExBurn.Error,
        op: :screen_callback,
        reason: "expected a pid or a registered name",
        details: %{got: other}
      )
end
