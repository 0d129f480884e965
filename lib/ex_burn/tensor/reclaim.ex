defmodule ExBurn.Tensor.Reclaim do
  @moduledoc """
  Frees the memory of dead tensors without waiting for the BEAM to notice it.

  A tensor's memory lives on the native side; the process heap holds only a small reference to
  it. The BEAM collects a process when its *heap* fills, so a loop that drops a 64 MB tensor per
  iteration can leave gigabytes of dead tensors waiting for a collection that a few words of
  references never trigger. The allocator then hands out fresh memory every time, which costs
  more than the work: through the NIF, an add of 1M f32 left to the collector took 1.42 ms
  against 0.12 ms when each result was freed at once (bench/cpu_peer.exs, `add_1M_nodealloc`
  against `add_1M`, 2 cores); with the collection below it takes 0.19-0.29 ms. On the H100 an
  add of 16M f32 through the NIF went from 1.27 ms to 0.17 ms (bench/cuda_precision.exs).

  So each process counts the bytes of the tensors it receives from the native side, and after
  `gc_after_bytes` of them (default #{div(64 * 1024 * 1024, 1024 * 1024)} MiB) it collects its
  own garbage: the dead references go, and their memory returns to the allocator or the device's
  pool for the next results. A collection of an ordinary process takes microseconds; processes
  with very large heaps pay more and may raise the threshold or turn it off:

      config :ex_burn, gc_after_bytes: 256 * 1024 * 1024   # or :infinity (never)

  `ExBurn.Tensor.deallocate/1` (`Nx.backend_deallocate/1`) still frees one tensor at once.
  """

  @key :ex_burn_unreclaimed_bytes
  @default 64 * 1024 * 1024

  @doc "The configured threshold in bytes, or `:infinity`."
  def threshold do
    case Application.get_env(:ex_burn, :gc_after_bytes, @default) do
      n when is_integer(n) and n > 0 ->
        n

      :infinity ->
        :infinity

      other ->
        raise ExBurn.Error,
          op: :configure,
          reason: "gc_after_bytes must be a positive integer or :infinity",
          details: %{gc_after_bytes: other}
    end
  end

  @doc """
  Records a tensor of `shape` (a tuple) and `type` that the calling process just received;
  collects the process's garbage once the bytes since its last collection reach the threshold.
  Returns `:collected` or `:ok`.
  """
  def note(shape, {_, bits}) do
    bytes = max(div(Enum.reduce(Tuple.to_list(shape), bits, &(&1 * &2)), 8), 1)

    case threshold() do
      :infinity ->
        :ok

      limit ->
        total = (Process.get(@key) || 0) + bytes

        if total >= limit do
          Process.put(@key, 0)
          :erlang.garbage_collect()
          :collected
        else
          Process.put(@key, total)
          :ok
        end
    end
  end
end
