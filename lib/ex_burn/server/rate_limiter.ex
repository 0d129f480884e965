defmodule ExBurn.Server.RateLimiter do
  @moduledoc false
  # Token buckets, one per client key: each holds up to `burst` tokens, refills at `per_second`
  # tokens a second, and a request takes one. One process decides, so concurrent requests of
  # one client cannot overdraw; buckets idle long enough to be full again are forgotten.

  use GenServer

  @sweep_ms 60_000

  def start_link(config), do: GenServer.start_link(__MODULE__, config.rate_limit, name: config.limiter)

  @doc "Takes a token for `key`: `:ok`, or `{:error, retry_after_seconds}`."
  def take(config, key), do: GenServer.call(config.limiter, {:take, key})

  @impl true
  def init(limit) do
    Process.send_after(self(), :sweep, @sweep_ms)
    {:ok, %{limit: limit, buckets: %{}}}
  end

  @impl true
  def handle_call({:take, key}, _from, %{limit: %{per_second: rate, burst: burst}} = s) do
    now = System.monotonic_time(:millisecond)

    tokens =
      case Map.get(s.buckets, key) do
        nil -> burst
        {tokens, last} -> min(burst, tokens + (now - last) * rate / 1000)
      end

    if tokens >= 1 do
      {:reply, :ok, put_in(s.buckets[key], {tokens - 1, now})}
    else
      retry = max(1, ceil((1 - tokens) / rate))
      {:reply, {:error, retry}, put_in(s.buckets[key], {tokens, now})}
    end
  end

  @impl true
  def handle_info(:sweep, %{limit: %{per_second: rate, burst: burst}} = s) do
    now = System.monotonic_time(:millisecond)
    full_after = burst / rate * 1000
    buckets = s.buckets |> Enum.reject(fn {_, {_, last}} -> now - last > full_after end) |> Map.new()
    Process.send_after(self(), :sweep, @sweep_ms)
    {:noreply, %{s | buckets: buckets}}
  end
end
