defmodule Dala.ML.Burn.Training do
  @moduledoc """
  Training callbacks and history for `Dala.ML.Burn.fit/3` (see `ExBurn.Model.Callbacks` for the
  callback contract).
  """

  alias ExBurn.Model.Callbacks

  @doc "Logs each epoch's loss and val_loss with Logger (info)."
  defdelegate logging_callback, to: Callbacks, as: :logging

  @doc """
  Stops training when the monitored loss (val_loss if present, else loss) has not improved by
  more than `min_delta` for `patience` epochs.
  """
  defdelegate early_stopping_callback(patience, min_delta \\ 0.0), to: Callbacks, as: :early_stopping

  @doc "Saves `dir/epoch_N.model` every `every_n_epochs` epochs."
  defdelegate checkpoint_callback(every_n_epochs, dir), to: Callbacks, as: :checkpoint

  @doc "Sends `{:training_progress, epoch, loss, val_loss}` to `pid` after every epoch."
  defdelegate screen_callback(pid), to: Callbacks, as: :screen

  @doc "Trains like `Dala.ML.Burn.fit/3` and returns `{model, history}`."
  defdelegate fit_with_progress(model, data, opts \\ []), to: ExBurn.Model, as: :fit_with_history
end
