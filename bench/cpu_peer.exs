# CPU peer benchmark: ExBurn (Burn flex CPU through the NIF) against PyTorch eager on
# the CPU with torch.set_num_threads(2), same cases, shapes and dtypes, in the same invocation.
#
#   MIX_ENV=test mix run bench/cpu_peer.exs                # every case
#   MIX_ENV=test mix run bench/cpu_peer.exs add_1M exp_1M  # only these cases
#   EXBURN_MATH=fast MIX_ENV=test mix run bench/cpu_peer.exs  # ExBurn in fast math mode
#
# The ExBurn cases run first, then `python3 bench/cpu_peer.py` (never both at once: they would
# share the cores). One line per case: ExBurn median, PyTorch median, ratio = ExBurn / PyTorch
# (< 1: ExBurn faster). The PyTorch side is skipped with a note when torch is not importable.
#
# Timing rule (both sides): two warm-up calls, then reps timed calls (reps chosen so the case runs
# about EXBURN_BENCH_TARGET_S seconds, default 0.5; at least 5, at most 200); the median is shown.
# Every ExBurn call reads one element back (to_binary(t, 1)) and deallocates its result, so the
# allocator can reuse the buffer as PyTorch's does when a result's refcount drops; the
# *_nodealloc rows leave the result to the garbage collector instead. The MLP epoch is timed once
# after a warm-up fit on 1024 samples (it takes seconds).
#
# max_1M_scalar is Nx.max(t, 0.0), eager ReLU, against torch.maximum with a 0-d zero (both
# propagate NaN).
#
# Softmax: ExBurn composes it (reduce_max, subtract, exp, sum, divide; there is no softmax op,
# nor in Nx, so Torchx runs the same five kernels): the "composed" row composes it on both sides
# (what an eager Nx program costs on either backend), the plain row compares the composition with
# PyTorch's one-kernel torch.softmax. Layer norm (no weights, eps 1e-5): "composed" rows compose it on
# both sides (mean, subtract, multiply, mean, add, rsqrt, multiply); the "fused" row compares the
# same ExBurn composition with torch.nn.functional.layer_norm; the *_defn rows (Nx only) compile
# the same compositions, against torch.softmax and layer_norm. take/sort/conv are not in
# ExBurn.Tensor's public API; they go through ExBurn.Native as the Nx backend does.
#
# Each case's row also gives the CPUs' FMA rate (GFLOP/s on all threads, bench/support/fma_probe.c)
# measured just before that case on each side: on a VM whose vCPUs share physical cores with other
# tenants it moves between runs and between the two sides of one row.
#
# The table, headed by the machine (bench/support/machine.exs: the CPU and its ISA flags), is also
# written to EXBURN_BENCH_OUT (default bench/results/cpu_peer_<machine>_<date>.txt; "-" for none).
Code.require_file("support/machine.exs", __DIR__)
alias ExBurn.{Model, Native}
alias ExBurn.Tensor, as: T

target_s = String.to_float(System.get_env("EXBURN_BENCH_TARGET_S") || "0.5")
selected = System.argv()
want? = fn name -> selected == [] or name in selected end

loadavg = &Bench.Machine.loadavg/0

fma = fn ->
  case Bench.Machine.fma_rate() do
    nil -> nil
    gflops -> round(gflops)
  end
end

median = fn xs ->
  s = Enum.sort(xs)
  n = length(s)
  if rem(n, 2) == 1, do: Enum.at(s, div(n, 2)), else: (Enum.at(s, div(n, 2) - 1) + Enum.at(s, div(n, 2))) / 2
end

bench = fn fun ->
  fun.()
  {one, _} = :timer.tc(fun)
  reps = (target_s * 1.0e6 / max(one, 1)) |> trunc() |> min(200) |> max(5)
  times = for _ <- 1..reps, do: elem(:timer.tc(fun), 0)
  {median.(times) * 1.0, reps}
end

consume = fn t ->
  T.to_binary(t, 1)
  T.deallocate(t)
