defmodule ExBurn.Pretrained.EnginePolicyTest do
  # The :auto policy (Burn first, then Candle), driven by fake engines so every branch
  # is reached without a model whose Burn load happens to fail.
  use ExUnit.Case, async: false
  import ExUnit.CaptureLog

  alias ExBurn.Pretrained

  @moduletag :tmp_dir

  defp fake_load(burn_result) do
    parent = self()

    fn path, %{engine: engine, device: device} ->
      send(parent, {:loaded, engine, device})
      if engine == :burn, do: burn_result, else: {:ok, {:candle_ref, path}}
    end
  end

  # A model :auto loaded on Burn (what Pretrained.load returns), for the call-time policy.
  defp auto_burn_model(dir),
    do: %{ref: :burn_ref, engine: :burn, auto: true, path: Path.join(dir, "m"), name: "m", device: {:cpu, 0}}

  defp lacks_feature,
    do: {:error, {:llm_load, "burn: unsupported rope scaling `yarn`", %{kind: :unsupported_feature}}}

  test "Burn is tried first and kept when it loads", %{tmp_dir: dir} do
    assert {:ok, %{engine: :burn, auto: true, ref: :burn_ref}} =
             Pretrained.load(:llm, dir, [], fake_load({:ok, :burn_ref}))

    assert_received {:loaded, :burn, _}
    refute_received {:loaded, :candle, _}
  end

  test "a feature Burn lacks falls back to Candle: logged and counted", %{tmp_dir: dir} do
    before = Pretrained.fallback_count()

    log =
      capture_log(fn ->
        assert {:ok, %{engine: :candle, auto: true, device: {:cpu, 0}, ref: {:candle_ref, ^dir}}} =
                 Pretrained.load(:llm, dir, [], fake_load(lacks_feature()))
      end)

    assert log =~ "llm_load failed on Burn (burn: unsupported rope scaling `yarn`); falling back to Candle"
    assert Pretrained.fallback_count() == before + 1
    assert_received {:loaded, :burn, _}
    assert_received {:loaded, :candle, {:cpu, 0}}
  end

  test "from a GPU, Candle takes that GPU where it runs there, else the CPU", %{tmp_dir: dir} do
    gpu = {:cuda, 0}
    on_gpu = :cuda in Pretrained.candle_kinds()

    capture_log(fn ->
      assert {:ok, %{engine: :candle, device: device}} =
               Pretrained.load(:llm, dir, [device: gpu], fake_load(lacks_feature()))

      assert device == if(on_gpu, do: gpu, else: {:cpu, 0})
    end)

    assert_received {:loaded, :burn, ^gpu}
    assert_received {:loaded, :candle, first}
    assert first == if(on_gpu, do: gpu, else: {:cpu, 0})
    refute_received {:loaded, :candle, _}
  end

  test "Candle failing on a GPU gives way to Candle on the CPU", %{tmp_dir: dir} do
    parent = self()

    load = fn path, %{engine: engine, device: device} ->
      send(parent, {:loaded, engine, device})

      case {engine, device} do
        {:candle, {:cpu, 0}} -> {:ok, {:candle_ref, path}}
        _ -> {:error, {:llm_load, "#{engine}: out of memory", %{kind: :engine_error}}}
      end
    end

    before = Pretrained.fallback_count()

    log =
      capture_log(fn ->
        assert {:ok, %{engine: :candle, device: {:cpu, 0}}} =
                 Pretrained.load(:llm, dir, [device: {:cuda, 0}], load)
      end)

    assert_received {:loaded, :burn, {:cuda, 0}}

    if :cuda in Pretrained.candle_kinds() do
      assert_received {:loaded, :candle, {:cuda, 0}}

      assert log =~
               "failed on Candle on {:cuda, 0} (candle: out of memory); falling back to Candle on the CPU"

      assert Pretrained.fallback_count() == before + 2
    else
      assert Pretrained.fallback_count() == before + 1
    end

    assert_received {:loaded, :candle, {:cpu, 0}}
  end

  test "Candle without a device takes the CPU unless it runs on the default device's kind", %{tmp_dir: dir} do
    {kind, _} = default = ExBurn.Device.resolve(ExBurn.Device.default())
    expected = if kind in Pretrained.candle_kinds(), do: default, else: {:cpu, 0}

    assert {:ok, %{engine: :candle, device: ^expected}} =
             Pretrained.load(:llm, dir, [engine: :candle], fake_load(nil))

    assert_received {:loaded, :candle, ^expected}
  end

  test "broken files and bad input never fall back", %{tmp_dir: dir} do
    before = Pretrained.fallback_count()

    for kind <- [:truncated_file, :corrupt_gguf, :missing_file, :bad_config, :argument] do
      err = {:error, {:llm_load, "broken", %{kind: kind}}}

      assert {:error, %ExBurn.Error{op: :llm_load, details: %{kind: ^kind}}} =
               Pretrained.load(:llm, dir, [], fake_load(err))

      refute_received {:loaded, :candle, _}
    end

    assert Pretrained.fallback_count() == before
  end

  test "an explicit engine never falls back", %{tmp_dir: dir} do
    assert {:error, %ExBurn.Error{details: %{kind: :unsupported_feature}}} =
             Pretrained.load(:llm, dir, [engine: :burn], fake_load(lacks_feature()))

    refute_received {:loaded, :candle, _}
  end

  test "a call that fails on Burn is retried on Candle, which later calls keep using", %{tmp_dir: dir} do
    model = auto_burn_model(dir)

    before = Pretrained.fallback_count()

    run = fn
      :burn_ref -> {:error, {:llm_next, "burn: kernel failed", %{kind: :engine_error}}}
      {:candle_ref, _} -> {:ok, :from_candle}
    end

    capture_log(fn ->
      assert {:ok, :from_candle, %{engine: :candle, ref: {:candle_ref, _}}} =
               Pretrained.call(model, :llm_generate, fake_load(nil), run)
    end)

    assert Pretrained.fallback_count() == before + 1
    # the same (Burn) model goes straight to its Candle twin: no second failure, no second load
    assert {:ok, :from_candle, %{engine: :candle}} =
             Pretrained.call(model, :llm_generate, fake_load(nil), run)

    assert Pretrained.fallback_count() == before + 1
    assert_received {:loaded, :candle, _}
    refute_received {:loaded, :candle, _}
  end

  test "a call failing on the caller's input is not retried", %{tmp_dir: dir} do
    model = auto_burn_model(dir)

    for details <- [%{kind: :empty_prompt}, %{kind: :prompt_too_long}, %{argument: "ids", expected: "a list"}] do
      run = fn :burn_ref -> {:error, {:llm_start, "bad input", details}} end

      assert {:error, %ExBurn.Error{op: :llm_start, details: ^details}} =
               Pretrained.call(model, :x, fake_load(nil), run)
    end

    refute_received {:loaded, _, _}
  end

  test "unknown engines and non-string names are errors", %{tmp_dir: dir} do
    assert {:error, %ExBurn.Error{details: %{kind: :invalid_option}}} =
             Pretrained.load(:llm, dir, [engine: :tpu], fake_load(nil))

    assert {:error, %ExBurn.Error{details: %{kind: :argument}}} =
             Pretrained.load(:llm, 42, [], fake_load(nil))
  end

  @tag :telemetry
  test "a fallback emits [:ex_burn, :pretrained, :fallback]", %{tmp_dir: dir} do
    ref = make_ref()

    ExBurn.TestHelpers.with_telemetry([:ex_burn, :pretrained, :fallback], ref, fn ->
      capture_log(fn -> Pretrained.load(:llm, dir, [], fake_load(lacks_feature())) end)
    end)

    assert_received {^ref, [:ex_burn, :pretrained, :fallback], %{count: 1},
                     %{op: :llm_load, from: :burn, to: :candle, model: _, reason: "burn: unsupported" <> _}}
  end
end
