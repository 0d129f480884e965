defmodule ExBurn.Pretrained.EngineChoiceTest do
  # :auto's measured choice between Burn and Candle where both run on the device, driven by fake
  # engines and fake timings; the real workloads run in the models' own tests.
  use ExUnit.Case, async: false
  import ExUnit.CaptureLog

  alias ExBurn.Pretrained

  @moduletag :tmp_dir
  @cpu {:cpu, 0}

  setup %{tmp_dir: dir} do
    on_exit(ExBurn.PretrainedCase.measure_engines(Path.join(dir, "cache")))
    model = Path.join(dir, "model.gguf")
    File.write!(model, "weights")
    %{model: model, cache: Path.join(dir, "cache")}
  end

  defp fake_load(candle_loads \\ true) do
    parent = self()

    fn path, %{engine: engine, device: device} ->
      send(parent, {:loaded, engine, device})

      cond do
        engine == :burn -> {:ok, :burn_ref}
        candle_loads -> {:ok, {:candle_ref, path}}
        true -> {:error, {:llm_load, "candle: unsupported architecture", %{kind: :unsupported_feature}}}
      end
    end
  end

  # the workload's time on each engine, in ms
  defp timings(burn, candle) do
    fn
      :burn_ref -> {:ok, burn}
      {:candle_ref, _} -> {:ok, candle}
    end
  end

  defp load(model, load, measure), do: Pretrained.load(:llm, model, [device: @cpu], load, measure)

  defp loads do
    receive do
      {:loaded, engine, _} -> [engine | loads()]
    after
      0 -> []
    end
  end

  test "the first load measures both engines and keeps Burn when it is faster", %{model: model, cache: cache} do
    log =
      capture_log(fn ->
        assert {:ok, %{engine: :burn, ref: :burn_ref, auto: true}} =
                 load(model, fake_load(), timings(10.0, 50.0))
      end)

    assert loads() == [:candle, :burn]

    assert log =~
             "model on {:cpu, 0} starts on Burn: Burn measured faster or level (the workload took 10.0 ms on Burn, 50.0 ms on Candle); later loads reuse this choice"

    assert [file] = File.ls!(cache)

    assert %{"engine" => "burn", "burn_ms" => 10.0, "candle_ms" => 50.0} =
             ExBurn.JSON.decode!(File.read!(Path.join(cache, file)))

    # the stored choice: no measuring, no Candle load
    no_timing = fn ref -> flunk("measured #{inspect(ref)} again") end
    assert {:ok, %{engine: :burn}} = load(model, fake_load(), no_timing)
    assert loads() == [:burn]
  end

  test "Candle is picked when it takes under 90% of Burn's time, and its choice is kept", %{model: model} do
    capture_log(fn ->
      assert {:ok, %{engine: :candle, ref: {:candle_ref, ^model}, auto: true, device: @cpu}} =
               load(model, fake_load(), timings(50.0, 10.0))
    end)

    # measured one at a time, then Candle loaded for good
    assert loads() == [:candle, :burn, :candle]
    assert {:ok, %{engine: :candle}} = load(model, fake_load(), nil)
    assert loads() == [:candle]
  end

  test "a Candle time within the margin keeps Burn", %{model: model} do
    capture_log(fn -> assert {:ok, %{engine: :burn}} = load(model, fake_load(), timings(50.0, 46.0)) end)
  end

  test "Candle failing to load keeps Burn, and says why", %{model: model} do
    log =
      capture_log(fn -> assert {:ok, %{engine: :burn}} = load(model, fake_load(false), timings(10.0, 1.0)) end)

    assert log =~
             "starts on Burn: Candle could not run it: candle: unsupported architecture (the workload took - on Burn, - on Candle)"

    assert loads() == [:candle, :burn]
  end

  test "a stored Candle choice whose load now fails takes the usual chain", %{model: model} do
    capture_log(fn -> load(model, fake_load(), timings(50.0, 10.0)) end)
    loads()
    assert {:ok, %{engine: :burn}} = load(model, fake_load(false), nil)
    assert loads() == [:candle, :burn]
  end

  test "a changed model file is measured again", %{model: model} do
    capture_log(fn -> load(model, fake_load(), timings(10.0, 50.0)) end)
    File.write!(model, "other weights")
    loads()
    capture_log(fn -> assert {:ok, %{engine: :candle}} = load(model, fake_load(), timings(50.0, 10.0)) end)
    assert loads() == [:candle, :burn, :candle]
  end

  test "each device has its own choice, measured only where both engines run", %{model: model} do
    capture_log(fn -> load(model, fake_load(), timings(10.0, 50.0)) end)
    loads()

    for {kind, _} = device <- [{:vulkan, 0}, {:cuda, 0}] do
      both = kind in Pretrained.candle_kinds() and kind in ExBurn.Device.compiled_kinds()
      capture_log(fn -> Pretrained.load(:llm, model, [device: device], fake_load(), timings(10.0, 50.0)) end)
      assert loads() == if(both, do: [:candle, :burn], else: [:burn]), inspect(device)
    end
  end

  test "an unwritable cache still loads, and says the choice was not kept", %{model: model, cache: cache} do
    File.write!(cache, "a file where the directory goes")

    log =
      capture_log(fn -> assert {:ok, %{engine: :burn}} = load(model, fake_load(), timings(10.0, 50.0)) end)

    assert log =~ "the choice could not be stored"
  end

  test "burn_first keeps Burn first without measuring", %{model: model} do
    System.put_env("EXBURN_ENGINE_CHOICE", "burn_first")
    assert {:ok, %{engine: :burn}} = load(model, fake_load(), fn _ -> flunk("measured") end)
    assert loads() == [:burn]
  end

  test "an unknown choice is the load's error", %{model: model} do
    System.put_env("EXBURN_ENGINE_CHOICE", "fastest")

    assert {:error, %ExBurn.Error{op: :load, details: %{kind: :invalid_option, engine_choice: "fastest"}}} =
             load(model, fake_load(), nil)

    assert loads() == []
  end

  test "an explicit engine is never measured", %{model: model} do
    assert {:ok, %{engine: :burn}} =
             Pretrained.load(:llm, model, [engine: :burn, device: @cpu], fake_load(), fn _ ->
               flunk("measured")
             end)

    assert loads() == [:burn]
  end

  @tag :telemetry
  test "the choice emits [:ex_burn, :pretrained, :engine_choice]", %{model: model} do
    ref = make_ref()

    ExBurn.TestHelpers.with_telemetry([:ex_burn, :pretrained, :engine_choice], ref, fn ->
      capture_log(fn -> load(model, fake_load(), timings(50.0, 10.0)) end)
    end)

    assert_received {^ref, [:ex_burn, :pretrained, :engine_choice], %{burn_ms: 50.0, candle_ms: 10.0},
                     %{model: "model", device: @cpu, engine: :candle, stored: true}}
  end
end
