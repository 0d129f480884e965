defmodule ExBurn.RoundTripTest do
  use ExUnit.Case, async: true
  alias ExBurn.{Tensor, Type}

  @shapes [
    {},
    {3},
    {2, 3},
    {2, 1, 3},
    {1, 2, 2, 3},
    {2, 1, 2, 1, 2},
    {1, 2, 1, 2, 1, 3}
  ]
  @empty_shapes [{0}, {2, 0, 3}, {0, 0}, {3, 0}, {1, 1, 1, 1, 1, 0}]

  # Deterministic data covering each type's range: integer extremes, floats with fractions and
  # signs (finite values: every backend must keep them bit-exact).
  defp data(type, n) do
    for i <- 0..(n - 1)//1, into: <<>>, do: Tensor.encode!(:test, value(type, i), type)
  end

  defp value({:s, bits}, i), do: Enum.at([-(2 ** (bits - 1)), 2 ** (bits - 1) - 1, -1, 0, 1], rem(i, 5))
  defp value({:u, bits}, i), do: Enum.at([0, 2 ** bits - 1, 1, 2, 2 ** (bits - 1)], rem(i, 5))
  defp value(_float, i), do: (i - 3) * 0.5 + if(rem(i, 2) == 0, do: 0.25, else: -1.0)

  for type <- Type.all(), shape <- @shapes ++ @empty_shapes do
    @type_ type
    @shape shape
    test "#{Type.to_string(type)} #{inspect(shape)} round-trips byte-exact" do
      n = Tuple.product(@shape)
      bin = data(@type_, n)
      assert byte_size(bin) == n * Type.byte_size(@type_)

      t = Tensor.from_binary(bin, @type_, shape: @shape)
      assert Tensor.shape(t) == @shape
      assert Tensor.type(t) == @type_
      assert Tensor.device(t) == ExBurn.default_device()
      assert Tensor.rank(t) == tuple_size(@shape)
      assert Tensor.size(t) == n
      assert Tensor.to_binary(t) == bin

      # The NIF's own metadata agrees with the struct.
      assert ExBurn.Native.shape(t.ref) == {:ok, @shape}
      assert ExBurn.Native.type(t.ref) == {:ok, @type_}
      assert ExBurn.Native.device(t.ref) == {:ok, ExBurn.default_device()}
    end
  end

  for type <- Type.all() do
    @type_ type
    test "#{Type.to_string(type)} to_binary with a limit" do
      size = Type.byte_size(@type_)
      bin = data(@type_, 6)
      t = Tensor.from_binary(bin, @type_, shape: {2, 3})
      assert Tensor.to_binary(t, 0) == ""
      assert Tensor.to_binary(t, 2) == binary_part(bin, 0, 2 * size)
      assert Tensor.to_binary(t, limit: 5) == binary_part(bin, 0, 5 * size)
      assert Tensor.to_binary(t, 6) == bin
      assert Tensor.to_binary(t, 100) == bin
    end
  end

  test "atom shorthands and the default shape" do
    t = Tensor.from_binary(<<1, 2, 3, 4>>, :pred)
    assert {t.shape, t.type} == {{4}, {:u, 8}}
    t = Tensor.from_binary(<<0::native-32, 0::native-32>>, :f32)
    assert {t.shape, t.type} == {{2}, {:f, 32}}
    t = Tensor.from_binary(<<1, 2, 3, 4, 5, 6>>, :u8, shape: [2, 3])
    assert t.shape == {2, 3}
  end

  test "tensor/2 and to_flat_list/1 handle every type, including non-finite floats" do
    for type <- Type.all(), Type.float?(type) do
      t = Tensor.tensor([[1.5, -2.0], [:nan, :infinity], [:neg_infinity, 0.0]], type: type)
      assert t.shape == {3, 2}
      assert Tensor.to_flat_list(t) == [1.5, -2.0, :nan, :infinity, :neg_infinity, 0.0]
    end

    assert Tensor.to_flat_list(Tensor.tensor([-128, 127], type: :s8)) == [-128, 127]
    assert Tensor.to_flat_list(Tensor.tensor([0, 65535], type: :u16)) == [0, 65535]
    assert Tensor.type(Tensor.tensor([1, 2])) == {:s, 32}
    assert Tensor.type(Tensor.tensor([1, 2.0])) == {:f, 32}
    assert Tensor.shape(Tensor.tensor(7)) == {}
  end

  test "inspect shows metadata" do
    t = Tensor.zeros({2, 3}, :bf16, device: :cpu)
    assert inspect(t) == "#ExBurn.Tensor<bf16[2][3] cpu:0>"
    assert inspect(Tensor.zeros({}, :s64, device: :cpu)) == "#ExBurn.Tensor<s64 cpu:0>"
  end
end
