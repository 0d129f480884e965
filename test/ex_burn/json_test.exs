defmodule ExBurn.JSONTest do
  use ExUnit.Case, async: true

  import Bitwise
  alias ExBurn.JSON
  doctest ExBurn.JSON

  test "decodes every JSON value kind" do
    text = ~s({"s": "é\\u00e9\\ud83d\\ude00", "i": -12, "big": 18446744073709551615, "f": 1.5e3,
      "neg0": -0.0, "l": [], "o": {}, "t": true, "n": null})

    assert JSON.decode!(text) == %{
             "s" => "éé😀",
             "i" => -12,
             "big" => 18_446_744_073_709_551_615,
             "f" => 1500.0,
             "neg0" => -0.0,
             "l" => [],
             "o" => %{},
             "t" => true,
             "n" => nil
           }
  end

  test "round-trips floats exactly (shortest representation)" do
    xs = [0.1, 1.0e-300, 3.4028234663852886e38, -2.5, 0.034477271139621735]
    assert JSON.decode!(JSON.encode!(xs)) === xs
  end

  test "encodes keys and atoms" do
    assert JSON.encode!(%{1 => :x, "k" => nil, b: [true, false]}) == ~s({"1":"x","b":[true,false],"k":null})
    assert JSON.encode!([1, 2], pretty: true) == "[\n  1,\n  2\n]"
  end

  test "malformed documents are errors naming the position" do
    assert {:error, %ExBurn.Error{op: :json_decode, details: %{line: 1, column: col}}} =
             JSON.decode(~s({"a": }))

    assert col > 0

    for bad <- ["", "[1,", "{'a': 1}", "nan", "[1] x", <<0xFF>>] do
      assert {:error, %ExBurn.Error{op: :json_decode}} = JSON.decode(bad)
    end

    assert {:error, %ExBurn.Error{op: :json_decode}} = JSON.decode(:not_binary)
  end

  test "nesting is bounded both ways" do
    deep = String.duplicate("[", 10_000) <> String.duplicate("]", 10_000)
    assert {:error, %ExBurn.Error{op: :json_decode}} = JSON.decode(deep)
    term = Enum.reduce(1..10_000, [], fn _, acc -> [acc] end)
    assert {:error, %ExBurn.Error{op: :json_encode, reason: reason}} = JSON.encode(term)
    assert reason =~ "deeper than 128"
  end

  test "values without a JSON form are errors" do
    for bad <- [{1, 2}, self(), <<0xFF>>, %{{1} => 2}, [1 | 2], 1 <<< 70] do
      assert {:error, %ExBurn.Error{op: :json_encode}} = JSON.encode(bad)
    end
  end
end
