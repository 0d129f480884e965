defmodule ExBurn.SchedulingTest do
  # Measures the VM's dirty CPU schedulers, so nothing else may run meanwhile.
  use ExUnit.Case, async: false
  alias ExBurn.Tensor

  # Time the dirty CPU schedulers spent running code (NIFs included) while `fun` ran, in µs,
  # from the VM's microstate accounting.
  defp dirty_cpu_us(fun) do
    :erlang.system_flag(:microstate_accounting, :reset)
    :erlang.system_flag(:microstate_accounting, true)
    fun.()
    stats = :erlang.statistics(:microstate_accounting)
    :erlang.system_flag(:microstate_accounting, false)
    units = for %{type: :dirty_cpu_scheduler, counters: c} <- stats, reduce: 0, do: (acc -> acc + c.emulator)
    :erlang.convert_time_unit(units, :perf_counter, :microsecond)
  end

  test "element-wise ops and reads of small CPU tensors run in place; larger ones on dirty schedulers" do
    small = Tensor.iota({2, 10}, :f32, device: :cpu)
    # 2000 x (add + exp + first element): on dirty schedulers ~3 µs each, far above the bound
    in_place =
      dirty_cpu_us(fn ->
        for _ <- 1..2000, do: small |> Tensor.add(small) |> Tensor.exp() |> Tensor.to_binary(1)
      end)

    assert in_place < 1000, "dirty schedulers ran #{in_place} µs"

    # the result counts: small inputs broadcast to 4096 x 4096 are not small work
    column = Tensor.iota({4096, 1}, :f32, device: :cpu)
    row = Tensor.iota({1, 4096}, :f32, device: :cpu)
    dirty = dirty_cpu_us(fn -> for _ <- 1..5, do: Tensor.add(column, row) end)
    assert dirty > 1000, "dirty schedulers ran #{dirty} µs"

    # both paths compute the same thing
    assert Tensor.to_flat_list(Tensor.add(small, small)) == Enum.map(0..19, &(2.0 * &1))
    big = Tensor.add(column, row)
    assert Tensor.shape(big) == {4096, 4096}

    assert Tensor.to_flat_list(Tensor.slice(big, [4095, 4090], [1, 6])) ==
             Enum.map(4090..4095, &(4095.0 + &1))

    assert Tensor.to_binary(Tensor.iota({5000}, :u8), 3) == <<0, 1, 2>>
  end

  test "bad arguments are errors on either path" do
    small = Tensor.iota({3}, :f32)
    large = Tensor.iota({5000}, :f32)

    for t <- [small, large] do
      assert {:error, {:add, "cannot broadcast shapes", %{rhs: [7]}}} =
               ExBurn.Native.binary(:add, t.ref, Tensor.iota({7}, :f32).ref, {:f, 32})
    end

    assert {:error, {:add, _, %{argument: "tensor"}}} = ExBurn.Native.binary(:add, :nope, small.ref, {:f, 32})
    assert {:error, {:to_binary, _, _}} = ExBurn.Native.to_binary(small.ref, -1)
  end
end
