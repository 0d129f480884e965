defmodule ExBurn.LLM.Scheduler do
  @moduledoc """
  A process that owns a loaded `ExBurn.LLM` model and serves generation requests from many
  processes: queued in arrival order, streamed token by token to the process that asked, and
  stopped when that process dies or cancels. No Nx needed.

  `ExBurn.Serving.Batcher` batches one-shot requests (tensors, embedding texts); generation is
  a long, incremental computation, so it has its own scheduler, and the HTTP server
  (`ExBurn.Server`) uses both.

      {:ok, model} = ExBurn.LLM.load("smollm2-135m-instruct")
      {:ok, _} = ExBurn.LLM.Scheduler.start_link(model, name: Chat)

      ExBurn.LLM.Scheduler.stream(Chat, [%{role: "user", content: "Hi!"}], max_tokens: 32)
      |> Enum.each(&IO.write/1)

      {:ok, %{text: text, finish_reason: :length, usage: usage}} =
        ExBurn.LLM.Scheduler.generate(Chat, "Once upon a time", max_tokens: 16)

  In a supervision tree: `{ExBurn.LLM.Scheduler, model: model, name: Chat}`.

  ## Scheduling and fairness

  Requests wait in one first-in, first-out queue, whoever sends them. At most `:max_concurrent`
  generations run at once (default 1); each runs in its own process (linked to the server), one
  token per NIF call on a dirty CPU scheduler, and sends its text to the caller as it comes. With
  the default, generations run one at a time, in arrival order: each gets the whole CPU and
  finishes as early as it can, and a request's wait is the sum of the generations queued
  before it. With `max_concurrent: n` up to `n` generations run side by side, interleaved by
  the dirty schedulers (truly parallel where there are cores to spare); that lowers the wait of
  short requests behind long ones at the price of slower tokens for everyone. The server itself
  never runs model code, so it keeps accepting, queuing and cancelling while generations run.

  A request whose caller dies leaves the queue, or, running, is stopped within one token (the
  generation process is killed and the running NIF notices its process died). `cancel/2` does
  the same for a live caller, and a `stream/3` consumer that stops early cancels its request.

  ## Options of `start_link/2`

    * `:name` - registers the server (any `GenServer` name)
    * `:max_concurrent` - generations running at once (default 1)
    * `:max_queue` - the most requests waiting (not running); more are refused at once with an
      `ExBurn.Error` whose `details.cause` is `:overloaded` (default 256, or `:infinity`)

  ## Options of the request functions

  `stream/3`, `stream_events/3`, `generate/3` and `request/3` take the generation options of
  `ExBurn.LLM` (`:max_tokens`, `:temperature`, `:stop`, ...; checked before queuing, so a bad
  option is an error at once) and these:

    * `:timeout` - ms from the request to its last event (default `:infinity`); past it the
      request is cancelled and fails with `details.cause == :timeout`
    * `:alive?` - a zero-arity function asked about every `:check_interval` ms (default 250)
      while the caller waits for events; when it returns false the request is cancelled and
      the stream halts (`generate/3` returns `details.cause == :cancelled`). The HTTP server
      uses it to notice clients that hung up while their request is queued or generating.

  ## Messages

  `request/3` is the low-level interface: it returns `{:ok, ref}` and the caller then receives
  `{ExBurn.LLM.Scheduler, ref, event}` messages, `event` being `{:text, piece}` (any number),
  then `{:done, %{finish_reason: :stop | :length, usage: %{prompt_tokens: n,
  completion_tokens: m}}}` or `{:error, %ExBurn.Error{}}`. `ref` also monitors the server:
  `{:DOWN, ref, :process, _, reason}` means it stopped. `await/2` receives the next event.
  """

  use GenServer

  alias ExBurn.Error

  @options [:name, :max_concurrent, :max_queue]
  @call_options [:timeout, :alive?, :check_interval]

  defstruct [
    :model,
    :max_concurrent,
    :max_queue,
    queue: :queue.new(),
    requests: %{},
    workers: %{},
    cancels: %{}
  ]

  ## Client

  @doc "Starts a server for a loaded `ExBurn.LLM` model (see the moduledoc for the options)."
  def start_link(%ExBurn.LLM{} = model, opts) do
    opts = keyword!(opts)
    config = config!(opts)
    gen_opts = if name = opts[:name], do: [name: name], else: []
    GenServer.start_link(__MODULE__, Map.put(config, :model, model), gen_opts)
  end

  def start_link(other, _opts),
    do: raise(Error, op: :llm_scheduler, reason: "expected a loaded ExBurn.LLM model", details: %{got: other})

  @doc """
  `start_link(opts)` takes the model under `:model` (for child specs); `start_link(model)` uses
  the default options.
  """
  def start_link(%ExBurn.LLM{} = model), do: start_link(model, [])

  def start_link(opts) do
    {model, opts} = Keyword.pop(keyword!(opts), :model)
    start_link(model, opts)
  end

  @doc "A child spec: `{ExBurn.LLM.Scheduler, model: model, name: name}`; the id is the name."
  def child_spec(opts) do
    %{id: Keyword.get(keyword!(opts), :name, __MODULE__), start: {__MODULE__, :start_link, [opts]}}
  end

  @doc """
  Queues a generation of `prompt` (a string or chat messages, as `ExBurn.LLM.generate/3`) and
  returns `{:ok, ref}` at once; events arrive as messages (see the moduledoc). Errors:
  invalid prompt or options, `details.cause` `:overloaded` (queue full) or `:down`.
  """
  @spec request(GenServer.server(), ExBurn.LLM.prompt(), keyword) :: {:ok, reference} | {:error, Error.t()}
  def request(server, prompt, opts \\ []) do
    {_call_opts, gen_opts} = Keyword.split(keyword!(opts), @call_options)

    with {:ok, _} <- ExBurn.LLM.start_args(prompt, gen_opts),
         {:ok, pid} <- whereis(server) do
      ref = Process.monitor(pid)

      try do
        GenServer.call(pid, {:request, ref, self(), prompt, gen_opts}, :infinity)
      catch
        :exit, reason -> {:error, down(reason)}
      end
      |> case do
        :ok ->
          {:ok, ref}

        {:error, _} = error ->
          # no monitor message may outlive the failed request (a long-lived caller keeps its mailbox)
          Process.demonitor(ref, [:flush])
          error
      end
    end
  end

  @doc """
  Waits for the next event of request `ref`: `{:text, piece}`, `{:done, info}` or
  `{:error, %ExBurn.Error{}}` (also when the server stops), or `:timeout` after `timeout` ms.
  """
  @spec await(reference, timeout) :: {:text, String.t()} | {:done, map} | {:error, Error.t()} | :timeout
  def await(ref, timeout \\ :infinity)

  def await(_ref, timeout) when not (timeout == :infinity or (is_integer(timeout) and timeout >= 0)),
    do: fail!("the timeout must be a non-negative integer or :infinity", %{got: timeout})

  def await(ref, timeout) do
    receive do
      {__MODULE__, ^ref, event} ->
        if not match?({:text, _}, event), do: Process.demonitor(ref, [:flush])
        event

      {:DOWN, ^ref, :process, _, reason} ->
        {:error, down(reason)}
    after
      timeout -> :timeout
    end
  end

  @doc """
  Cancels request `ref` (queued or running; a finished one is left alone) and drops its pending
  messages from the caller's mailbox. Returns when the generation has stopped.
  """
  @spec cancel(GenServer.server(), reference) :: :ok
  def cancel(server, ref) do
    if is_reference(ref), do: Process.demonitor(ref, [:flush])

    with {:ok, pid} <- whereis(server) do
      GenServer.call(pid, {:cancel, ref}, :infinity)
    end

    flush(ref)
  catch
    :exit, _ -> flush(ref)
  end

  @doc """
  A lazy stream of the text pieces of a generation; the request is queued when the stream is
  first consumed, and stopping early (`Enum.take/2`, a halted reduce, the consumer's death)
  cancels it. Errors raise `ExBurn.Error` in the consumer.
  """
  @spec stream(GenServer.server(), ExBurn.LLM.prompt(), keyword) :: Enumerable.t()
  def stream(server, prompt, opts \\ []) do
    server
    |> stream_events(prompt, opts)
    |> Stream.flat_map(fn
      {:text, piece} -> [piece]
      {:done, _} -> []
    end)
  end

  @doc """
  Like `stream/3`, but with events: `{:text, piece}` for each piece and, last, `{:done, %{finish_reason:
  ..., usage: ...}}`.
  """
  @spec stream_events(GenServer.server(), ExBurn.LLM.prompt(), keyword) :: Enumerable.t()
  def stream_events(server, prompt, opts \\ []) do
    [nil]
    |> Stream.flat_map(fn nil ->
      case request(server, prompt, opts) do
        {:ok, ref} -> events(server, ref, opts)
        {:error, e} -> raise e
      end
    end)
    |> Stream.map(fn
      {:error, e} -> raise e
      event -> event
    end)
  end

  @doc """
  The events of request `ref` (from `request/3`) as a lazy stream: `{:text, piece}`s, then
  `{:done, info}` or `{:error, %ExBurn.Error{}}`, which ends it. It halts early, cancelling
  the request, when the consumer stops or `:alive?` says the caller is gone. Takes `:timeout`,
  `:alive?` and `:check_interval` (see the moduledoc).
  """
  @spec events(GenServer.server(), reference, keyword) :: Enumerable.t()
  def events(server, ref, opts \\ []) do
    Stream.resource(
      fn -> {:running, server, ref, waiting(opts)} end,
      fn
        {:running, server, ref, wait} = state ->
          case next_event(server, ref, wait) do
            {:text, _} = event -> {[event], state}
            {:done, _} = event -> {[event], {:finished, ref}}
            {:error, _} = event -> {[event], {:finished, ref}}
            :cancelled -> {:halt, {:finished, ref}}
          end

        {:finished, _} = state ->
          {:halt, state}
      end,
      fn
        {:running, server, ref, _} -> cancel(server, ref)
        {:finished, ref} -> flush(ref)
      end
    )
  end

  @doc """
  Generates a completion and returns `{:ok, %{text: text, finish_reason: reason, usage: usage}}`
  or `{:error, %ExBurn.Error{}}`.
  """
  @spec generate(GenServer.server(), ExBurn.LLM.prompt(), keyword) :: {:ok, map} | {:error, Error.t()}
  def generate(server, prompt, opts \\ []) do
    with {:ok, ref} <- request(server, prompt, opts), do: collect(server, ref, waiting(opts), [])
  end

  @doc "Queue and model facts: `%{model: name, queued: n, running: n, max_concurrent: n, max_queue: n}`."
  def info(server) do
    case whereis(server) do
      {:ok, pid} -> GenServer.call(pid, :info)
      {:error, e} -> raise e
    end
  catch
    :exit, reason -> raise down(reason)
  end

  defp collect(server, ref, wait, acc) do
    case next_event(server, ref, wait) do
      {:text, piece} ->
        collect(server, ref, wait, [piece | acc])

      {:done, info} ->
        {:ok, Map.put(info, :text, acc |> Enum.reverse() |> IO.iodata_to_binary())}

      {:error, _} = error ->
        error

      :cancelled ->
        {:error, %Error{op: :llm_scheduler, reason: "the caller went away", details: %{cause: :cancelled}}}
    end
  end

  defp waiting(opts) do
    opts = keyword!(opts)

    deadline =
      case Keyword.get(opts, :timeout, :infinity) do
        :infinity -> :infinity
        ms when is_integer(ms) and ms >= 0 -> now_ms() + ms
        other -> fail!(":timeout must be a non-negative integer or :infinity", %{got: other})
      end

    checked = :atomics.new(1, signed: true)
    :atomics.put(checked, 1, now_ms())

    %{
      deadline: deadline,
      alive?: opts[:alive?],
      interval: Keyword.get(opts, :check_interval, 250),
      checked: checked
    }
  end

  # The next event, or :cancelled (alive? said no) or a timeout error; both cancel the request.
  # alive? is asked every `interval` ms, while events flow as well as while none comes (a
  # non-streamed generation sends nothing to its client until the end).
  defp next_event(server, ref, %{deadline: deadline, alive?: alive?, interval: interval} = wait) do
    if alive? && due?(wait) && !alive?.() do
      cancel(server, ref)
      :cancelled
    else
      left = if deadline == :infinity, do: :infinity, else: max(deadline - now_ms(), 0)
      slice = if alive?, do: min_timeout(left, interval), else: left

      case await(ref, slice) do
        :timeout when left != :infinity and left <= slice ->
          cancel(server, ref)
          {:error, %Error{op: :llm_scheduler, reason: "no answer in time", details: %{cause: :timeout}}}

        :timeout ->
          next_event(server, ref, wait)

        event ->
          event
      end
    end
  end

  # True (and restarts the interval) when alive? is due again.
  defp due?(%{checked: checked, interval: interval}) do
    now = now_ms()

    if now - :atomics.get(checked, 1) >= interval do
      :atomics.put(checked, 1, now)
      true
    else
      false
    end
  end

  defp min_timeout(:infinity, b), do: b
  defp min_timeout(a, b), do: min(a, b)

  defp flush(ref) do
    receive do
      {__MODULE__, ^ref, _} -> flush(ref)
    after
      0 -> :ok
    end
  end

  defp whereis(server) do
    case GenServer.whereis(server) do
      pid when is_pid(pid) -> {:ok, pid}
      _ -> {:error, down(:noproc)}
    end
  rescue
    _ -> {:error, down(:noproc)}
  end

  defp keyword!(opts) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: opts,
      else: fail!("options must be a keyword list", %{got: opts})
  end

  defp down(reason),
    do: %Error{
      op: :llm_scheduler,
      reason: "the LLM server is not running",
      details: %{cause: :down, exit: reason}
    }

  defp now_ms, do: System.monotonic_time(:millisecond)

  ## Server

  @impl true
  def init(config) do
    Process.flag(:trap_exit, true)
    {:ok, struct!(__MODULE__, config)}
  end

  @impl true
  def handle_call({:request, ref, caller, prompt, opts}, _from, s) do
    if s.max_queue != :infinity and :queue.len(s.queue) >= s.max_queue do
      error = %Error{
        op: :llm_scheduler,
        reason: "overloaded: #{:queue.len(s.queue)} requests are already queued",
        details: %{cause: :overloaded, max_queue: s.max_queue}
      }

      {:reply, {:error, error}, s}
    else
      entry = %{caller: caller, mref: Process.monitor(caller), prompt: prompt, opts: opts, worker: nil}
      s = %{s | queue: :queue.in(ref, s.queue), requests: Map.put(s.requests, ref, entry)}
      {:reply, :ok, dispatch(s)}
    end
  end

  def handle_call({:cancel, ref}, from, s) do
    case Map.get(s.requests, ref) do
      nil ->
        {:reply, :ok, s}

      %{worker: nil} ->
        {:reply, :ok, drop(s, ref)}

      %{worker: pid} ->
        # Answered when the generation process is gone, so no event can follow the reply.
        Process.exit(pid, :kill)
        {:noreply, %{s | cancels: Map.update(s.cancels, pid, [from], &[from | &1])}}
    end
  end

  def handle_call(:info, _from, s) do
    {:reply,
     %{
       model: s.model.name,
       queued: :queue.len(s.queue),
       running: map_size(s.workers),
       max_concurrent: s.max_concurrent,
       max_queue: s.max_queue
     }, s}
  end

  @impl true
  def handle_info({:EXIT, pid, reason}, s) do
    case Map.pop(s.workers, pid) do
      {nil, _} ->
        # Not a worker (the parent's exit is handled by GenServer itself).
        if reason == :normal, do: {:noreply, s}, else: {:stop, reason, s}

      {ref, workers} ->
        {entry, requests} = Map.pop(s.requests, ref)

        # A generation that did not end by itself: its events end with an :error (a cancelling
        # caller flushes it; a dead one never reads it).
        if reason != :normal and entry do
          send(entry.caller, {__MODULE__, ref, {:error, worker_error(reason)}})
        end

        if entry, do: Process.demonitor(entry.mref, [:flush])
        {froms, cancels} = Map.pop(s.cancels, pid, [])
        Enum.each(froms, &GenServer.reply(&1, :ok))
        {:noreply, dispatch(%{s | workers: workers, requests: requests, cancels: cancels})}
    end
  end

  # A caller died: its request leaves the queue or its generation stops.
  def handle_info({:DOWN, mref, :process, _, _}, s) do
    case Enum.find(s.requests, fn {_, entry} -> entry.mref == mref end) do
      nil ->
        {:noreply, s}

      {ref, %{worker: nil}} ->
        {:noreply, drop(s, ref)}

      {_ref, %{worker: pid}} ->
        Process.exit(pid, :kill)
        {:noreply, s}
    end
  end

  def handle_info(_other, s), do: {:noreply, s}

  @impl true
  def terminate(_reason, s) do
    Enum.each(s.workers, fn {pid, _} -> Process.exit(pid, :kill) end)
  end

  defp drop(s, ref) do
    {entry, requests} = Map.pop(s.requests, ref)
    if entry, do: Process.demonitor(entry.mref, [:flush])
    %{s | requests: requests, queue: :queue.delete(ref, s.queue)}
  end

  defp dispatch(s) do
    if map_size(s.workers) < s.max_concurrent do
      case :queue.out(s.queue) do
        {:empty, _} ->
          s

        {{:value, ref}, queue} ->
          entry = Map.fetch!(s.requests, ref)
          pid = start_worker(s.model, ref, entry)

          dispatch(%{
            s
            | queue: queue,
              workers: Map.put(s.workers, pid, ref),
              requests: Map.put(s.requests, ref, %{entry | worker: pid})
          })
      end
    else
      s
    end
  end

  defp start_worker(model, ref, %{caller: caller, prompt: prompt, opts: opts}) do
    spawn_link(fn ->
      try do
        model
        |> ExBurn.LLM.stream_events(prompt, opts)
        |> Enum.each(&send(caller, {__MODULE__, ref, &1}))
      rescue
        e in Error ->
          send(caller, {__MODULE__, ref, {:error, e}})

        e ->
          send(caller, {__MODULE__, ref, {:error, worker_error({e, __STACKTRACE__})}})
      end
    end)
  end

  defp worker_error(reason) do
    %Error{
      op: :llm_scheduler,
      reason: "the generation failed",
      details: %{cause: :exception, exit: inspect(reason)}
    }
  end

  defp config!(opts) do
    for {key, _} <- opts,
        key not in @options,
        do: fail!("unknown option #{inspect(key)}", %{option: key, allowed: @options})

    %{
      max_concurrent: ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :max_concurrent, 1),
      max_queue:
        if(opts[:max_queue] == :infinity,
          do: :infinity,
          else: ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :max_queue, 256)
        )
    }
  end

  defp fail!(reason, details), do: raise(Error, op: :llm_scheduler, reason: reason, details: details)
end
