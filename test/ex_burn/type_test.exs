defmodule ExBurn.TypeTest do
  use ExUnit.Case, async: true
  alias ExBurn.Type
  doctest ExBurn.Type

  test "normalize accepts tuples and shorthands, rejects the rest" do
    assert Type.normalize(:f32) == {:f, 32}
    assert Type.normalize(:u64) == {:u, 64}
    assert Type.normalize(:pred) == {:u, 8}
    assert Type.normalize({:s, 16}) == {:s, 16}

    for bad <- [:c64, {:c, 64}, {:f, 8}, {:s, 7}, "f32", nil, 32] do
      assert_raise ExBurn.Error, fn -> Type.normalize(bad) end
    end
  end

  test "byte_size, float?, integer?" do
    assert Enum.map(Type.all(), &Type.byte_size/1) == [1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2]
    assert Enum.filter(Type.all(), &Type.float?/1) == [{:f, 16}, {:f, 32}, {:f, 64}, {:bf, 16}]
    assert Enum.count(Type.all(), &Type.integer?/1) == 8
  end

  test "merge follows Nx promotion" do
    cases = [
      {{:s, 8}, {:s, 8}, {:s, 8}},
      {{:s, 8}, {:s, 64}, {:s, 64}},
      {{:s, 8}, {:u, 8}, {:s, 16}},
      {{:s, 16}, {:u, 8}, {:s, 16}},
      {{:s, 8}, {:u, 16}, {:s, 32}},
      {{:s, 8}, {:u, 32}, {:s, 64}},
      {{:s, 8}, {:u, 64}, {:s, 64}},
      {{:u, 8}, {:u, 32}, {:u, 32}},
      {{:u, 64}, {:f, 32}, {:f, 32}},
      {{:s, 64}, {:f, 16}, {:f, 16}},
      {{:u, 8}, {:bf, 16}, {:bf, 16}},
      {{:s, 64}, {:bf, 16}, {:bf, 16}},
      {{:f, 32}, {:bf, 16}, {:f, 32}},
      {{:f, 64}, {:bf, 16}, {:f, 64}},
      # f outranks bf: f16 wins over bf16 (Nx.Type.merge)
      {{:f, 16}, {:bf, 16}, {:f, 16}},
      {{:f, 16}, {:f, 64}, {:f, 64}}
    ]

    for {a, b, expected} <- cases do
      assert Type.merge(a, b) == expected, "merge(#{inspect(a)}, #{inspect(b)})"
      assert Type.merge(b, a) == expected, "merge(#{inspect(b)}, #{inspect(a)})"
    end
  end

  test "to_floating, to_aggregate, merge_number" do
    assert Type.to_floating({:s, 64}) == {:f, 32}
    assert Type.to_floating({:f, 16}) == {:f, 16}
    assert Type.to_floating({:bf, 16}) == {:bf, 16}
    assert Type.to_aggregate({:s, 8}) == {:s, 64}
    assert Type.to_aggregate({:u, 16}) == {:u, 64}
    assert Type.to_aggregate({:f, 16}) == {:f, 16}
    assert Type.merge_number({:u, 8}, 1000) == {:u, 16}
    assert Type.merge_number({:u, 8}, 255) == {:u, 8}
    assert Type.merge_number({:u, 8}, -32769) == {:s, 32}
    assert Type.merge_number({:s, 8}, 128) == {:s, 16}
    assert Type.merge_number({:u, 64}, -1337) == {:s, 64}
    assert Type.merge_number({:s, 8}, 1.5) == {:f, 32}
    assert Type.merge_number({:f, 64}, 1.5) == {:f, 64}
  end

  @tag :nx
  test "merge agrees with Nx.Type.merge for every pair" do
    nx_type = Nx.Type

    for a <- Type.all(), b <- Type.all() do
      assert Type.merge(a, b) == nx_type.merge(a, b), "merge(#{inspect(a)}, #{inspect(b)})"
    end
  end
end
