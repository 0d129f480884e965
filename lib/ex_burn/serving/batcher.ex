defmodule ExBurn.Serving.Batcher do
  @moduledoc """
  A batching inference server that needs no Nx: requests for one sample each are stacked into a
  batch for an `ExBurn.Model` or a function `fn batch_tensor -> output_tensor end`, and the
  output rows are sent back to their callers. For an `ExBurn.Embedding` model each request is a
  text, the batch is one padded model call, and each caller gets its vector (a list of floats).

      {:ok, _pid} = ExBurn.Serving.Batcher.start_link(model, name: MyModel, batch_size: 32, batch_timeout: 5)
      {:ok, row} = ExBurn.Serving.Batcher.run(MyModel, [0.5, 1.0])

  In a supervision tree: `{ExBurn.Serving.Batcher, model: model, name: MyModel, batch_size: 32}`.

  ## Options

    * `:name` - registers the server (any `GenServer` name)
    * `:batch_size` - the most samples in one batch (default 32)
    * `:batch_timeout` - ms the oldest queued request waits for the batch to fill (default 10)
    * `:max_queue` - the most queued (not yet running) requests; more are refused at once with
      an `ExBurn.Error` whose `details.cause` is `:overloaded` (default 1024, or `:infinity`)

  ## Semantics

  A batch runs when `batch_size` requests are queued or the oldest one has waited
  `batch_timeout` ms. It runs in a separate process, so the server keeps queuing while the model
  works (model calls themselves run on dirty schedulers); one batch runs at a time.

  A caller that dies while queued is dropped from the queue, and one whose `run/3` timed out is
  skipped; a caller that dies while its batch runs simply gets no reply. When a batch fails, its
  requests are run one by one so only those that fail on their own get
  `{:error, %ExBurn.Error{}}`.

  ## Telemetry

  When `:telemetry` is loaded, each batch emits `[:ex_burn, :serving, :batch]` with measurements
  `%{batch_size: n, queue_time: t, execution_time: t}` (native time units; `queue_time` is the
  oldest request's wait) and metadata `%{server: pid, errors: failed_requests, fallback: boolean}`
  (`fallback` is true when the batch failed and its requests were run one by one).
  """

  use GenServer

  alias ExBurn.{Error, Model, Tensor}
  alias ExBurn.Serving.Batch

  @options [:name, :batch_size, :batch_timeout, :max_queue]

  defstruct [:target, :batch_size, :batch_timeout, :max_queue, :timer, :task, queue: :queue.new(), queued: 0]

  ## Client

  @doc "Starts a server for `model_or_fun` (see the module doc for the options)."
  def start_link(model_or_fun, opts) do
    opts = Keyword.new(opts)
    config = config!(model_or_fun, opts)
    gen_opts = if name = opts[:name], do: [name: name], else: []
    GenServer.start_link(__MODULE__, config, gen_opts)
  end

  @doc """
  `start_link(opts)` takes the target under `:model` (for child specs); `start_link(model_or_fun)`
  uses the default options.
  """
  def start_link(opts) when is_list(opts) do
    {target, opts} = Keyword.pop(opts, :model)
    start_link(target, opts)
  end

  def start_link(model_or_fun), do: start_link(model_or_fun, [])

  @doc """
  A child spec: `{ExBurn.Serving.Batcher, model: model_or_fun, name: name, batch_size: ...}`.
  The id is the name (or the module), so several servers can share a supervisor.
  """
  def child_spec(opts) when is_list(opts) do
    %{id: Keyword.get(opts, :name, __MODULE__), start: {__MODULE__, :start_link, [opts]}}
  end

  @doc """
  Runs one sample through the server and returns `{:ok, row}` (the output row for this sample,
  an `ExBurn.Tensor` without the batch axis) or `{:error, %ExBurn.Error{}}`.

  `input` is an `ExBurn.Tensor`, a number or nested list, `{binary, type, shape}`, or an Nx
  tensor when Nx is loaded, shaped like one sample (no batch axis). It is converted in the
  calling process. `details.cause` tells the server-side failures apart: `:overloaded`,
  `:timeout`, `:down` (no server, or it stopped before answering).
  """
  def run(server, input, timeout \\ 5_000) do
    sample = sample!(input)
    deadline = if is_integer(timeout), do: now_ms() + timeout, else: :infinity

    GenServer.call(server, {:run, sample, deadline}, timeout)
  rescue
    e in Error -> {:error, e}
  catch
    :exit, {:timeout, _} ->
      {:error,
       %Error{
         op: :serving,
         reason: "no reply within #{timeout} ms",
         details: %{cause: :timeout, timeout: timeout}
       }}

    :exit, {reason, _} ->
      {:error,
       %Error{
         op: :serving,
         reason: "the serving process is not running",
         details: %{cause: :down, exit: reason}
       }}
  end

  @doc "Like `run/3`, but returns the row or raises `ExBurn.Error`."
  def run!(server, input, timeout \\ 5_000) do
    case run(server, input, timeout) do
      {:ok, row} -> row
      {:error, e} -> raise e
    end
  end

  ## Server

  @impl true
  def init(config), do: {:ok, struct!(__MODULE__, config)}

  @impl true
  def handle_call({:run, _sample, _deadline}, _from, %{queued: n, max_queue: max} = s) when n >= max do
    error = %Error{
      op: :serving,
      reason: "overloaded: #{n} requests are already queued",
      details: %{cause: :overloaded, max_queue: max}
    }

    {:reply, {:error, error}, s}
  end

  def handle_call({:run, sample, deadline}, {pid, _} = from, s) do
    # The monitor lets a dead caller's request leave the queue before it costs a batch slot.
    entry = {Process.monitor(pid), from, sample, System.monotonic_time(), deadline}
    {:noreply, schedule(%{s | queue: :queue.in(entry, s.queue), queued: s.queued + 1})}
  end

  @impl true
  def handle_info({:flush, timer}, %{timer: timer} = s), do: {:noreply, schedule(%{s | timer: nil})}
  def handle_info({:flush, _stale}, s), do: {:noreply, s}

  # The batch process has already replied to its callers.
  def handle_info({:batch_done, pid}, %{task: {pid, mref, entries}} = s) do
    Process.demonitor(mref, [:flush])
    Enum.each(entries, fn {caller_mref, _, _, _, _} -> Process.demonitor(caller_mref, [:flush]) end)
    {:noreply, schedule(%{s | task: nil})}
  end

  # The batch process died without answering (killed, or a NIF crash it could not catch).
  def handle_info({:DOWN, mref, :process, _, reason}, %{task: {_, mref, entries}} = s) do
    error = %Error{
      op: :serving,
      reason: "the batch process exited",
      details: %{cause: :batch_exit, exit: reason}
    }

    # Callers it answered before dying ignore this second reply (their call has returned).
    Enum.each(entries, fn {caller_mref, from, _, _, _} ->
      Process.demonitor(caller_mref, [:flush])
      GenServer.reply(from, {:error, error})
    end)

    {:noreply, schedule(%{s | task: nil})}
  end

  def handle_info({:DOWN, mref, :process, _, _}, s) do
    queue = :queue.filter(fn entry -> elem(entry, 0) != mref end, s.queue)
    {:noreply, schedule(%{s | queue: queue, queued: :queue.len(queue)})}
  end

  def handle_info(_other, s), do: {:noreply, s}

  ## Scheduling

  # Only the age of the oldest request and the queue length decide; a running batch defers the
  # decision to its completion (one batch at a time), so no timer is armed meanwhile.
  defp schedule(%{task: task} = s) when task != nil, do: cancel_timer(s)
  defp schedule(%{queued: 0} = s), do: cancel_timer(s)

  defp schedule(s) do
    {:value, {_, _, _, t0, _}} = :queue.peek(s.queue)
    waited = System.convert_time_unit(System.monotonic_time() - t0, :native, :millisecond)

    cond do
      s.queued >= s.batch_size or waited >= s.batch_timeout -> start_batch(cancel_timer(s))
      s.timer != nil -> s
      true -> arm_timer(s, s.batch_timeout - waited)
    end
  end

  defp arm_timer(s, ms) do
    ref = make_ref()
    Process.send_after(self(), {:flush, ref}, ms)
    %{s | timer: ref}
  end

  defp cancel_timer(s), do: %{s | timer: nil}

  defp start_batch(s) do
    {entries, queue, queued} = take(s.queue, s.batch_size, now_ms(), [])

    case entries do
      [] ->
        schedule(%{s | queue: queue, queued: queued})

      _ ->
        server = self()
        target = s.target
        t0 = entries |> Enum.map(&elem(&1, 3)) |> Enum.min()

        # Not linked: a batch that dies must fail its requests, not the server. It replies to
        # the callers itself, which keeps that work out of the server's loop.
        {pid, mref} =
          spawn_monitor(fn ->
            reply_all(entries, execute(target, Enum.map(entries, &elem(&1, 2)), t0, server))
            send(server, {:batch_done, self()})
          end)

        %{s | task: {pid, mref, entries}, queue: queue, queued: :queue.len(queue)}
    end
  end

  # Takes up to `n` live entries; requests whose caller already gave up (deadline passed) are
  # dropped here instead of being computed for nobody.
  defp take(queue, 0, _now, acc), do: {Enum.reverse(acc), queue, :queue.len(queue)}

  defp take(queue, n, now, acc) do
    case :queue.out(queue) do
      {:empty, queue} ->
        {Enum.reverse(acc), queue, 0}

      {{:value, {mref, _, _, _, deadline} = entry}, rest} ->
        if deadline != :infinity and deadline <= now do
          Process.demonitor(mref, [:flush])
          take(rest, n, now, acc)
        else
          take(rest, n - 1, now, [entry | acc])
        end
    end
  end

  defp execute(target, inputs, t0, server) do
    started = System.monotonic_time()
    {results, fallback} = Batch.execute(target, inputs)
    finished = System.monotonic_time()

    telemetry(
      %{batch_size: length(inputs), queue_time: started - t0, execution_time: finished - started},
      %{server: server, errors: Enum.count(results, &match?({:error, _}, &1)), fallback: fallback}
    )

    results
  end

  defp reply_all(entries, results),
    do: Enum.zip_with(entries, results, fn {_, from, _, _, _}, result -> GenServer.reply(from, result) end)

  defp telemetry(measurements, metadata) do
    if Code.ensure_loaded?(:telemetry),
      do: apply(:telemetry, :execute, [[:ex_burn, :serving, :batch], measurements, metadata])

    :ok
  end

  ## Options and inputs

  defp config!(target, opts) do
    for {key, _} <- opts,
        key not in @options,
        do: fail!("unknown option #{inspect(key)}", %{option: key, allowed: @options})

    %{
      target: target!(target),
      batch_size: ExBurn.Tensor.Util.int_option!(:serving, opts, :batch_size, 32),
      batch_timeout: ExBurn.Tensor.Util.int_option!(:serving, opts, :batch_timeout, 10, 0),
      max_queue:
        if(opts[:max_queue] == :infinity,
          do: :infinity,
          else: ExBurn.Tensor.Util.int_option!(:serving, opts, :max_queue, 1024)
        )
    }
  end

  defp target!(%Model{} = model), do: {:model, model}
  defp target!(%ExBurn.Embedding{} = model), do: {:embedding, model}
  defp target!(fun) when is_function(fun, 1), do: {:fun, fun}

  defp target!(other),
    do: fail!("expected an ExBurn.Model, an ExBurn.Embedding or a one-argument function", %{got: other})

  defp fail!(reason, details), do: raise(Error, op: :serving, reason: reason, details: details)

  @doc false
  def sample!(%Tensor{} = t), do: t
  def sample!({bin, type, shape}) when is_binary(bin), do: Tensor.from_binary(bin, type, shape: shape)
  def sample!(data) when is_number(data) or is_list(data), do: Tensor.tensor(data)
  # A text, for an ExBurn.Embedding target: the model tokenises it in the batch.
  def sample!(text) when is_binary(text), do: text
  def sample!(%{__struct__: Nx.Tensor} = t), do: sample!({apply(Nx, :to_binary, [t]), t.type, t.shape})
  def sample!(other), do: fail!("cannot use this as a sample", %{got: other})

  defp now_ms, do: System.monotonic_time(:millisecond)
end
