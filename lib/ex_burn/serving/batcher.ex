defmodule ExBurn.Serving.Batcher do
  @moduledoc """
  A batching inference server that needs no Nx: requests for one sample each are stacked into a
  batch for an `ExBurn.Model` or a function `fn batch_tensor -> output_tensor end`, and the
  output rows are sent back to their callers. For an `ExBurn.Embedding` model each sample is a
  text or `{:token_ids, ids}` (a row as `ExBurn.Embedding.tokenize/2` gives it, for callers that
  tokenise on their side), the batch is one padded model call, and each caller gets its vector
  (a list of floats).

      {:ok, _pid} = ExBurn.Serving.Batcher.start_link(model, name: MyModel, batch_size: 32, batch_timeout: 5)
      {:ok, row} = ExBurn.Serving.Batcher.run(MyModel, [0.5, 1.0])
      {:ok, [row1, row2]} = ExBurn.Serving.Batcher.run_many(MyModel, [[0.5, 1.0], [2.0, 3.0]])

  In a supervision tree: `{ExBurn.Serving.Batcher, model: model, name: MyModel, batch_size: 32}`.

  ## Options

    * `:name` - registers the server (any `GenServer` name)
    * `:batch_size` - the most samples in one batch (default 32)
    * `:batch_timeout` - ms the oldest queued request waits for the batch to fill (default 10)
    * `:max_queue` - the most queued (not yet running) requests; more are refused at once with
      an `ExBurn.Error` whose `details.cause` is `:overloaded` (default 1024, or `:infinity`)
    * `:warmup` - one sample, as `run/3` takes it: before the server starts, the target runs on
      a batch of one copy of it and on a full batch (`:batch_size` copies), in the caller. On a
      GPU the first batch of a shape compiles its kernels, for seconds; this does it before
      traffic. If the sample fails, `start_link` returns that `{:error, %ExBurn.Error{}}`
      (default: none)

  ## Semantics

  A batch runs when `batch_size` requests are queued or the oldest one has waited
  `batch_timeout` ms. It runs in a separate process, so the server keeps queuing while the model
  works (model calls themselves run on dirty schedulers); one batch runs at a time.

  The samples of one `run_many/3` are queued together, so they share batches with each other
  and with other callers' samples, and are counted one each against `:max_queue`.

  A caller that dies while queued is dropped from the queue, and one whose `run/3` or
  `run_many/3` timed out is skipped; a caller that dies while its batch runs simply gets no
  reply. When a batch fails, its requests are run one by one so only those that fail on their
  own get `{:error, %ExBurn.Error{}}`.

  ## Telemetry

  When `:telemetry` is loaded, each batch emits `[:ex_burn, :serving, :batch]` with measurements
  `%{batch_size: n, queue_time: t, execution_time: t}` (native time units; `queue_time` is the
  oldest request's wait) and metadata `%{server: pid, errors: failed_requests, fallback: boolean}`
  (`fallback` is true when the batch failed and its requests were run one by one).
  """

  use GenServer

  alias ExBurn.{Error, Model, Tensor}
  alias ExBurn.Serving.Batch

  @options [:name, :batch_size, :batch_timeout, :max_queue, :warmup]

  # `holds` counts, per caller monitor, that caller's samples queued or running: the samples of
  # one `run_many/3` share one monitor, released when the last of them is done.
  defstruct [
    :target,
    :batch_size,
    :batch_timeout,
    :max_queue,
    :timer,
    :task,
    queue: :queue.new(),
    queued: 0,
    holds: %{}
  ]

  ## Client

  @doc "Starts a server for `model_or_fun` (see the module doc for the options)."
  def start_link(model_or_fun, opts) do
    opts = Keyword.new(opts)
    config = config!(model_or_fun, opts)
    gen_opts = if name = opts[:name], do: [name: name], else: []

    with :ok <- warm_up(config, opts[:warmup]),
         do: GenServer.start_link(__MODULE__, config, gen_opts)
  end

  # in the caller, before the server exists: nothing can reach it until the target is warm
  defp warm_up(_config, nil), do: :ok

  defp warm_up(%{target: target, batch_size: size}, sample) do
    sample = sample!(sample)

    ExBurn.Pretrained.WarmUp.embedder_sizes(size)
    |> ExBurn.Pretrained.WarmUp.run(fn n ->
      {rows, _fallback} = Batch.execute(target, List.duplicate(sample, n))
      Enum.find_value(rows, :ok, fn row -> match?({:error, _}, row) && row end)
    end)
    |> case do
      {:ok, _timing} -> :ok
      error -> error
    end
  rescue
    e in Error -> {:error, e}
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
    GenServer.call(server, {:run, sample, deadline(timeout)}, timeout)
  rescue
    e in Error -> {:error, e}
  catch
    :exit, {:timeout, _} -> {:error, timeout_error(timeout)}
    :exit, {reason, _} -> {:error, down_error(reason)}
  end

  @doc """
  Runs several samples as one request: `{:ok, rows}` (one row per input, in order) or
  `{:error, %ExBurn.Error{}}`, the error of the first input that failed.

  The samples are queued at once and share batches as separate `run/3` calls would, without a
  process per sample: their rows come back as messages to a process alias of the caller that is
  dropped when this returns, so rows that arrive after a timeout are discarded. `timeout`
  bounds the whole request. The server-side failures are `run/3`'s (`details.cause`
  `:overloaded` when the queue cannot take all the samples now, `:timeout`, `:down`); more
  samples than `:max_queue` could ever take are an error with `details.kind` `:argument`.
  """
  def run_many(server, inputs, timeout \\ 5_000)
  def run_many(_server, [], _timeout), do: {:ok, []}

  def run_many(server, inputs, timeout) when is_list(inputs) do
    samples = Enum.map(inputs, &sample!/1)
    deadline = deadline(timeout)

    case GenServer.whereis(server) do
      nil -> {:error, down_error(:noproc)}
      pid -> submit(pid, samples, deadline, timeout)
    end
  rescue
    e in Error -> {:error, e}
  end

  def run_many(_server, other, _timeout),
    do:
      {:error,
       %Error{op: :serving, reason: "expected a list of samples", details: %{got: other, kind: :argument}}}

  defp submit(pid, samples, deadline, timeout) do
    reply_to = :erlang.alias()
    server_ref = Process.monitor(pid)

    try do
      case GenServer.call(pid, {:run_many, reply_to, samples, deadline}, timeout) do
        :ok -> collect(reply_to, server_ref, length(samples), deadline, timeout, %{})
        {:error, _} = error -> error
      end
    catch
      :exit, {:timeout, _} -> {:error, timeout_error(timeout)}
      :exit, {reason, _} -> {:error, down_error(reason)}
    after
      :erlang.unalias(reply_to)
      Process.demonitor(server_ref, [:flush])
      flush(reply_to)
    end
  end

  # Waits for the `n` rows sent to `reply_to`; the server's monitor ends the wait if it dies.
  defp collect(_reply_to, _server_ref, n, _deadline, _timeout, rows) when map_size(rows) == n do
    results = Enum.map(0..(n - 1), &Map.fetch!(rows, &1))

    case Enum.find(results, &match?({:error, _}, &1)) do
      nil -> {:ok, Enum.map(results, fn {:ok, row} -> row end)}
      error -> error
    end
  end

  defp collect(reply_to, server_ref, n, deadline, timeout, rows) do
    wait = if deadline == :infinity, do: :infinity, else: max(deadline - now_ms(), 0)

    receive do
      {^reply_to, i, result} ->
        # the first reply counts: a batch process that dies after answering answers again
        collect(reply_to, server_ref, n, deadline, timeout, Map.put_new(rows, i, result))

      {:DOWN, ^server_ref, :process, _, reason} ->
        {:error, down_error(reason)}
    after
      wait -> {:error, timeout_error(timeout)}
    end
  end

  # Rows that arrived before the alias was dropped but after the caller stopped waiting.
  defp flush(reply_to) do
    receive do
      {^reply_to, _, _} -> flush(reply_to)
    after
      0 -> :ok
    end
  end

  defp deadline(timeout) when is_integer(timeout), do: now_ms() + timeout
  defp deadline(_infinity), do: :infinity

  defp timeout_error(timeout),
    do: %Error{
      op: :serving,
      reason: "no reply within #{timeout} ms",
      details: %{cause: :timeout, timeout: timeout}
    }

  defp down_error(reason),
    do: %Error{
      op: :serving,
      reason: "the serving process is not running",
      details: %{cause: :down, exit: reason}
    }

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
  def handle_call({:run, _sample, _deadline}, _from, %{queued: n, max_queue: max} = s) when n >= max,
    do: {:reply, {:error, overloaded(n, max)}, s}

  def handle_call({:run, sample, deadline}, {pid, _} = from, s) do
    {:noreply, schedule(enqueue(s, pid, [{from, sample}], deadline))}
  end

  def handle_call({:run_many, _reply_to, samples, _deadline}, _from, %{max_queue: max} = s)
      when max != :infinity and length(samples) > max do
    error = %Error{
      op: :serving,
      reason: "#{length(samples)} samples in one request are more than max_queue (#{max})",
      details: %{kind: :argument, samples: length(samples), max_queue: max}
    }

    {:reply, {:error, error}, s}
  end

  def handle_call({:run_many, reply_to, samples, deadline}, {pid, _}, %{queued: n, max_queue: max} = s) do
    if max != :infinity and n + length(samples) > max do
      {:reply, {:error, overloaded(n, max)}, s}
    else
      entries =
        samples |> Enum.with_index() |> Enum.map(fn {sample, i} -> {{:alias, reply_to, i}, sample} end)

      {:reply, :ok, schedule(enqueue(s, pid, entries, deadline))}
    end
  end

  defp overloaded(n, max),
    do: %Error{
      op: :serving,
      reason: "overloaded: #{n} requests are already queued",
      details: %{cause: :overloaded, max_queue: max}
    }

  # The monitor lets a dead caller's samples leave the queue before they cost a batch slot.
  defp enqueue(s, pid, entries, deadline) do
    mref = Process.monitor(pid)
    t0 = System.monotonic_time()

    queue =
      Enum.reduce(entries, s.queue, fn {to, sample}, q -> :queue.in({mref, to, sample, t0, deadline}, q) end)

    %{s | queue: queue, queued: s.queued + length(entries), holds: Map.put(s.holds, mref, length(entries))}
  end

  @impl true
  def handle_info({:flush, timer}, %{timer: timer} = s), do: {:noreply, schedule(%{s | timer: nil})}
  def handle_info({:flush, _stale}, s), do: {:noreply, s}

  # The batch process has already replied to its callers.
  def handle_info({:batch_done, pid}, %{task: {pid, mref, entries}} = s) do
    Process.demonitor(mref, [:flush])
    {:noreply, schedule(%{release(s, entries) | task: nil})}
  end

  # The batch process died without answering (killed, or a NIF crash it could not catch).
  def handle_info({:DOWN, mref, :process, _, reason}, %{task: {_, mref, entries}} = s) do
    error = %Error{
      op: :serving,
      reason: "the batch process exited",
      details: %{cause: :batch_exit, exit: reason}
    }

    # Callers it answered before dying ignore this second reply (their call has returned, or
    # the row of that sample is already in).
    Enum.each(entries, fn {_, to, _, _, _} -> reply(to, {:error, error}) end)
    {:noreply, schedule(%{release(s, entries) | task: nil})}
  end

  def handle_info({:DOWN, mref, :process, _, _}, s) do
    queue = :queue.filter(fn entry -> elem(entry, 0) != mref end, s.queue)
    {:noreply, schedule(%{s | queue: queue, queued: :queue.len(queue), holds: Map.delete(s.holds, mref)})}
  end

  def handle_info(_other, s), do: {:noreply, s}

  # The callers of `entries` hold their monitors one sample less; the last one releases it.
  defp release(s, entries) do
    holds =
      Enum.reduce(entries, s.holds, fn {mref, _, _, _, _}, holds ->
        case Map.fetch(holds, mref) do
          {:ok, 1} ->
            Process.demonitor(mref, [:flush])
            Map.delete(holds, mref)

          {:ok, n} ->
            Map.put(holds, mref, n - 1)

          # the caller died meanwhile: its monitor is gone already
          :error ->
            holds
        end
      end)

    %{s | holds: holds}
  end

  defp reply({:alias, reply_to, i}, result), do: send(reply_to, {reply_to, i, result})
  defp reply(from, result), do: GenServer.reply(from, result)

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
    {entries, expired, queue, queued} = take(s.queue, s.batch_size, now_ms(), [], [])
    s = release(s, expired)

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
  # dropped here (returned as `expired`) instead of being computed for nobody.
  defp take(queue, 0, _now, acc, expired), do: {Enum.reverse(acc), expired, queue, :queue.len(queue)}

  defp take(queue, n, now, acc, expired) do
    case :queue.out(queue) do
      {:empty, queue} ->
        {Enum.reverse(acc), expired, queue, 0}

      {{:value, {_, _, _, _, deadline} = entry}, rest} ->
        if deadline != :infinity and deadline <= now,
          do: take(rest, n, now, acc, [entry | expired]),
          else: take(rest, n - 1, now, [entry | acc], expired)
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
    do: Enum.zip_with(entries, results, fn {_, to, _, _, _}, result -> reply(to, result) end)

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
  # A row of token ids, for an ExBurn.Embedding target: the model checks the ids in the batch.
  def sample!({:token_ids, ids} = row) when is_list(ids), do: row
  def sample!(%{__struct__: Nx.Tensor} = t), do: sample!({apply(Nx, :to_binary, [t]), t.type, t.shape})
  def sample!(other), do: fail!("cannot use this as a sample", %{got: other})

  defp now_ms, do: System.monotonic_time(:millisecond)
end
