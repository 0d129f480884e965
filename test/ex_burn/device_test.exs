defmodule ExBurn.DeviceTest do
  # Changes the VM-wide default device.
  use ExUnit.Case, async: false

  alias ExBurn.Device

  setup do
    previous = System.get_env("EXBURN_DEVICE")
    Device.reset_default()

    on_exit(fn ->
      if previous, do: System.put_env("EXBURN_DEVICE", previous), else: System.delete_env("EXBURN_DEVICE")
      Device.reset_default()
    end)
  end

  test "device specs resolve to {kind, index}" do
    for {spec, expected} <- [
          {:cpu, {:cpu, 0}},
          {"cpu", {:cpu, 0}},
          {"vulkan:1", {:vulkan, 1}},
          {:metal, {:metal, 0}},
          {{:cuda, 2}, {:cuda, 2}}
        ] do
      assert Device.resolve(spec) == expected
    end

    for bad <- ["tpu", "cpu:x", "vulkan:-1", {:cpu, -1}, :gpu, 3] do
      error = assert_raise ExBurn.Error, fn -> Device.resolve(bad) end
      assert error.op == :device
      assert error.details == %{device: bad}
    end
  end

  @tag :cpu_only_build
  test "without GPU backends compiled in, :auto picks the cpu and says why for every kind" do
    assert Device.compiled_kinds() == [:cpu]
    {device, reason} = Device.auto()
    assert device == {:cpu, 0}

    assert reason ==
             "cuda: not compiled in; rocm: not compiled in; metal: not compiled in; " <>
               "vulkan: not compiled in; cpu: chosen (no usable GPU)"

    assert Device.resolve(:auto) == {:cpu, 0}
  end

  @tag :gpu_build
  test "with a GPU backend compiled in, :auto picks a usable device and says why for every kind it tried" do
    compiled = Device.compiled_kinds()
    {device, reason} = Device.auto()
    usable = Enum.map(ExBurn.devices(), &{&1.kind, &1.index})
    assert device in usable
    chosen = if device == {:cpu, 0}, do: "cpu: chosen", else: "#{inspect(device)}: chosen"
    assert reason =~ chosen

    # the kinds tried before the chosen one (:auto stops there) each have their line
    tried = Enum.take_while([:cuda, :rocm, :metal, :vulkan], &(&1 != elem(device, 0)))

    for kind <- tried, kind not in compiled do
      assert reason =~ "#{kind}: not compiled in"
    end
  end

  test "the default comes from EXBURN_DEVICE, else :auto" do
    System.put_env("EXBURN_DEVICE", "cpu:0")
    assert ExBurn.default_device() == {:cpu, 0}

    Device.reset_default()
    System.put_env("EXBURN_DEVICE", "bogus")
    assert_raise ExBurn.Error, fn -> ExBurn.default_device() end

    Device.reset_default()
    System.delete_env("EXBURN_DEVICE")
    assert ExBurn.default_device() == Device.resolve(:auto)
  end

  test "configure! accepts available devices and refuses missing ones" do
    assert ExBurn.configure!(device: :cpu) == {:cpu, 0}
    assert ExBurn.default_device() == {:cpu, 0}

    error = assert_raise ExBurn.Error, fn -> ExBurn.configure!(device: {:vulkan, 0}) end
    assert error.op == :configure
    assert error.details.device == {:vulkan, 0}
    assert {:cpu, 0} in error.details.available
    assert ExBurn.default_device() == {:cpu, 0}

    assert ExBurn.configure!(device: :auto) == Device.resolve(:auto)
  end

  test "every device spec form works wherever a device is asked for" do
    for spec <- [:cpu, {:cpu, 0}, "cpu", "cpu:0"] do
      assert ExBurn.Tensor.zeros({2}, :f32, device: spec) |> ExBurn.Tensor.device() == {:cpu, 0}
    end

    auto = ExBurn.Tensor.zeros({2}, :f32, device: :auto)
    assert ExBurn.Tensor.device(auto) == Device.resolve(:auto)

    error = assert_raise ExBurn.Error, fn -> ExBurn.Tensor.zeros({2}, :f32, device: "tpu") end
    assert {error.op, error.details} == {:zeros, %{device: "tpu"}}
  end

  test "a tensor on a missing device is an error, never a crash" do
    # no machine here has 99 CUDA devices
    error = assert_raise ExBurn.Error, fn -> ExBurn.Tensor.zeros({2}, :f32, device: {:cuda, 99}) end
    assert error.reason =~ "not available"
    assert ExBurn.Tensor.zeros({2}, :f32) |> ExBurn.Tensor.device() == ExBurn.default_device()
  end
end
