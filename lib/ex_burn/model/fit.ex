defmodule ExBurn.Model.Fit do
  @moduledoc false
  # The epoch loop behind ExBurn.Model.fit/3: one dirty NIF call per epoch, then validation,
  # progress, telemetry and callbacks in the caller's process.

  alias ExBurn.{Error, Model, Native}
  alias ExBurn.Model.{Data, Options}
  import Options, only: [keyword!: 3, fail!: 3, pos_int!: 3, boolean!: 3]

  @opts [:epochs, :batch_size, :shuffle, :validation_data, :callbacks, :lr_schedule] ++
          [:clip_norm, :clip_value, :verbose]

  def run(%Model{} = model, data, opts) do
    op = :fit
    opts = keyword!(op, opts, @opts)
    epochs = pos_int!(op, :epochs, Keyword.get(opts, :epochs, 1))
    batch_size = pos_int!(op, :batch_size, Keyword.get(opts, :batch_size, 32))
    shuffle = boolean!(op, :shuffle, Keyword.get(opts, :shuffle, true))
    verbose = boolean!(op, :verbose, Keyword.get(opts, :verbose, false))
    callbacks = callbacks!(Keyword.get(opts, :callbacks, []))
    schedule = schedule!(Keyword.get(opts, :lr_schedule), epochs)

    {x, y} = Data.pair!(op, data)
    model = with_clipping(model, opts)
    {x, y} = {Data.inputs!(op, x, model), Data.targets!(op, y, model)}

    validation =
      case Keyword.get(opts, :validation_data) do
        nil ->
          nil

        {vx, vy} ->
          {Data.inputs!(op, vx, model), Data.targets!(op, vy, model)}

        other ->
          fail!(op, "invalid value for option :validation_data: expected {inputs, targets}", %{
            option: :validation_data,
            value: other
          })
      end

    nif!(Native.model_cancel(model.ref, false))
    nif!(Native.model_set_schedule(model.ref, schedule))

    loop = %{
      epochs: epochs,
      batch_size: batch_size,
      shuffle: shuffle,
      verbose: verbose,
      callbacks: callbacks,
      x: x,
      y: y,
      validation: validation
    }

    start = System.monotonic_time()

    ExBurn.Model.Telemetry.execute(:start, %{system_time: System.system_time()}, %{
      model: model,
      epochs: epochs
    })

    try do
      {reversed, halted} = epochs(model, loop)
      history = reversed |> mark_halted(halted) |> Enum.reverse()
      done = model.epochs + length(history)
      model = %{Model.refresh(model) | epochs: done, history: history, halted: halted}

      ExBurn.Model.Telemetry.execute(
        :stop,
        %{duration: System.monotonic_time() - start, epochs: length(history)},
        %{model: model, history: history, halted: halted}
      )

      {model, history}
    rescue
      e ->
        ExBurn.Model.Telemetry.execute(:stop, %{duration: System.monotonic_time() - start}, %{
          model: model,
          error: e
        })

        reraise e, __STACKTRACE__
    end
  end

  def run(other, _data, _opts), do: fail!(:fit, "expected a compiled ExBurn.Model", %{got: other})

  # The history is accumulated newest first and reversed once when the fit ends; callbacks,
  # whose contract is the chronological history, get it reversed only when there are any.
  defp epochs(model, loop) do
    Enum.reduce_while(1..loop.epochs, {[], nil}, fn epoch, {reversed, nil} ->
      t0 = System.monotonic_time()

      with {:ok, loss} <- train_epoch(model, loop),
           {:ok, val_loss} <- validate(model, loop.validation, loop.batch_size) do
        entry = %{epoch: epoch, loss: loss, val_loss: val_loss}
        reversed = [entry | reversed]
        duration = System.monotonic_time() - t0
        if loop.verbose, do: IO.puts(progress_line(entry, loop.epochs, duration))

        ExBurn.Model.Telemetry.execute(:epoch, %{loss: loss, val_loss: val_loss, duration: duration}, %{
          model: model,
          epoch: epoch
        })

        case run_callbacks(loop.callbacks, entry, reversed, model, loop.epochs) do
          :cont -> {:cont, {reversed, nil}}
          {:halt, reason} -> {:halt, {reversed, reason}}
        end
      else
        :cancelled -> {:halt, {reversed, :cancelled}}
      end
    end)
  end

  # `Model.cancel/1` makes the epoch NIF stop with a `kind: :cancelled` error; `Model.free/1`
  # cancels too, and a model freed between two epochs answers `kind: :freed`: both end the fit
  # with the epoch in progress discarded.
  defp train_epoch(model, loop) do
    case Native.model_train_epoch(model.ref, loop.x.ref, loop.y.ref, loop.batch_size, loop.shuffle) do
      {:ok, loss} -> {:ok, loss}
      {:error, {_, _, %{kind: kind}}} when kind in [:cancelled, :freed] -> :cancelled
      {:error, {_, reason, details}} -> raise Error, op: :fit, reason: reason, details: details
    end
  end

  defp validate(_model, nil, _bs), do: {:ok, nil}

  defp validate(model, {vx, vy}, bs) do
    case Native.model_evaluate(model.ref, vx.ref, vy.ref, bs) do
      {:ok, loss} ->
        {:ok, loss}

      {:error, {_, _, %{kind: :freed}}} ->
        :cancelled

      {:error, {_, reason, details}} ->
        raise Error, op: :fit, reason: "validation_data: " <> reason, details: details
    end
  end

  # Every callback runs; the first halt request wins.
  defp run_callbacks([], _entry, _reversed, _model, _epochs), do: :cont

  defp run_callbacks(callbacks, entry, reversed, model, epochs) do
    history = Enum.reverse(reversed)
    current = %{model | epochs: model.epochs + entry.epoch, history: history}
    info = Map.merge(entry, %{epochs: epochs, history: history, model: current})

    Enum.reduce(callbacks, :cont, fn callback, acc ->
      case {callback.(info), acc} do
        {:halt, :cont} -> {:halt, :halted}
        {{:halt, reason}, :cont} -> {:halt, reason}
        _ -> acc
      end
    end)
  end

  # On the newest-first history: the newest entry carries the halt reason.
  defp mark_halted(reversed, nil), do: reversed
  defp mark_halted([], _reason), do: []
  defp mark_halted([last | earlier], reason), do: [Map.put(last, :halted, reason) | earlier]

  defp progress_line(%{epoch: epoch, loss: loss, val_loss: val_loss}, epochs, duration) do
    ms = System.convert_time_unit(duration, :native, :millisecond)
    val = if val_loss, do: " - val_loss: #{fmt(val_loss)}", else: ""
    "Epoch #{epoch}/#{epochs} - loss: #{fmt(loss)}#{val} (#{ms} ms)"
  end

  defp fmt(x), do: :erlang.float_to_binary(x * 1.0, decimals: 6)

  defp callbacks!(list) when is_list(list) do
    Enum.map(list, fn
      f when is_function(f, 1) -> f
      other -> Options.bad!(:fit, :callbacks, other, "a list of functions of one argument")
    end)
  end

  defp callbacks!(other), do: Options.bad!(:fit, :callbacks, other, "a list of functions of one argument")

  @schedules "{:step, base, step_epochs, gamma}, {:exponential, base, gamma} or {:cosine, base, min}"

  @doc false
  def schedule!(nil, _epochs), do: nil

  def schedule!({:step, base, step, gamma} = s, _epochs) when is_integer(step) and step > 0,
    do: check_rates(s, [base, gamma], s)

  def schedule!({:exponential, base, gamma} = s, _epochs), do: check_rates(s, [base, gamma], s)

  def schedule!({:cosine, base, min} = s, epochs),
    do: check_rates(s, [base, min], {:cosine, base, min, epochs})

  def schedule!(other, _epochs), do: Options.bad!(:fit, :lr_schedule, other, @schedules)

  defp check_rates(s, [base | rest], nif_schedule) do
    if is_number(base) and base > 0 and Enum.all?(rest, &(is_number(&1) and &1 >= 0)),
      do: nif_schedule,
      else: Options.bad!(:fit, :lr_schedule, s, @schedules <> " with a positive base and non-negative rates")
  end

  # New clipping options are applied to the live native model; Burn keeps the optimizer's moments
  # when norm clipping is added or changed and resets them only when it is removed.
  defp with_clipping(model, opts) do
    changes =
      for key <- [:clip_norm, :clip_value], Keyword.has_key?(opts, key), into: %{} do
        value = Options.number!(:fit, key, opts[key], min: 0, nullable: true)
        if value == 0.0, do: Options.bad!(:fit, key, value, "a number > 0")
        {key, value}
      end

    config = Map.merge(model.config, changes)

    if config == model.config do
      model
    else
      nif!(Native.model_configure(model.ref, Map.take(config, [:clip_norm, :clip_value])))
      %{model | config: config}
    end
  end

  defp nif!({:error, {_, reason, details}}), do: raise(Error, op: :fit, reason: reason, details: details)
  defp nif!(answer), do: Error.unwrap!(answer)
end
