defmodule ExBurn.NativeTest do
  use ExUnit.Case, async: false

  test "the library is loaded and every declared NIF is native and answers junk with a typed error" do
    assert ExBurn.Native.loaded?(), "load status: #{inspect(ExBurn.Native.load_status())}"

    for {name, arity} <- ExBurn.Native.nifs(), arity > 0 do
      result = apply(ExBurn.Native, name, List.duplicate(make_ref(), arity))
      assert {:error, {op, reason, details}} = result, "#{name}/#{arity} answered #{inspect(result)}"
      assert is_atom(op) and op != :nif_not_loaded and is_binary(reason) and is_map(details)
    end
  end

  test "error formatting and unwrap!" do
    assert ExBurn.Error.unwrap!({:ok, 1}) == 1
    error = assert_raise ExBurn.Error, fn -> ExBurn.Error.unwrap!({:error, {:add, "boom", %{lhs: [1]}}}) end
    assert Exception.message(error) == "ExBurn add failed: boom %{lhs: [1]}"
    assert Exception.message(ExBurn.Error.exception(op: :x, reason: "y")) == "ExBurn x failed: y"
  end
end
