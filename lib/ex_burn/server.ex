defmodule ExBurn.Server do
  @moduledoc """
  An HTTP inference server for the models of a models directory: embeddings and text
  generation, with an OpenAI-compatible API (so OpenAI clients, LangChain and friends work
  against it as they do against llama.cpp's server, Ollama or vLLM) and ExBurn's own `/api/v1`
  API. No Hex package needed: HTTP is OTP's `:httpd`, JSON is `ExBurn.JSON`.

      # from a shell
      mix ex_burn.server --port 8080 --models ~/models

      # in a supervision tree
      children = [{ExBurn.Server, port: 8080, models_dir: "~/models", token: "secret"}]

  Routes (`guides/server.md` has request and response examples):

    * `GET /api/v1/health`, `GET /api/v1/hardware`, `GET /api/v1/models`,
      `POST /api/v1/embeddings`, `POST /api/v1/llm/inference`, `POST /api/v1/llm/stream` (SSE)
    * OpenAI: `GET /v1/models`, `GET /v1/models/:id`, `POST /v1/embeddings`,
      `POST /v1/completions`, `POST /v1/chat/completions` (`"stream": true` for SSE)
    * `GET /metrics` - Prometheus text: requests by route and status, latency sums and counts

  Model ids are the directory names of the models directory (`ExBurn.Models.list/1`). Models
  load on their first request (or at start with `:preload`); each embedding model is served by
  an `ExBurn.Serving.Batcher` (concurrent requests share batches) and each LLM by an
  `ExBurn.LLM.Scheduler` (generations run together in batched steps: continuous batching). A client that hangs up
  mid-stream stops its generation.

  ## Options

    * `:name` - the instance name (default `ExBurn.Server`); several instances need distinct names
    * `:port` - TCP port (default 8080; 0 picks a free one, see `port/1`); `false` starts no
      listener (for `ExBurn.Server.Plug`)
    * `:ip` - the address to listen on (default `{127, 0, 0, 1}`; `{0, 0, 0, 0}` for all)
    * `:models_dir` - the models directory (default `ExBurn.Models.dir/1`)
    * `:engine`, `:device` - how models load (see `ExBurn.Embedding.load/2`)
    * `:preload` - model ids to load at start, or `:all` (default `[]`: load on first use)
    * `:token` - the bearer token clients must send (`Authorization: Bearer <token>`); default
      the `EXBURN_API_TOKEN` environment variable, then `config :ex_burn, api_token: ...`
      (`ExBurn.Env`); `nil` or `""` means no authentication. `/api/v1/health` is always open.
    * `:rate_limit` - `[per_second: r, burst: b]`: a token bucket per client (its bearer token
      when it sends one, else its IP address) refilled at `r` requests per second and holding
      `b` (default `2 * r`); over the limit the answer is 429 with `Retry-After`. Default off.
    * `:body_limit` - the largest request body in bytes (default 4 MiB); larger ones get 413
    * `:max_connections` - concurrent connections (default 1024)
    * `:max_inputs` - the most texts in one embedding request (default 2048)
    * `:default_max_tokens` - generation length when a request gives none (default 256)
    * `:batch_size`, `:batch_timeout` - for the embedding servers (defaults 32 and 5 ms)
    * `:max_concurrent`, `:step_tokens`, `:kv_memory` - per LLM: generations in a batched step,
      tokens a step runs and bytes of KV cache the running generations may reserve (defaults
      those of `ExBurn.LLM.Scheduler`)
    * `:warmup` - per LLM: its scheduler's `:warmup` (every batch size of a step runs once
      before the scheduler takes requests); per embedding model: `ExBurn.Embedding.warm_up/2`
      at batch sizes 1 and `:batch_size`. Part of loading the model: at start with `:preload`,
      else on the model's first request. Default `false`
    * `:max_queue` - generations waiting per LLM before requests get 503 (default 256)
    * `:replicas` - LLM replicas: a count (that many copies of each LLM on `:device`) or a list
      of devices (one copy on each, e.g. `[{:cuda, 0}, {:cuda, 1}]`); each copy has its own
      scheduler (with the options above), and requests go to the least loaded one (see
      Replicas in `ExBurn.LLM.Scheduler`). Default: one, not in a group
    * `:shutdown_timeout` - ms a stopping server waits for in-flight requests (default 30 000)

  ## Shutdown

  When the server stops (its supervisor stops it, or `stop/1`), it first refuses new requests
  with 503, waits up to `:shutdown_timeout` for the requests in flight (streams included) to
  finish, then closes the listener and unloads the models.

  ## Telemetry

  When `:telemetry` is loaded, each request emits `[:ex_burn, :server, :request]` with
  measurements `%{duration: native_time}` and metadata `%{server: name, method: m, route: r,
  status: s, aborted: boolean}` (`route` is the route's pattern, such as
  `"/v1/chat/completions"`; `aborted` is true when the client went away mid-response).
  """

  use Supervisor

  alias ExBurn.Server.{Instance, Models}

  @options [
    :name,
    :port,
    :ip,
    :models_dir,
    :engine,
    :device,
    :preload,
    :token,
    :rate_limit,
    :body_limit,
    :max_connections,
    :max_inputs,
    :default_max_tokens,
    :batch_size,
    :batch_timeout,
    :max_concurrent,
    :step_tokens,
    :kv_memory,
    :warmup,
    :max_queue,
    :replicas,
    :shutdown_timeout
  ]

  @doc "Starts a server (see the moduledoc for the options)."
  def start_link(opts \\ []) do
    config = config!(opts)
    Supervisor.start_link(__MODULE__, config, name: config.name)
  end

  @doc "A child spec; the id is the instance name, so several servers can share a supervisor."
  def child_spec(opts) do
    opts = keyword!(opts)
    name = Keyword.get(opts, :name, __MODULE__)
    # The listener drains in-flight requests on shutdown, so the tree gets that long to stop.
    timeout = Keyword.get(opts, :shutdown_timeout, 30_000) + 5_000
    %{id: name, start: {__MODULE__, :start_link, [opts]}, type: :supervisor, shutdown: timeout}
  end

  @doc """
  Stops the server gracefully (see Shutdown in the moduledoc). The supervisor exits `:normal`,
  so a process linked to it (the one that called `start_link/1`) is not taken down with it.
  """
  def stop(name \\ __MODULE__) do
    Supervisor.stop(running!(name), :normal, :infinity)
  catch
    :exit, reason -> fail!("the server is not running", %{name: name, exit: reason, cause: :down})
  end

  @doc "The TCP port the server listens on (useful with `port: 0`), or nil without a listener."
  def port(name \\ __MODULE__) do
    case Supervisor.which_children(running!(name)) |> List.keyfind(ExBurn.Server.Httpd, 0) do
      {_, pid, _, _} when is_pid(pid) -> ExBurn.Server.Httpd.port(pid)
      _ -> nil
    end
  end

  @doc "The base URL of a running server, such as `\"http://127.0.0.1:8080\"`."
  def url(name \\ __MODULE__) do
    config = Instance.config(running!(name))
    host = config.ip |> :inet.ntoa() |> to_string()
    host = if String.contains?(host, ":"), do: "[#{host}]", else: host
    "http://#{host}:#{port(name)}"
  end

  @doc "The ids of the models loaded so far."
  def loaded_models(name \\ __MODULE__), do: Models.loaded(running!(name))

  # The instance name of a running server, or an ExBurn.Error.
  defp running!(name) when is_atom(name) do
    if Instance.config(name) && Process.whereis(name),
      do: name,
      else: fail!("the server is not running", %{name: name, cause: :down})
  end

  defp running!(other), do: fail!("a server is named by an atom", %{got: other})

  defp keyword!(opts) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: opts,
      else: fail!("options must be a keyword list", %{got: opts})
  end

  @impl true
  def init(config) do
    children =
      [
        {Instance, config},
        {Registry, keys: :unique, name: config.registry},
        {DynamicSupervisor,
         strategy: :one_for_one, name: config.models_sup, max_restarts: 10, max_seconds: 60},
        config.rate_limit && {ExBurn.Server.RateLimiter, config},
        config.preload != [] &&
          Supervisor.child_spec({Task, fn -> Models.preload(config.name, config.preload) end},
            id: :preload,
            restart: :temporary
          ),
        config.port != false && {ExBurn.Server.Httpd, config}
      ]
      |> Enum.filter(& &1)

    Supervisor.init(children, strategy: :rest_for_one)
  end

  @doc false
  def config!(opts) do
    opts = keyword!(opts)

    for {key, _} <- opts,
        key not in @options,
        do: fail!("unknown option #{inspect(key)}", %{option: key, allowed: @options})

    name = Keyword.get(opts, :name, __MODULE__)

    %{
      name: name,
      port: port!(Keyword.get(opts, :port, 8080)),
      ip: ip!(Keyword.get(opts, :ip, {127, 0, 0, 1})),
      models_dir: ExBurn.Models.dir(dir: opts[:models_dir]),
      load_opts: Keyword.take(opts, [:engine, :device]),
      preload: preload!(Keyword.get(opts, :preload, [])),
      token: token(opts),
      rate_limit: rate_limit!(opts[:rate_limit]),
      body_limit: ExBurn.Tensor.Util.int_option!(:server, opts, :body_limit, 4 * 1024 * 1024),
      max_connections: ExBurn.Tensor.Util.int_option!(:server, opts, :max_connections, 1024),
      max_inputs: ExBurn.Tensor.Util.int_option!(:server, opts, :max_inputs, 2048),
      default_max_tokens: ExBurn.Tensor.Util.int_option!(:server, opts, :default_max_tokens, 256),
      batch_size: ExBurn.Tensor.Util.int_option!(:server, opts, :batch_size, 32),
      batch_timeout: ExBurn.Tensor.Util.int_option!(:server, opts, :batch_timeout, 5, 0),
      scheduler: Keyword.take(opts, [:max_concurrent, :step_tokens, :kv_memory, :warmup]),
      max_queue: ExBurn.Tensor.Util.int_option!(:server, opts, :max_queue, 256),
      replicas: replicas!(opts[:replicas]),
      shutdown_timeout: ExBurn.Tensor.Util.int_option!(:server, opts, :shutdown_timeout, 30_000, 0),
      registry: Module.concat(name, Registry),
      models_sup: Module.concat(name, Models),
      limiter: Module.concat(name, RateLimiter)
    }
  end

  defp token(opts) do
    # a given nil or "" turns authentication off whatever the environment says
    token =
      case Keyword.fetch(opts, :token) do
        {:ok, given} -> given
        :error -> ExBurn.Env.get(:api_token)
      end

    case token do
      nil -> nil
      "" -> nil
      t when is_binary(t) -> t
      other -> fail!(":token must be a string or nil", %{got: other})
    end
  end

  defp port!(false), do: false
  defp port!(p) when is_integer(p) and p >= 0 and p < 65_536, do: p
  defp port!(other), do: fail!(":port must be 0..65535 or false", %{got: other})

  defp ip!(ip) when is_tuple(ip), do: ip

  defp ip!(ip) when is_binary(ip) do
    case :inet.parse_address(String.to_charlist(ip)) do
      {:ok, addr} -> addr
      {:error, _} -> fail!(":ip must be an address", %{got: ip})
    end
  end

  defp ip!(other), do: fail!(":ip must be an address", %{got: other})

  defp preload!(:all), do: :all
  defp preload!(ids) when is_list(ids), do: Enum.map(ids, &to_string/1)
  defp preload!(other), do: fail!(":preload must be :all or a list of model ids", %{got: other})

  # The load options of each replica: nil (one scheduler, not in a group) or a list.
  defp replicas!(nil), do: nil
  defp replicas!(n) when is_integer(n) and n > 0, do: List.duplicate([], n)

  defp replicas!([_ | _] = devices),
    do: Enum.map(devices, fn device -> [device: ExBurn.Device.resolve(device)] end)

  defp replicas!(other),
    do: fail!(":replicas must be a positive integer or a non-empty list of devices", %{got: other})

  defp rate_limit!(nil), do: nil
  defp rate_limit!(false), do: nil

  defp rate_limit!(opts) when is_list(opts) do
    case {opts[:per_second], Keyword.get(opts, :burst)} do
      {r, b} when is_number(r) and r > 0 and (b == nil or (is_number(b) and b >= 1)) ->
        %{per_second: r / 1, burst: (b || max(2 * r, 1)) / 1}

      _ ->
        fail!(":rate_limit must be [per_second: r, burst: b] with r > 0 and b >= 1", %{got: opts})
    end
  end

  defp rate_limit!(other), do: fail!(":rate_limit must be a keyword list", %{got: other})

  defp fail!(reason, details), do: raise(ExBurn.Error, op: :server, reason: reason, details: details)
end
