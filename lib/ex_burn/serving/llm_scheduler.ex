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

  ## Scheduling: continuous batching

  The server runs its generations together, a step at a time: each step is one call into the
  model that advances every running generation by a token (one pass over the weights for all
  of them), so several users cost little more than one. Requests join at a step boundary and
  leave as soon as they finish; the server itself never runs model code, so it keeps accepting,
  queuing and cancelling while a step runs.

  A new prompt is run in chunks within the step's token budget (`:step_tokens`): every running
  generation gets its token first, then prompts get what is left, in the order they joined. So
  a long prompt never stalls the streams already running by more than a step's budget, and it
  is never starved. A request's output is the same whatever else is in the batch.

  Requests wait in one first-in, first-out queue and join while fewer than `:max_concurrent`
  run and the KV cache they may need fits the budget (`:kv_memory`): each reserves its prompt
  plus `max_tokens` (within the model's context) times the model's `kv_bytes_per_token`, from
  joining to finishing. The head of the queue waits for room; later requests don't pass it. A
  request that could not fit even alone fails at once with `details.cause == :overloaded`.

  A request whose caller dies leaves the queue, or, running, leaves at the end of the current
  step (one token). `cancel/2` does the same for a live caller, and a `stream/3` consumer that
  stops early cancels its request.

  ## Options of `start_link/2`

    * `:name` - registers the server (any `GenServer` name)
    * `:group` - joins replica group `group` (any term; see Replicas)
    * `:max_concurrent` - generations in a step at most (default 32)
    * `:step_tokens` - tokens a step runs at most, prompts' chunks and decoded tokens together
      (default 256)
    * `:kv_memory` - bytes of KV cache the running generations may reserve together (default
      1 GiB)
    * `:max_queue` - the most requests waiting (not running); more are refused at once with an
      `ExBurn.Error` whose `details.cause` is `:overloaded` (default 256, or `:infinity`)
    * `:warmup` - `true` runs `ExBurn.LLM.warm_up/2` at every batch size from 1 to
      `:max_concurrent` before the server starts (`start_link/2` returns once it is done, or
      `{:error, %ExBurn.Error{}}`), a list of sizes runs those; default `false`. On GPUs each
      batch size of a step compiles its own kernels on first use, which would otherwise stall
      the steps where concurrency first reaches it

  ## Replicas

  Several schedulers can serve one model: each loads its own copy (on a device of its own, or
  several on the CPU, on this node or on others) and starts with the same `:group`. The request
  functions, `events/3`, `cancel/2` and `info/1` then take `{:group, name}` instead of a server
  (so `{:group, name}` always means a group, never the process `:group` on node `name`):

      {:ok, _} = ExBurn.LLM.Scheduler.start_link(model_on_gpu0, group: :chat)
      {:ok, _} = ExBurn.LLM.Scheduler.start_link(model_on_gpu1, group: :chat)
      ExBurn.LLM.Scheduler.generate({:group, :chat}, "Once upon a time", max_tokens: 16)

  Members are kept by OTP's `:pg` (scope `ExBurn.LLM.Scheduler.Groups`, started on first use),
  so the schedulers of a group on connected nodes are members too. Each request asks every
  member for its load and goes to the least loaded one: the requests it holds (queued and
  running) per batch slot (`:max_concurrent`), ties going to the smaller share of its KV
  budget reserved, then to a member on this node, then to one at random. A member that does
  not answer within 5 s, has stopped, or whose queue is full is passed over; with none left
  the request fails with `details.cause` `:down` (or `:overloaded`). From then on the request
  is bound to its member: its events, `:timeout`, `:alive?`, the caller's death and a stopped
  stream act there as with a direct server. `cancel/2` with the group asks every member (only
  the one holding the request acts). Routing asks every member for each request, so it suits a
  few replicas, not hundreds.

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

  alias ExBurn.{Error, Pretrained}
  alias ExBurn.LLM.Scheduler.Group

  @options [:name, :group, :max_concurrent, :step_tokens, :kv_memory, :max_queue, :warmup]
  @call_options [:timeout, :alive?, :check_interval]

  defstruct [
    :model,
    :group,
    :warmup,
    :max_concurrent,
    :step_tokens,
    :kv_memory,
    :max_queue,
    queue: :queue.new(),
    requests: %{},
    running: [],
    stepping: nil,
    kv_reserved: 0,
    kv_peak: 0,
    cancels: %{}
  ]

  @typedoc "A scheduler (any `GenServer` name or pid) or `{:group, name}`: its least loaded replica."
  @type server :: GenServer.server() | {:group, term}

  ## Client

  @doc "Starts a server for a loaded `ExBurn.LLM` model (see the moduledoc for the options)."
  def start_link(%ExBurn.LLM{} = model, opts) do
    opts = keyword!(opts)
    {warmup, config} = Map.pop(config!(opts), :warmup)
    gen_opts = if name = opts[:name], do: [name: name], else: []

    # in the caller, before the server exists: nothing can reach it until the model is warm
    with {:ok, warmed} <- warm_up(model, warmup),
         do: GenServer.start_link(__MODULE__, Map.merge(config, %{model: model, warmup: warmed}), gen_opts)
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
  @spec request(server, ExBurn.LLM.prompt(), keyword) :: {:ok, reference} | {:error, Error.t()}
  def request(server, prompt, opts \\ []) do
    with {:ok, _pid, ref} <- bound_request(server, prompt, opts), do: {:ok, ref}
  end

  # request/3 that also says which process took the request (the member a group routed it to),
  # so that the functions which wait for its events cancel it there.
  defp bound_request(server, prompt, opts) do
    {_call_opts, gen_opts} = Keyword.split(keyword!(opts), @call_options)

    with {:ok, _} <- ExBurn.LLM.start_args(prompt, gen_opts) do
      case server do
        {:group, group} -> Group.route(group, &enqueue(&1, prompt, gen_opts))
        _ -> with {:ok, pid} <- whereis(server), do: enqueue(pid, prompt, gen_opts)
      end
    end
  end

  defp enqueue(pid, prompt, gen_opts) do
    ref = Process.monitor(pid)

    try do
      GenServer.call(pid, {:request, ref, self(), prompt, gen_opts}, :infinity)
    catch
      :exit, reason -> {:error, down(reason)}
    end
    |> case do
      :ok ->
        {:ok, pid, ref}

      {:error, _} = error ->
        # no monitor message may outlive the failed request (a long-lived caller keeps its mailbox)
        Process.demonitor(ref, [:flush])
        error
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
  @spec cancel(server, reference) :: :ok
  def cancel(server, ref) do
    if is_reference(ref), do: Process.demonitor(ref, [:flush])

    case server do
      {:group, group} ->
        # the ref does not say which member took it: each is asked, the others have nothing to do
        group |> members() |> Enum.map(&:gen_server.send_request(&1, {:cancel, ref})) |> Enum.each(&wait/1)

      _ ->
        with {:ok, pid} <- whereis(server), do: GenServer.call(pid, {:cancel, ref}, :infinity)
    end

    flush(ref)
  catch
    :exit, _ -> flush(ref)
  end

  defp wait(request_id), do: :gen_server.receive_response(request_id, :infinity)

  @doc """
  A lazy stream of the text pieces of a generation; the request is queued when the stream is
  first consumed, and stopping early (`Enum.take/2`, a halted reduce, the consumer's death)
  cancels it. Errors raise `ExBurn.Error` in the consumer.
  """
  @spec stream(server, ExBurn.LLM.prompt(), keyword) :: Enumerable.t()
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
  @spec stream_events(server, ExBurn.LLM.prompt(), keyword) :: Enumerable.t()
  def stream_events(server, prompt, opts \\ []) do
    [nil]
    |> Stream.flat_map(fn nil ->
      case bound_request(server, prompt, opts) do
        {:ok, pid, ref} -> events(pid, ref, opts)
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
  @spec events(server, reference, keyword) :: Enumerable.t()
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
  @spec generate(server, ExBurn.LLM.prompt(), keyword) :: {:ok, map} | {:error, Error.t()}
  def generate(server, prompt, opts \\ []) do
    with {:ok, pid, ref} <- bound_request(server, prompt, opts), do: collect(pid, ref, waiting(opts), [])
  end

  @doc """
  Queue and model facts: `%{model: name, queued: n, running: n, max_concurrent: n,
  step_tokens: n, kv_memory: bytes, kv_reserved: bytes, kv_peak: bytes, max_queue: n,
  warmup: nil | %{batch_sizes: [n], ms: ms}}` (`kv_peak`: the most ever reserved at once;
  `warmup`: what `:warmup` ran at start, and how long it took).

  For `{:group, name}`: `%{group: name, queued: n, running: n, members: [info]}`, the totals
  and each member's facts that answered (with its `:pid` and `:node`), least loaded first.
  """
  def info({:group, group}) do
    members = for {_key, pid, info} <- Group.loads(group), do: Map.merge(info, %{pid: pid, node: node(pid)})

    %{
      group: group,
      queued: members |> Enum.map(& &1.queued) |> Enum.sum(),
      running: members |> Enum.map(& &1.running) |> Enum.sum(),
      members: members
    }
  end

  def info(server) do
    case whereis(server) do
      {:ok, pid} -> GenServer.call(pid, :info)
      {:error, e} -> raise e
    end
  catch
    :exit, reason -> raise down(reason)
  end

  @doc """
  The pids of the schedulers in replica group `group`, on this node and on the connected ones
  (see Replicas in the moduledoc).
  """
  @spec members(term) :: [pid]
  def members(group), do: Group.members(group)

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

  # Each request is an entry in `requests`: queued (`gen: nil`, its ref in `queue`), then
  # started (tokenised, `gen` its generation) and, once its KV reservation fits, running (its
  # ref in `running`, in the order it joined). A step process runs one batched step of the
  # running generations at a time (`stepping`); the server never runs model code itself.

  @impl true
  def init(config) do
    Process.flag(:trap_exit, true)
    if config.group != nil, do: :ok = Group.join(config.group)
    {:ok, struct!(__MODULE__, config)}
  end

  @impl true
  def handle_call({:request, ref, caller, prompt, opts}, _from, s) do
    if s.max_queue != :infinity and :queue.len(s.queue) >= s.max_queue do
      {:reply,
       {:error, overloaded("#{:queue.len(s.queue)} requests are already queued", max_queue: s.max_queue)}, s}
    else
      entry = %{caller: caller, mref: Process.monitor(caller), prompt: prompt, opts: opts, gen: nil}
      s = %{s | queue: :queue.in(ref, s.queue), requests: Map.put(s.requests, ref, entry)}
      {:reply, :ok, schedule(s)}
    end
  end

  def handle_call({:cancel, ref}, from, s) do
    if in_step?(s, ref) do
      # answered when the step ends, so no event of it can follow the reply
      {:noreply, %{s | cancels: Map.update(s.cancels, ref, [from], &[from | &1])}}
    else
      {:reply, :ok, drop(s, ref)}
    end
  end

  def handle_call(:info, _from, s) do
    {:reply,
     %{
       model: s.model.name,
       queued: :queue.len(s.queue),
       running: length(s.running),
       max_concurrent: s.max_concurrent,
       max_queue: s.max_queue,
       step_tokens: s.step_tokens,
       kv_memory: s.kv_memory,
       kv_reserved: s.kv_reserved,
       kv_peak: s.kv_peak,
       warmup: s.warmup
     }, s}
  end

  @impl true
  def handle_info({:stepped, pid, results}, %{stepping: {pid, _}} = s) do
    s = %{s | stepping: nil}
    s = Enum.reduce(results, s, &deliver/2)
    {:noreply, s |> answer_cancels() |> schedule()}
  end

  def handle_info({:EXIT, pid, reason}, s) do
    case s.stepping do
      {^pid, refs} when reason != :normal ->
        # the step died before answering: its generations fail (their caches are unknown)
        s = Enum.reduce(refs, %{s | stepping: nil}, &fail(&2, &1, worker_error(reason)))
        {:noreply, s |> answer_cancels() |> schedule()}

      {^pid, _} ->
        {:noreply, s}

      _ ->
        # not the step process (the parent's exit is handled by GenServer itself)
        if reason == :normal, do: {:noreply, s}, else: {:stop, reason, s}
    end
  end

  # A caller died: its request leaves at once, or when the step it is in ends.
  def handle_info({:DOWN, mref, :process, _, _}, s) do
    case Enum.find(s.requests, fn {_, entry} -> entry.mref == mref end) do
      nil ->
        {:noreply, s}

      {ref, _} ->
        if in_step?(s, ref),
          do: {:noreply, %{s | cancels: Map.put_new(s.cancels, ref, [])}},
          else: {:noreply, schedule(drop(s, ref))}
    end
  end

  def handle_info(_other, s), do: {:noreply, s}

  @impl true
  def terminate(_reason, s) do
    # leaves at once, so routers stop choosing it before :pg notices the exit
    if s.group != nil, do: catch_exit(fn -> Group.leave(s.group) end)
    with {pid, _} <- s.stepping, do: Process.exit(pid, :kill)
  end

  defp catch_exit(fun) do
    fun.()
  catch
    :exit, _ -> :ok
  end

  defp in_step?(%{stepping: {_, refs}}, ref), do: ref in refs
  defp in_step?(_, _), do: false

  # The results of one request's step: its events go to its caller, and it leaves when done.
  defp deliver({ref, result}, s) do
    case {Map.fetch(s.requests, ref), result} do
      {:error, _} ->
        s

      {{:ok, _}, _} when is_map_key(s.cancels, ref) ->
        drop(s, ref)

      {{:ok, entry}, {:ok, {status, text, ids, finish}}} ->
        if text != "", do: send(entry.caller, {__MODULE__, ref, {:text, text}})
        entry = %{entry | fed: entry.fed + entry.chunk, completion: entry.completion + length(ids)}

        if status == :done do
          usage = %{prompt_tokens: entry.prompt_len, completion_tokens: entry.completion}
          send(entry.caller, {__MODULE__, ref, {:done, %{finish_reason: finish, usage: usage}}})
          drop(s, ref)
        else
          %{s | requests: Map.put(s.requests, ref, entry)}
        end

      {{:ok, _}, {:error, {op, reason, details}}} ->
        fail(s, ref, %Error{op: op, reason: reason, details: details})
    end
  end

  defp fail(s, ref, error) do
    case Map.fetch(s.requests, ref) do
      {:ok, entry} ->
        unless Map.has_key?(s.cancels, ref), do: send(entry.caller, {__MODULE__, ref, {:error, error}})
        drop(s, ref)

      :error ->
        s
    end
  end

  defp answer_cancels(s) do
    Enum.each(s.cancels, fn {_, froms} -> Enum.each(froms, &GenServer.reply(&1, :ok)) end)
    Enum.reduce(Map.keys(s.cancels), %{s | cancels: %{}}, &drop(&2, &1))
  end

  # Removes a request wherever it is, releasing its KV reservation.
  defp drop(s, ref) do
    case Map.pop(s.requests, ref) do
      {nil, _} ->
        s

      {entry, requests} ->
        Process.demonitor(entry.mref, [:flush])

        %{
          s
          | requests: requests,
            queue: :queue.delete(ref, s.queue),
            running: List.delete(s.running, ref),
            kv_reserved: s.kv_reserved - Map.get(entry, :reserved, 0)
        }
    end
  end

  # At a step boundary: requests join while the batch and the KV budget have room, then the
  # next step starts.
  defp schedule(%{stepping: nil} = s) do
    s = admit(s)
    if s.running == [], do: s, else: step(s)
  end

  defp schedule(s), do: s

  # Joins queued requests in arrival order. The first one that doesn't fit waits at the head
  # (later ones don't pass it), so a long prompt is not starved by short ones.
  defp admit(s) do
    with true <- length(s.running) < s.max_concurrent,
         {{:value, ref}, queue} <- :queue.out(s.queue) do
      entry = Map.fetch!(s.requests, ref)

      case start(s, entry) do
        {:ok, entry} ->
          cond do
            s.kv_reserved + entry.reserved <= s.kv_memory ->
              entry = Map.merge(entry, %{fed: 0, chunk: 0, completion: 0})

              admit(%{
                s
                | queue: queue,
                  running: s.running ++ [ref],
                  kv_reserved: s.kv_reserved + entry.reserved,
                  kv_peak: max(s.kv_peak, s.kv_reserved + entry.reserved),
                  requests: Map.put(s.requests, ref, entry)
              })

            s.running == [] ->
              # alone it still doesn't fit: it never will
              error =
                overloaded("the request needs #{entry.reserved} bytes of KV cache",
                  kv_memory: s.kv_memory,
                  kv_needed: entry.reserved
                )

              admit(fail(%{s | queue: queue}, ref, error))

            true ->
              %{s | requests: Map.put(s.requests, ref, entry)}
          end

        {:error, error} ->
          admit(fail(%{s | queue: queue}, ref, error))
      end
    else
      _ -> s
    end
  end

  # Tokenises the prompt and opens the generation (once), and reserves the KV cache its
  # longest run can take: prompt plus max_tokens, within the context.
  defp start(_s, %{gen: gen} = entry) when gen != nil, do: {:ok, entry}

  defp start(s, entry) do
    model = s.model

    with {:ok, start} <- ExBurn.LLM.start_args(entry.prompt, entry.opts),
         {:ok, gen} <- Pretrained.wrap(ExBurn.Native.llm_start(model.ref, start.prompt, start.opts)),
         {:ok, ids} <- Pretrained.wrap(ExBurn.Native.llm_prompt_ids(gen)) do
      tokens = min(length(ids) + start.opts.max_tokens, model.context_length)

      {:ok,
       Map.merge(entry, %{gen: gen, prompt_len: length(ids), reserved: tokens * model.kv_bytes_per_token})}
    end
  end

  # One batched step of the running generations in a process of its own. The step's token
  # budget goes to every running decode first (a token each), then to prompts in the order they
  # joined; a prompt left without budget sits this step out.
  defp step(s) do
    {plan, _left} =
      Enum.flat_map_reduce(s.running, s.step_tokens, fn ref, left ->
        entry = Map.fetch!(s.requests, ref)
        prompt_left = entry.prompt_len - entry.fed
        if prompt_left <= 0, do: {[{ref, entry.gen, 1}], left}, else: {[], left}
      end)

    {prefill, _} =
      Enum.flat_map_reduce(s.running, s.step_tokens - length(plan), fn ref, left ->
        entry = Map.fetch!(s.requests, ref)
        prompt_left = entry.prompt_len - entry.fed
        take = min(prompt_left, left)
        if prompt_left > 0 and take > 0, do: {[{ref, entry.gen, take}], left - take}, else: {[], left}
      end)

    plan = plan ++ prefill

    requests =
      Enum.reduce(plan, s.requests, fn {ref, _, chunk}, acc ->
        Map.update!(acc, ref, &%{&1 | chunk: if(&1.prompt_len > &1.fed, do: chunk, else: 0)})
      end)

    server = self()
    gens = Enum.map(plan, &elem(&1, 1))
    chunks = Enum.map(plan, &elem(&1, 2))
    refs = Enum.map(plan, &elem(&1, 0))

    pid =
      spawn_link(fn ->
        results =
          case ExBurn.Native.llm_step(gens, chunks) do
            {:ok, each} -> Enum.zip(refs, each)
            {:error, err} -> Enum.map(refs, &{&1, {:error, err}})
          end

        send(server, {:stepped, self(), results})
      end)

    %{s | stepping: {pid, refs}, requests: requests}
  end

  defp warm_up(_model, []), do: {:ok, nil}
  defp warm_up(model, sizes), do: ExBurn.LLM.warm_up(model, batch_sizes: sizes)

  defp overloaded(why, details) do
    %Error{
      op: :llm_scheduler,
      reason: "overloaded: #{why}",
      details: Map.new([{:cause, :overloaded} | details])
    }
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

    max_concurrent = ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :max_concurrent, 32)

    %{
      group: opts[:group],
      max_concurrent: max_concurrent,
      warmup:
        ExBurn.Pretrained.WarmUp.sizes!(
          :llm_scheduler,
          opts[:warmup],
          Enum.to_list(1..max_concurrent),
          max_concurrent
        ),
      step_tokens: ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :step_tokens, 256),
      kv_memory: ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :kv_memory, 1024 * 1024 * 1024),
      max_queue:
        if(opts[:max_queue] == :infinity,
          do: :infinity,
          else: ExBurn.Tensor.Util.int_option!(:llm_scheduler, opts, :max_queue, 256)
        )
    }
  end

  defp fail!(reason, details), do: raise(Error, op: :llm_scheduler, reason: reason, details: details)
end
