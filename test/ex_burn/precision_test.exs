defmodule ExBurn.PrecisionTest do
  # Changes the VM-wide matmul precision.
  use ExUnit.Case, async: false

  alias ExBurn.Tensor

  setup do
    previous = ExBurn.matmul_precision()
    on_exit(fn -> ExBurn.Precision.set_global!(previous) end)
  end

  test "f32 means f32 by default" do
    assert ExBurn.matmul_precision() == :highest
  end

  test "configure! sets the VM-wide precision and, given alone, keeps the default device" do
    device = ExBurn.default_device()
    assert ExBurn.configure!(matmul_precision: :high) == device
    assert ExBurn.matmul_precision() == :high
    assert ExBurn.default_device() == device
    assert ExBurn.configure!(matmul_precision: :highest) == device
    assert ExBurn.matmul_precision() == :highest
  end

  test "an unknown precision is refused and changes nothing" do
    for bad <- [:medium, "high", nil, 1] do
      error = assert_raise ExBurn.Error, fn -> ExBurn.configure!(matmul_precision: bad) end
      assert error.op == :configure
      assert ExBurn.matmul_precision() == :highest
    end

    error = assert_raise ExBurn.Error, fn -> ExBurn.with_matmul_precision(:tf32, fn -> :ran end) end
    assert error.op == :with_matmul_precision
    assert {:error, {:configure, _, _}} = ExBurn.Native.set_matmul_precision(:medium)
  end

  test "with_matmul_precision scopes the level to the calling process and restores it" do
    assert ExBurn.Precision.current() == nil

    assert ExBurn.with_matmul_precision(:high, fn ->
             assert ExBurn.Precision.effective() == :high
             assert Task.async(fn -> ExBurn.Precision.effective() end) |> Task.await() == :highest
             ExBurn.with_matmul_precision(:highest, fn -> ExBurn.Precision.current() end)
           end) == :highest

    assert ExBurn.Precision.current() == nil
    catch_error(ExBurn.with_matmul_precision(:high, fn -> raise "boom" end))
    assert ExBurn.Precision.current() == nil
  end

  # On the CPU (flex) products are true f32 at both levels: the option is accepted and the
  # result is bit-identical. On CUDA :highest must stay at f32 accuracy (cuBLAS, not TF32).
  test "dot at both levels: true f32 at :highest against an f64 product" do
    {m, k, n} = {64, 300, 48}
    a = for i <- 1..(m * k), do: :math.sin(i * 0.37)
    b = for i <- 1..(k * n), do: :math.cos(i * 0.11)
    ta = Tensor.tensor(a, type: :f32) |> Tensor.reshape({m, k})
    tb = Tensor.tensor(b, type: :f32) |> Tensor.reshape({k, n})
    highest = Tensor.to_binary(Tensor.dot(ta, tb))
    high = ExBurn.with_matmul_precision(:high, fn -> Tensor.to_binary(Tensor.dot(ta, tb)) end)
    global_high = ExBurn.configure!(matmul_precision: :high) && Tensor.to_binary(Tensor.dot(ta, tb))

    if ExBurn.default_device() |> elem(0) == :cpu do
      assert high == highest
      assert global_high == highest
    end

    # f64 reference from the f32-rounded inputs
    fa = ta |> Tensor.as_type(:f64) |> Tensor.to_flat_list()
    fb = tb |> Tensor.as_type(:f64) |> Tensor.to_flat_list()
    rows = Enum.chunk_every(fa, k)
    cols = fb |> Enum.chunk_every(n) |> Enum.zip() |> Enum.map(&Tuple.to_list/1)
    want = for r <- rows, c <- cols, do: Enum.zip_with(r, c, &(&1 * &2)) |> Enum.sum()
    got = for <<x::float-32-native <- highest>>, do: x
    scale = want |> Enum.map(&abs/1) |> Enum.max()
    err = Enum.zip_with(got, want, &abs(&1 - &2)) |> Enum.max()
    assert err / scale < 2.0e-6, "relative error #{err / scale} is not f32's"
  end
end
