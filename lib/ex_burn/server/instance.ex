defmodule ExBurn.Server.Instance do
  @moduledoc false
  # The first child of an `ExBurn.Server`: owns what the request processes share (the metrics
  # and catalog table, the in-flight counter, the draining flag) and publishes the instance's
  # configuration in :persistent_term for them, read without a message per request.

  use GenServer

  @in_flight 1
  @draining 2

  def start_link(config), do: GenServer.start_link(__MODULE__, config)

  @doc "The running instance's configuration (with its shared refs), or nil."
  def config(name), do: :persistent_term.get({ExBurn.Server, name}, nil)

  @doc "Marks a request in flight; false (nothing counted) when the server is draining."
  def enter(%{state: state}) do
    if :atomics.get(state, @draining) == 1 do
      false
    else
      :atomics.add(state, @in_flight, 1)
      true
    end
  end

  def leave(%{state: state}), do: :atomics.sub(state, @in_flight, 1)

  def in_flight(%{state: state}), do: :atomics.get(state, @in_flight)
  def draining?(%{state: state}), do: :atomics.get(state, @draining) == 1

  @doc "Refuses new requests from now on."
  def drain(%{state: state}), do: :atomics.put(state, @draining, 1)

  @doc "Accepts requests again (a listener that starts)."
  def resume(%{state: state}), do: :atomics.put(state, @draining, 0)

  @doc "Waits (up to `timeout` ms) until no request is in flight; true when none is."
  def await_idle(config, timeout) do
    deadline = System.monotonic_time(:millisecond) + timeout
    wait_idle(config, deadline)
  end

  defp wait_idle(config, deadline) do
    cond do
      in_flight(config) <= 0 ->
        true

      System.monotonic_time(:millisecond) >= deadline ->
        false

      true ->
        Process.sleep(20)
        wait_idle(config, deadline)
    end
  end

  @impl true
  def init(config) do
    Process.flag(:trap_exit, true)

    table = :ets.new(__MODULE__, [:set, :public, read_concurrency: true, write_concurrency: true])

    config =
      Map.merge(config, %{
        table: table,
        state: :atomics.new(2, signed: true),
        started_at: System.monotonic_time(:millisecond),
        started_unix: System.os_time(:second)
      })

    :persistent_term.put({ExBurn.Server, config.name}, config)
    {:ok, config}
  end

  @impl true
  def terminate(_reason, config) do
    # Only if no newer instance of the same name has replaced it.
    if config(config.name) == config, do: :persistent_term.erase({ExBurn.Server, config.name})
    :ok
  end
end
