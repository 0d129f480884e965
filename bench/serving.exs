# Serving throughput and latency: 64 concurrent clients send single-sample requests to an MLP,
# batched (batch_size 32) and unbatched (batch_size 1), in the same run.
#
#   mix run bench/serving.exs [requests_per_client] [clients]
#
# Always measures ExBurn.Serving.Batcher (no Nx needed); with Nx loaded also the Nx.Serving path
# (ExBurn.Serving.supervise/2 + batched_run/2). Latency is per request, from the client's call
# to its reply; req/s is all requests over the wall time of the whole run.
alias ExBurn.{Model, Tensor}
alias ExBurn.Serving.Batcher

{per_client, clients} =
  case System.argv() do
    [n, c | _] -> {String.to_integer(n), String.to_integer(c)}
    [n] -> {String.to_integer(n), 64}
    [] -> {50, 64}
  end

features = 64

model =
  Model.input({nil, features})
  |> Model.dense(256, activation: :relu)
  |> Model.dense(256, activation: :relu)
  |> Model.dense(10)
  |> Model.compile(seed: 1)

# One sample per client and request, made up front so the clock only sees serving.
samples =
  for c <- 1..clients,
      do:
        Tensor.tensor([for(j <- 1..features, do: :math.sin(c * j) * 1.0)], type: :f32)
        |> Tensor.reshape({features})

measure = fn label, call ->
  # warm-up: one request per client
  samples |> Enum.map(&Task.async(fn -> call.(&1) end)) |> Enum.each(&Task.await(&1, 60_000))

  t0 = System.monotonic_time()

  latencies =
    samples
    |> Enum.map(fn sample ->
      Task.async(fn ->
        for _ <- 1..per_client do
          s = System.monotonic_time()
          call.(sample)
          System.monotonic_time() - s
        end
      end)
    end)
    |> Enum.flat_map(&Task.await(&1, 600_000))
    |> Enum.map(&System.convert_time_unit(&1, :native, :microsecond))
    |> Enum.sort()

  wall_s = System.convert_time_unit(System.monotonic_time() - t0, :native, :microsecond) / 1.0e6
  n = length(latencies)
  pct = fn p -> Enum.at(latencies, min(n - 1, trunc(p * n))) / 1000 end
  rps = n / wall_s

  stats = :io_lib.format("~8.1f req/s   p50 ~7.2f ms   p99 ~7.2f ms", [rps, pct.(0.50), pct.(0.99)])
  IO.puts(String.pad_trailing(label, 34) <> to_string(stats))

  rps
end

IO.puts(
  "MLP #{features}-256-256-10 (f32), #{clients} clients x #{per_client} requests, device #{inspect(model.device)}\n"
)

server_run = fn batch_size ->
  {:ok, pid} = Server.start_link(model, batch_size: batch_size, batch_timeout: 2, max_queue: :infinity)
  rps = measure.("Server batch_size #{batch_size}", fn x -> {:ok, _} = Server.run(pid, x, 60_000) end)
  GenServer.stop(pid)
  rps
end

batched = server_run.(32)
single = server_run.(1)
IO.puts("Server batched / batch_size 1: #{Float.round(batched / single, 2)}x\n")

if Code.ensure_loaded?(ExBurn.Serving.Nx) do
  nx_run = fn batch_size ->
    name = :"bench_serving_#{batch_size}"
    {:ok, pid} = ExBurn.Serving.supervise(model, name: name, batch_size: batch_size, batch_timeout: 2)
    # Nx.Serving clients send Nx tensors; converting the samples is not part of the timing.
    nx_samples = Map.new(samples, fn s -> {s, Nx.from_binary(Tensor.to_binary(s), {:f, 32})} end)

    rps =
      measure.("Nx.Serving batch_size #{batch_size}", fn x ->
        ExBurn.Serving.batched_run(name, nx_samples[x])
      end)

    Process.unlink(pid)
    Supervisor.stop(pid)
    rps
  end

  nx_batched = nx_run.(32)
  nx_single = nx_run.(1)
  IO.puts("Nx.Serving batched / batch_size 1: #{Float.round(nx_batched / nx_single, 2)}x")
else
  IO.puts("(Nx is not loaded: the Nx.Serving path is skipped)")
end
