defmodule ExBurn.NativeTest do
  use ExUnit.Case, async: false

  test "the library is loaded and declares every NIF of the contract" do
    assert ExBurn.Native.loaded?(), "load status: #{inspect(ExBurn.Native.load_status())}"
    assert length(ExBurn.Native.nifs()) == 27
  end

  test "error formatting and unwrap!" do
    assert ExBurn.Error.unwrap!({:ok, 1}) == 1
    error = assert_raise ExBurn.Error, fn -> ExBurn.Error.unwrap!({:error, {:add, "boom", %{lhs: [1]}}}) end
    assert Exception.message(error) == "ExBurn add failed: boom %{lhs: [1]}"
    assert Exception.message(ExBurn.Error.exception(op: :x, reason: "y")) == "ExBurn x failed: y"
  end

  test "default_device parses EXBURN_DEVICE" do
    previous = System.get_env("EXBURN_DEVICE")

    try do
      for {spec, expected} <- [{"cpu", {:cpu, 0}}, {"vulkan:1", {:vulkan, 1}}, {"metal", {:metal, 0}}] do
        System.put_env("EXBURN_DEVICE", spec)
        assert ExBurn.default_device() == expected
      end

      for bad <- ["tpu", "cpu:x", "vulkan:-1"] do
        System.put_env("EXBURN_DEVICE", bad)
        assert_raise ExBurn.Error, fn -> ExBurn.default_device() end
      end
    after
      if previous, do: System.put_env("EXBURN_DEVICE", previous), else: System.delete_env("EXBURN_DEVICE")
    end

    assert ExBurn.default_device() == {:cpu, 0}
  end
end
