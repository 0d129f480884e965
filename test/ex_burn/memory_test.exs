defmodule ExBurn.MemoryTest do
  use ExUnit.Case, async: false
  alias ExBurn.Tensor

  test "deallocate frees once; later use raises naming the op" do
    t = Tensor.iota({4, 4}, :f32)
    assert Tensor.deallocate(t) == :ok
    assert Tensor.deallocate(t) == :already_deallocated
    assert ExBurn.Native.deallocate(t.ref) == {:ok, :already_deallocated}

    for {op, fun} <- [
          add: fn -> Tensor.add(t, t) end,
          exp: fn -> Tensor.exp(t) end,
          sum: fn -> Tensor.sum(t) end,
          argmax: fn -> Tensor.argmax(t) end,
          reshape: fn -> Tensor.reshape(t, {16}) end,
          transpose: fn -> Tensor.transpose(t) end,
          to_binary: fn -> Tensor.to_binary(t) end,
          as_type: fn -> Tensor.as_type(t, :s32) end,
          dot: fn -> Tensor.dot(t, t) end
        ] do
      error = assert_raise ExBurn.Error, fun
      assert {error.op, error.reason} == {op, "tensor was deallocated"}
    end

    # metadata stays readable (it lives in the struct)
    assert Tensor.shape(t) == {4, 4}
  end

  # Resident set size of this OS process (Linux), in bytes.
  defp rss do
    case File.read("/proc/self/statm") do
      {:ok, statm} ->
        [_size, resident | _] = String.split(statm)
        String.to_integer(resident) * 4096

      {:error, _} ->
        nil
    end
  end

  test "tensors created in a loop are garbage collected" do
    bin = :binary.copy(<<0::32>>, 262_144)
    # warm up the allocator
    for _ <- 1..20, do: Tensor.from_binary(bin, :f32)
    :erlang.garbage_collect()
    before = rss()

    # 2000 x 1 MB = 2 GB if nothing were freed.
    for i <- 1..2000 do
      t = Tensor.from_binary(bin, :f32)
      assert t.shape == {262_144}
      if rem(i, 50) == 0, do: :erlang.garbage_collect()
    end

    :erlang.garbage_collect()

    if before do
      grown = rss() - before
      assert grown < 512 * 1024 * 1024, "RSS grew by #{div(grown, 1024 * 1024)} MB"
    end

    # Tensors owned by a process that exits are freed too.
    task = Task.async(fn -> for _ <- 1..200, do: Tensor.from_binary(bin, :f32) end)
    Task.await(task, 60_000)
    if before, do: assert(rss() - before < 512 * 1024 * 1024)
  end

  # Major collections of a process that makes `count` 1 MiB tensors and drops each, with the
  # given gc_after_bytes: GC start events traced from a fresh process.
  defp major_gcs(setting, count) do
    bin = :binary.copy(<<0::32>>, 262_144)
    previous = Application.fetch_env(:ex_burn, :gc_after_bytes)
    Application.put_env(:ex_burn, :gc_after_bytes, setting)

    try do
      parent = self()

      pid =
        spawn(fn ->
          receive do: (:go -> :ok)
          for _ <- 1..count, do: Tensor.from_binary(bin, :f32)
          send(parent, :done)
        end)

      :erlang.trace(pid, true, [:garbage_collection])
      send(pid, :go)
      assert_receive :done, 30_000
      count_major(0)
    after
      case previous do
        {:ok, value} -> Application.put_env(:ex_burn, :gc_after_bytes, value)
        :error -> Application.delete_env(:ex_burn, :gc_after_bytes)
      end
    end
  end

  defp count_major(n) do
    receive do
      {:trace, _, :gc_major_start, _} -> count_major(n + 1)
      {:trace, _, _, _} -> count_major(n)
    after
      100 -> n
    end
  end

  test "a process collects its dead tensors after gc_after_bytes of new ones, not only when its heap fills" do
    # 40 MiB of tensors: one collection per 4 MiB; turned off, only the heap's own growth
    # collects (once in this loop)
    assert major_gcs(4 * 1024 * 1024, 40) >= 10
    assert major_gcs(:infinity, 40) <= 2
  end

  # Runs `fun` in a fresh process (a small heap) with gc_after_bytes set to `setting`.
  defp in_process(setting, fun) do
    Application.put_env(:ex_burn, :gc_after_bytes, setting)

    try do
      Task.async(fun) |> Task.await(30_000)
    after
      Application.delete_env(:ex_burn, :gc_after_bytes)
    end
  end

  @mib 1024 * 1024

  test "the gc_after_bytes threshold counts bytes per process and resets after a collection" do
    notes =
      in_process(4 * @mib, fn ->
        # 2 MiB, 2 MiB (reaches 4 MiB exactly), then 1 + 3 MiB in two types
        [
          {{512, 1024}, {:f, 32}},
          {{256, 1024}, {:f, 64}},
          {{1024, 1024}, {:u, 8}},
          {{3 * 1024, 1024}, {:s, 8}}
        ]
        |> Enum.map(fn {shape, type} -> ExBurn.Tensor.Reclaim.note(shape, type) end)
      end)

    assert notes == [:ok, :collected, :ok, :collected]

    Application.put_env(:ex_burn, :gc_after_bytes, -1)

    try do
      error = assert_raise ExBurn.Error, fn -> ExBurn.Tensor.Reclaim.note({1}, {:f, 32}) end
      assert error.details == %{gc_after_bytes: -1}
    after
      Application.delete_env(:ex_burn, :gc_after_bytes)
    end
  end

  test "a process with a large heap collects later, at 64 times its heap, at most 256 MiB" do
    collected_at =
      in_process(4 * @mib, fn ->
        # at least 9.6 MB of heap (600 000 cons cells of 2 words): 64 times that is above the
        # cap, so the cap applies
        big = Enum.to_list(1..600_000)

        notes = for _ <- 1..70, do: ExBurn.Tensor.Reclaim.note({@mib}, {:u, 32})
        # keeps `big` alive through the notes
        true = length(big) == 600_000
        for {:collected, i} <- Enum.with_index(notes, 1), do: i
      end)

    # 4 MiB a note: the 64th reaches 256 MiB
    assert collected_at == [64]

    # a small heap keeps the floor: every note of 4 MiB collects
    small = in_process(4 * @mib, fn -> for _ <- 1..3, do: ExBurn.Tensor.Reclaim.note({@mib}, {:u, 32}) end)
    assert small == [:collected, :collected, :collected]
  end
end