end

consume_keep = fn t -> T.to_binary(t, 1) end

sin_data = fn shape, type ->
  T.iota(shape, :f32) |> T.multiply(0.37) |> T.sin() |> T.as_type(type)
end

scaled_iota = fn {r, c} = shape -> T.iota(shape, :f32) |> T.divide(r * c) end
wrap = &ExBurn.Tensor.Util.wrap/1

softmax = fn x ->
  m = T.reduce_max(x, axes: [1], keep_axes: true)
  e = T.exp(T.subtract(x, m))
  T.divide(e, T.sum(e, axes: [1], keep_axes: true))
end

layer_norm = fn x ->
  mu = T.mean(x, axes: [1], keep_axes: true)
  c = T.subtract(x, mu)
  var = T.mean(T.multiply(c, c), axes: [1], keep_axes: true)
  T.multiply(c, T.rsqrt(T.add(var, 1.0e-5)))
end

start_load = loadavg.()
start_time = DateTime.utc_now() |> DateTime.truncate(:second)
n = 1_000_000
f32 = {:f, 32}

small_a = sin_data.({2, 10}, f32)
small_b = T.ones({2, 10}, :f32)
a = sin_data.({n}, f32)
b = T.ones({n}, :f32)
m = sin_data.({1000, 1000}, f32)
sq = sin_data.({1024, 1024}, f32)
idx = T.iota({n}, {:s, 64}) |> T.multiply(7919) |> T.remainder(n)
mats = Map.new([256, 1024, 2048], fn k -> {k, {scaled_iota.({k, k}), T.ones({k, k}, :f32)}} end)
bf = {T.as_type(scaled_iota.({1024, 1024}), {:bf, 16}), T.ones({1024, 1024}, {:bf, 16})}
cx = sin_data.({8, 32, 32, 32}, f32)
ck = sin_data.({64, 32, 3, 3}, f32) |> T.multiply(0.1)
conv_spec = {[1, 1], [{1, 1}, {1, 1}], [1, 1], [1, 1], 1, 1, [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]}

cases =
  [
    {"add_2x10", fn -> T.add(small_a, small_b) |> consume.() end},
    {"add_2x10_nodealloc", fn -> T.add(small_a, small_b) |> consume_keep.() end},
    {"add_1M", fn -> T.add(a, b) |> consume.() end},
    {"add_1M_nodealloc", fn -> T.add(a, b) |> consume_keep.() end},
    {"exp_1M", fn -> T.exp(a) |> consume.() end},
    {"max_1M_scalar", fn -> T.max(a, 0.0) |> consume.() end},
    {"sigmoid_1M", fn -> T.sigmoid(a) |> consume.() end},
    {"tanh_1M", fn -> T.tanh(a) |> consume.() end},
    {"erf_1M", fn -> T.erf(a) |> consume.() end},
    {"sum_1M_all", fn -> T.sum(a) |> consume.() end},
    {"sum_1000x1000_axis1", fn -> T.sum(m, axes: [1]) |> consume.() end},
    {"argmax_1M", fn -> T.argmax(a) |> consume.() end},
    {"softmax_1024x1024", fn -> softmax.(sq) |> consume.() end},
    {"softmax_composed_1024x1024", fn -> softmax.(sq) |> consume.() end},
    {"layer_norm_composed_1024x1024", fn -> layer_norm.(sq) |> consume.() end},
    {"layer_norm_fused_1024x1024", fn -> layer_norm.(sq) |> consume.() end},
    {"take_1M", fn -> Native.take(a.ref, idx.ref, 0) |> wrap.() |> consume.() end},
    {"sort_1M", fn -> Native.sort(a.ref, 0, false, a.type) |> wrap.() |> consume.() end}
  ] ++
    for k <- [256, 1024, 2048] do
      {x, w} = mats[k]
      {"dot_#{k}", fn -> T.dot(x, w) |> consume.() end}
    end ++
    [
      {"dot_bf16_1024", fn -> T.dot(elem(bf, 0), elem(bf, 1)) |> consume.() end},
      {"conv2d_8x32x32x32_64x3x3",
       fn -> Native.conv(cx.ref, ck.ref, conv_spec, f32) |> wrap.() |> consume.() end}
    ]

