defmodule ExBurn.Tensor.Reclaim do
  @moduledoc """
  Frees the memory of dead tensors without waiting for the BEAM to notice it.

  A tensor's memory lives on the native side; the process heap holds only a small reference to
  it. The BEAM collects a process when its *heap* fills, so a loop that drops a 64 MB tensor per
  iteration can leave gigabytes of dead tensors waiting for a collection that a few words of
  references never trigger. The allocator then hands out fresh memory every time, which costs
  more than the work, on the CPU and on GPUs alike (guides/backend.md has the timings).

  So each process counts the bytes of the tensors it receives from the native side and collects
  its own garbage once they reach its limit: the dead references go, and their memory returns to
  the allocator or the device's pool for the next results. The limit is `gc_after_bytes`
  (default #{div(8 * 1024 * 1024, 1024 * 1024)} MiB), raised to #{64} times the process's heap for
  processes with large heaps (a collection copies the heap, so theirs cost more) but not beyond
  #{div(256 * 1024 * 1024, 1024 * 1024)} MiB (or `gc_after_bytes` where that is larger).
  Why so low: on the CPU, results written into memory that was just freed are still in the
  cache, so composed ops whose intermediates are left to the collector (a layer norm, say) run
  markedly faster with a small limit than with one past the cache's size.
  A collection of an ordinary process takes microseconds; set the floor higher, or turn it off:

      config :ex_burn, gc_after_bytes: 256 * 1024 * 1024   # or :infinity (never)

  `ExBurn.Tensor.deallocate/1` (`Nx.backend_deallocate/1`) still frees one tensor at once.
  """

  @key :ex_burn_unreclaimed_bytes
  @default 8 * 1024 * 1024
  # the heap rule: see the moduledoc
  @heap_factor 64
  @cap 256 * 1024 * 1024

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
  collects the process's garbage once the bytes since its last collection reach its limit (see
  the moduledoc). Returns `:collected` or `:ok`.
  """
  def note(shape, {_, bits}) do
    bytes = max(div(Enum.reduce(Tuple.to_list(shape), bits, &(&1 * &2)), 8), 1)

    case threshold() do
      :infinity ->
        :ok

      floor ->
        total = (Process.get(@key) || 0) + bytes

        if total >= floor and total >= limit(floor) do
          Process.put(@key, 0)
          :erlang.garbage_collect()
          :collected
        else
          Process.put(@key, total)
          :ok
        end
    end
  end

  @doc "The calling process's limit for a floor of `floor` bytes (see the moduledoc)."
  def limit(floor) do
    {:total_heap_size, words} = Process.info(self(), :total_heap_size)
    heap = words * :erlang.system_info(:wordsize)
    max(floor, min(@heap_factor * heap, @cap))
  end
end
