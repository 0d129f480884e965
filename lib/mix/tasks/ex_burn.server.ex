defmodule Mix.Tasks.ExBurn.Server do
  @shortdoc "Runs the HTTP inference server (OpenAI-compatible and /api/v1) for a models directory"
  @moduledoc """
  Runs `ExBurn.Server` until the VM stops:

      mix ex_burn.server --port 8080 [--host 0.0.0.0] [--models DIR] [--device cpu] [--engine auto]
                         [--token SECRET] [--rate-limit 10] [--burst 20] [--preload all|id,id]
                         [--max-concurrent 16] [--warmup] [--replicas 2|cpu,cuda:0] [--body-limit BYTES]

  * `--port` - TCP port (default 8080; 0 picks a free one)
  * `--host` - address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)
  * `--models` - the models directory (default `ExBurn.Models.dir/1`: `EXBURN_MODELS_DIR`, config, `~/models`)
  * `--device`, `--engine` - how models load (`cpu`, `vulkan:0`, ...; `auto`, `burn`, `candle`)
  * `--token` - the bearer token clients must send (default `EXBURN_API_TOKEN`, then config; see `ExBurn.Server`)
  * `--rate-limit`, `--burst` - requests per second per client, and the bucket size
  * `--preload` - load these models (or `all`) at start instead of on first use
  * `--max-concurrent`, `--step-tokens`, `--kv-memory BYTES` - per LLM: generations in a
    batched step, tokens a step runs, KV cache bytes the running generations may reserve
    (`ExBurn.LLM.Scheduler`'s options and defaults)
  * `--warmup` - each LLM's scheduler runs every batch size once before it takes requests
    (`ExBurn.LLM.Scheduler`'s `:warmup`), and each embedding model batch sizes 1 and the
    server's batch size, as part of loading the model (with `--preload`, at start)
  * `--replicas` - copies of each LLM, each with its scheduler: a count (on `--device`) or a
    comma-separated list of devices; requests go to the least loaded (`ExBurn.Server`'s `:replicas`)
  * `--body-limit` - the largest request body in bytes (default 4 MiB)

  SIGTERM stops it gracefully: new requests get 503 and those in flight finish first.
  """
  use Mix.Task

  @switches [
    port: :integer,
    host: :string,
    models: :string,
    device: :string,
    engine: :string,
    token: :string,
    rate_limit: :float,
    burst: :float,
    preload: :string,
    max_concurrent: :integer,
    step_tokens: :integer,
    kv_memory: :integer,
    warmup: :boolean,
    replicas: :string,
    body_limit: :integer
  ]

  @impl true
  def run(args) do
    {opts, rest, invalid} = OptionParser.parse(args, strict: @switches)

    if rest != [] or invalid != [],
      do:
        Mix.raise(
          "unexpected arguments: #{inspect(rest ++ Enum.map(invalid, &elem(&1, 0)))}; see mix help ex_burn.server"
        )

    Mix.Task.run("app.start")

    server_opts = server_opts(opts)
    # Trapped, so a graceful stop (SIGTERM) is not reported as this task's crash.
    Process.flag(:trap_exit, true)
    {:ok, pid} = ExBurn.Server.start_link(server_opts)
    install_sigterm(ExBurn.Server)

    # what the server resolved (option, environment, config), not a second guess at it
    config = ExBurn.Server.Instance.config(ExBurn.Server)
    models = ExBurn.Models.list(dir: config.models_dir)

    Mix.shell().info("""
    ExBurn server listening on #{ExBurn.Server.url()}
      models (#{config.models_dir}): #{Enum.map_join(models, ", ", &"#{&1.name} (#{&1.kind})")}
      authentication: #{if config.token, do: "bearer token", else: "none"}
      OpenAI base URL: #{ExBurn.Server.url()}/v1
    """)

    unless iex_running?() do
      receive do
        {:EXIT, ^pid, :normal} -> Process.sleep(:infinity)
        {:EXIT, ^pid, reason} -> Mix.raise("the server stopped: #{inspect(reason)}")
      end
    end
  end

  defp server_opts(opts) do
    [
      port: Keyword.get(opts, :port, 8080),
      ip: Keyword.get(opts, :host, "127.0.0.1"),
      models_dir: opts[:models],
      device: opts[:device],
      engine: opts[:engine] && engine(opts[:engine]),
      token: opts[:token],
      rate_limit: opts[:rate_limit] && [per_second: opts[:rate_limit], burst: opts[:burst]],
      preload: preload(opts[:preload]),
      max_concurrent: opts[:max_concurrent],
      step_tokens: opts[:step_tokens],
      kv_memory: opts[:kv_memory],
      warmup: opts[:warmup],
      replicas: opts[:replicas] && replicas(opts[:replicas]),
      body_limit: opts[:body_limit]
    ]
    |> Enum.reject(fn {_, v} -> v == nil end)
  end

  defp engine(name) when name in ~w(auto burn candle), do: String.to_atom(name)
  defp engine(other), do: Mix.raise("--engine must be auto, burn or candle, got #{other}")

  defp replicas(spec) do
    case Integer.parse(spec) do
      {n, ""} -> n
      _ -> String.split(spec, ",", trim: true)
    end
  end

  defp preload(nil), do: nil
  defp preload("all"), do: :all
  defp preload(ids), do: String.split(ids, ",", trim: true)

  defp iex_running?, do: Code.ensure_loaded?(IEx) and IEx.started?()

  # SIGTERM drains the server before the VM stops (the default handler stops at once).
  defp install_sigterm(name) do
    :os.set_signal(:sigterm, :handle)
    :gen_event.swap_handler(:erl_signal_server, {:erl_signal_handler, []}, {__MODULE__.Signals, name})
  end

  defmodule Signals do
    @moduledoc false
    @behaviour :gen_event

    @impl true
    def init({name, _}), do: {:ok, name}
    def init(name), do: {:ok, name}

    @impl true
    def handle_event(:sigterm, name) do
      spawn(fn ->
        ExBurn.Server.stop(name)
        System.stop()
      end)

      {:ok, name}
    end

    def handle_event(_signal, name), do: {:ok, name}

    @impl true
    def handle_call(_request, name), do: {:ok, :ok, name}
  end
end
