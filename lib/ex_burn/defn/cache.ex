if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.Cache do
    @moduledoc false
    # Compiled entries and counters in one public ETS table. ExBurn has no supervision tree, so
    # the table's owner is a small process started on first use that lives for the VM.

    @table :ex_burn_defn_cache

    def fetch(key, build) do
      table = table()

      case :ets.lookup(table, {:entry, key}) do
        [{_, entry}] ->
          bump(:cache_hits)
          entry

        [] ->
          bump(:cache_misses)
          entry = build.()
          :ets.insert(table, {{:entry, key}, entry})
          entry
      end
    end

    def bump(counter, by \\ 1), do: :ets.update_counter(table(), {:count, counter}, by, {{:count, counter}, 0})

    def counts do
      table()
      |> :ets.match({{:count, :"$1"}, :"$2"})
      |> Map.new(fn [k, v] -> {k, v} end)
    end

    def reset_counts, do: :ets.match_delete(table(), {{:count, :_}, :_})

    def clear, do: :ets.delete_all_objects(table())

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
