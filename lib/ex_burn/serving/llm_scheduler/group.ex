defmodule ExBurn.LLM.Scheduler.Group do
  @moduledoc false
  # Replica groups of `ExBurn.LLM.Scheduler` (its moduledoc, Replicas): members join a `:pg`
  # group, found on this node and the connected ones, and each request goes to the least loaded.

  alias ExBurn.Error

  # The :pg scope of the replica groups, on every node that has a replica or routes to one.
  @scope ExBurn.LLM.Scheduler.Groups
  # How long routing waits for the members' load before passing over those that have not answered.
  @route_timeout 5_000

  def join(group), do: :pg.join(scope(), group, self())

  def leave(group), do: :pg.leave(@scope, group, self())

  def members(group), do: :pg.get_members(scope(), group)

  # Tries the members from the least loaded on; one that is down or whose queue is full is
  # passed over for the next.
  def route(group, fun) do
    case loads(group) do
      [] -> {:error, no_members(group)}
      loads -> loads |> Enum.map(&elem(&1, 1)) |> try_each(fun, nil)
    end
  end

  defp try_each([], _fun, error), do: {:error, error}

  defp try_each([pid | rest], fun, _error) do
    case fun.(pid) do
      {:error, %Error{details: %{cause: cause}} = e} when cause in [:down, :overloaded] ->
        try_each(rest, fun, e)

      other ->
        other
    end
  end

  # `{key, pid, info}` of the members that answer in time, least loaded first. The load is the
  # requests a member holds (queued and running) per batch slot (`:max_concurrent`); ties go to
  # the smaller share of the KV budget reserved, then to members on this node, then at random
  # (so concurrent routers don't all pick the same one).
  def loads(group) do
    deadline = System.monotonic_time(:millisecond) + @route_timeout

    group
    |> members()
    |> Enum.map(&{&1, :gen_server.send_request(&1, :info)})
    |> Enum.flat_map(fn {pid, request_id} ->
      case :gen_server.receive_response(request_id, max(deadline - System.monotonic_time(:millisecond), 0)) do
        {:reply, info} -> [{load_key(pid, info), pid, info}]
        _down_or_late -> []
      end
    end)
    |> Enum.sort()
  end

  defp load_key(pid, info) do
    {(info.queued + info.running) / max(info.max_concurrent, 1), info.kv_reserved / max(info.kv_memory, 1),
     if(node(pid) == node(), do: 0, else: 1), :rand.uniform()}
  end

  # The group scope, started on first use (unlinked: it outlives whoever needed it first) so
  # that groups work without an application supervision tree.
  defp scope do
    if Process.whereis(@scope) == nil do
      case :pg.start(@scope) do
        {:ok, _} -> :ok
        {:error, {:already_started, _}} -> :ok
      end
    end

    @scope
  end

  defp no_members(group),
    do: %Error{
      op: :llm_scheduler,
      reason: "no LLM server of group #{inspect(group)} is running",
      details: %{cause: :down, group: group}
    }
end
