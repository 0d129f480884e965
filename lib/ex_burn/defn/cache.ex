if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Cache do
    @moduledoc false
    # Compiled entries and counters in one public ETS table. ExBurn has no supervision tree, so
    # the table's owner is a small process started on first use that lives for the VM.

    @table :ex_burn_defn_cache

    # Entries beyond this many (application env `:defn_cache_size`) evict the least recently
    # used one: a program holds device memory (its dense constants), and a caller that jits a
    # fresh closure per call would otherwise grow the table forever.
    @default_size 256

    def fetch(key, build) do
      table = table()

      case :ets.lookup(table, {:entry, key}) do
        [{_, entry, _used}] ->
          bump(:cache_hits)
          :ets.update_element(table, {:entry, key}, {3, tick()})
          entry

        [] ->
          bump(:cache_misses)
          entry = build.()
          :ets.insert(table, {{:entry, key}, entry, tick()})
          evict(table, limit())
          entry
      end
    end

    @doc false
    def size, do: :ets.select_count(table(), [{{{:entry, :_}, :_, :_}, [], [true]}])

    defp limit, do: Application.get_env(:ex_burn, :defn_cache_size, @default_size)

    defp evict(table, limit) do
      entries = :ets.select(table, [{{{:entry, :"$1"}, :_, :"$2"}, [], [{{:"$2", :"$1"}}]}])

      if length(entries) > limit do
        entries
        |> Enum.sort()
        |> Enum.take(length(entries) - limit)
        |> Enum.each(fn {_used, key} ->
          :ets.delete(table, {:entry, key})
          bump(:evictions)
        end)
      end
    end

    defp tick, do: :erlang.unique_integer([:monotonic])

    def bump(counter, by \\ 1),
      do: :ets.update_counter(table(), {:count, counter}, by, {{:count, counter}, 0})

    def counts do
      table()
      |> :ets.match({{:count, :"$1"}, :"$2"})
      |> Map.new(fn [k, v] -> {k, v} end)
    end

    def reset_counts, do: :ets.match_delete(table(), {{:count, :_}, :_})

    def clear do
      :ets.match_delete(table(), {{:entry, :_}, :_, :_})
      :ok
    end

    defp table do
      case :ets.whereis(@table) do
        :undefined -> start_owner()
        _ -> @table
      end
    end

    defp start_owner do
      parent = self()

      {pid, ref} =
        spawn_monitor(fn ->
          try do
            :ets.new(@table, [:named_table, :public, :set, read_concurrency: true, write_concurrency: true])
            send(parent, {:ex_burn_cache, self(), :ok})
            Process.sleep(:infinity)
          rescue
            # another process created it first
            ArgumentError -> send(parent, {:ex_burn_cache, self(), :exists})
          end
        end)

      receive do
        {:ex_burn_cache, ^pid, _} -> :ok
        {:DOWN, ^ref, _, _, _} -> :ok
      end

      Process.demonitor(ref, [:flush])
      @table
    end
  end
end