# With Nx loaded: the same softmax and layer norm written with Nx and compiled (`compiler:
# ExBurn`, the path of Axon models), against PyTorch's fused kernels. The compiler runs the
# softmax composition as one kernel and frees each intermediate after its last use.
cases =
  if Code.ensure_loaded?(Nx) do
    nx_sq = Nx.iota({1024, 1024}, type: :f32, backend: ExBurn.Backend) |> Nx.multiply(0.37) |> Nx.sin()

    # compiled functions, as defn modules and Axon models are: a script's own closures are run
    # by erl_eval, whose closures carry their code, which every jit call hashes into its key
    defmodule CpuPeer.NxFns do
      def softmax(x) do
        e = Nx.exp(Nx.subtract(x, Nx.reduce_max(x, axes: [1], keep_axes: true)))
        Nx.divide(e, Nx.sum(e, axes: [1], keep_axes: true))
      end

      def layer_norm(x) do
        c = Nx.subtract(x, Nx.mean(x, axes: [1], keep_axes: true))
        var = Nx.mean(Nx.multiply(c, c), axes: [1], keep_axes: true)
        Nx.multiply(c, Nx.rsqrt(Nx.add(var, 1.0e-5)))
      end
    end

    consume_nx = fn t ->
      Nx.to_binary(t, limit: 1)
      Nx.backend_deallocate(t)
    end

    jit = fn f -> Nx.Defn.jit(f, compiler: ExBurn) end
    {sm, ln} = {jit.(&CpuPeer.NxFns.softmax/1), jit.(&CpuPeer.NxFns.layer_norm/1)}

    cases ++
      [
        {"softmax_1024x1024_defn", fn -> sm.(nx_sq) |> consume_nx.() end},
        {"layer_norm_1024x1024_defn", fn -> ln.(nx_sq) |> consume_nx.() end}
      ]
  else
    cases
  end

IO.puts(:stderr, "ExBurn cases (device #{inspect(ExBurn.default_device())}, math mode #{ExBurn.math()})...")

exburn =
  for {name, fun} <- cases, want?.(name), into: %{} do
    rate = fma.()
    {us, reps} = bench.(fun)
    IO.puts(:stderr, "  #{name}: #{Float.round(us, 1)} µs (#{reps} reps)")
    {name, {us, reps, rate}}
  end

# MLP 784-256-128-10, the data of bench/mlp_epoch.exs.
mlp_names = ["mlp_epoch", "predict_b1", "predict_b1024"]

exburn =
  if Enum.any?(mlp_names, want?) do
    features = 784
    classes = 10
    samples = 60_000
    x = sin_data.({samples, features}, f32)
    y = x |> T.slice([0, 0], [samples, classes]) |> T.argmax(axis: 1) |> T.as_type({:s, 64})

    model =
      Model.input({nil, features})
      |> Model.dense(256, activation: :relu)
      |> Model.dense(128, activation: :relu)
      |> Model.dense(classes)
      |> Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 1.0e-3, device: {:cpu, 0})

    acc =
      if want?.("mlp_epoch") do
        warm = T.slice(x, [0, 0], [1024, features])
        Model.fit(model, {warm, T.slice(y, [0], [1024])}, epochs: 1, batch_size: 128)

        rate = fma.()

        {us, {_m, [%{loss: loss}]}} =
          :timer.tc(fn -> Model.fit_with_history(model, {x, y}, epochs: 1, batch_size: 128) end)

        IO.puts(:stderr, "  mlp_epoch: #{Float.round(us / 1.0e6, 2)} s, loss #{Float.round(loss, 4)}")
        Map.put(exburn, "mlp_epoch", {us * 1.0, 1, rate})
      else
        exburn
      end

    for {name, rows} <- [{"predict_b1", 1}, {"predict_b1024", 1024}], want?.(name), into: acc do
      xb = T.slice(x, [0, 0], [rows, features])
      rate = fma.()
      {us, reps} = bench.(fn -> Model.predict(model, xb, batch_size: 1024) |> consume.() end)
      IO.puts(:stderr, "  #{name}: #{Float.round(us, 1)} µs (#{reps} reps)")
      {name, {us, reps, rate}}
    end
  else
    exburn
  end

mid_load = loadavg.()
IO.puts(:stderr, "PyTorch cases...")
script = Path.join(__DIR__, "cpu_peer.py")

{torch, torch_note} =
  case System.cmd("python3", [script | selected],
         stderr_to_stdout: true,
         env: [{"EXBURN_FMA_PROBE", Bench.Machine.fma_probe() || ""}]
       ) do
    {out, 0} ->
      lines = String.split(out, "\n", trim: true)

      case Enum.find(lines, &String.starts_with?(&1, "SKIP\t")) do
        nil ->
          info =
            Enum.find_value(lines, "", fn l ->
              match?("INFO\t" <> _, l) && String.trim_leading(l, "INFO\t")
            end)

          rows =
            for "CASE\t" <> rest <- lines, into: %{} do
              [name, us, reps | extra] = String.split(rest, "\t")

              rate =
                Enum.find_value(extra, fn f ->
                  match?("fma=" <> _, f) && String.to_integer(String.trim_leading(f, "fma="))
                end)

              {name, {String.to_float(us), String.to_integer(reps), rate}}
            end

          {rows, info}

        skip ->
          {%{}, "PyTorch peer skipped: " <> String.trim_leading(skip, "SKIP\t")}
      end

    {out, status} ->
      {%{}, "PyTorch peer failed (exit #{status}): #{out |> String.slice(-400, 400)}"}
  end

end_load = loadavg.()

fmt = fn
  nil -> "-"
  us when us >= 1.0e6 -> :erlang.float_to_binary(us / 1.0e6, decimals: 2) <> " s"
  us when us >= 1.0e3 -> :erlang.float_to_binary(us / 1.0e3, decimals: 2) <> " ms"
  us -> :erlang.float_to_binary(us, decimals: 1) <> " µs"
end

names = Enum.map(cases, &elem(&1, 0)) ++ mlp_names

rows =
  for name <- names, Map.has_key?(exburn, name) do
    {eus, ereps, erate} = exburn[name]
    {tus, treps, trate} = Map.get(torch, name, {nil, nil, nil})
    ratio = if tus, do: :erlang.float_to_binary(eus / tus, decimals: 2), else: "-"
    tcol = if tus, do: "#{fmt.(tus)} (#{treps})", else: "-"

    String.pad_trailing(name, 32) <>
      String.pad_leading("#{fmt.(eus)} (#{ereps})", 18) <>
      String.pad_leading(tcol, 18) <>
      String.pad_leading(ratio, 9) <> String.pad_leading("#{erate || "-"}/#{trate || "-"}", 10)
  end

report =
  [
    "CPU peer benchmark #{start_time}, #{System.schedulers_online()} schedulers, ExBurn math mode " <>
      "#{ExBurn.math()}, #{torch_note}",
    Bench.Machine.line(),
    "ratio = ExBurn / PyTorch (< 1: ExBurn faster); medians, reps in parentheses; " <>
      "FMA = GFLOP/s the CPUs delivered just before the case, ExBurn's/PyTorch's",
    "load average at start: #{start_load}; after ExBurn: #{mid_load}; at end: #{end_load}",
    "",
    String.pad_trailing("case", 32) <>
      String.pad_leading("ExBurn", 18) <>
      String.pad_leading("PyTorch", 18) <> String.pad_leading("ratio", 9) <> String.pad_leading("FMA", 10)
  ] ++ rows

Enum.each(report, &IO.puts/1)
Bench.Machine.write_results(Bench.Machine.results_file("cpu_peer"), report)
