defmodule ExBurn.Model.ConfigTest do
  # The training configuration and the layers cross the NIF as typed terms (rustler's derives):
  # Elixir fills every default once, and the NIF takes nothing less, nothing more and no alias.
  use ExUnit.Case, async: true

  alias ExBurn.{Model, Native}
  alias ExBurn.Model.Spec
  import ExBurn.ModelTestData

  @moduletag :tmp_dir

  @documented %{
    loss: :mse,
    optimizer: :adam,
    learning_rate: 1.0e-3,
    weight_decay: nil,
    momentum: nil,
    beta1: 0.9,
    beta2: 0.999,
    epsilon: 1.0e-8,
    clip_norm: nil,
    clip_value: nil
  }

  defp net, do: Model.input({nil, 2}) |> Model.dense(4, activation: :tanh) |> Model.dense(2)

  defp native_new(layers, config),
    do: Native.model_new(layers, [2], false, config, {:cpu, 0}, 1)

  defp layers, do: Spec.native_layers(net())

  describe "defaults, filled in Elixir" do
    test "compile/2 without options records every documented default" do
      assert Model.compile(net()).config == @documented
      assert Model.config!([]) == @documented
    end

    test "nil takes the default; AdamW's weight decay defaults to 1.0e-4 and 0 turns it off" do
      assert Model.config!(learning_rate: nil, beta2: nil, loss: nil) == @documented
      assert Model.compile(net(), seed: nil).seed == 42
      assert Model.config!(optimizer: :adamw).weight_decay == 1.0e-4
      assert Model.config!(optimizer: :adamw, weight_decay: nil).weight_decay == 1.0e-4
      assert Model.config!(optimizer: :adamw, weight_decay: 0).weight_decay == 0.0
      assert Model.config!(optimizer: :sgd).weight_decay == nil
      assert Model.config!(optimizer: :rmsprop, decay: 0.5).beta1 == 0.5
    end

    test "the native side has no defaults: a configuration missing a key is refused" do
      for key <- Map.keys(@documented) do
        assert {:error, {:compile, reason, %{argument: "config"}}} =
                 native_new(layers(), Map.delete(@documented, key))

        assert reason =~ "config", "#{key}: #{reason}"
      end

      assert {:ok, {ref, _info}} = native_new(layers(), @documented)
      assert is_reference(ref)
    end

    test "a model saved with no AdamW weight decay recorded loads with today's default", %{tmp_dir: dir} do
      model = Model.compile(net(), optimizer: :adamw)
      path = Path.join(dir, "adamw.model")
      :ok = Model.save(%{model | config: %{model.config | weight_decay: nil}}, path)
      assert Model.load!(path).config.weight_decay == 1.0e-4
    end
  end

  describe ":categorical_cross_entropy" do
    test "is an alias of :cross_entropy in Elixir: recorded as it and trained the same" do
      {x, y} = xor()

      fit = fn loss ->
        net() |> Model.compile(loss: loss, seed: 5) |> Model.fit({x, y}, epochs: 3, batch_size: 4)
      end

      alias = fit.(:categorical_cross_entropy)
      plain = fit.(:cross_entropy)
      assert alias.config.loss == :cross_entropy
      assert alias.config == plain.config
      assert Enum.map(alias.history, & &1.loss) == Enum.map(plain.history, & &1.loss)
    end

    test "is not a native name: the NIF takes one name per loss" do
      config = %{@documented | loss: :categorical_cross_entropy}
      assert {:error, {:compile, reason, %{argument: "config"}}} = native_new(layers(), config)
      assert reason =~ "loss"
    end

    test "other losses are still rejected, naming the option" do
      e = assert_raise ExBurn.Error, fn -> Model.compile(net(), loss: :hinge) end
      assert e.details.option == :loss
      assert e.reason =~ ":categorical_cross_entropy"
    end
  end

  describe "the NIF rejects what it does not know" do
    test "an unknown configuration key is named" do
      assert {:error, {:compile, reason, details}} =
               native_new(layers(), Map.put(@documented, :learning_rte, 0.1))

      assert reason == "unknown key :learning_rte in config"
      assert details == %{argument: "config", key: "learning_rte"}
    end

    test "a value of the wrong kind is named by its key" do
      assert {:error, {:compile, reason, _}} = native_new(layers(), %{@documented | beta1: "high"})
      assert reason =~ "beta1"
      assert {:error, {:compile, reason, _}} = native_new(layers(), %{@documented | optimizer: :lbfgs})
      assert reason =~ "optimizer"
    end

    test "layers: unknown kinds and keys, missing keys and junk name the layer" do
      cases = [
        {[{:dense, %{units: 2, use_bias: true, bias: false}}], "unknown key :bias in layer", %{key: "bias"}},
        {[{:dense, %{units: 2}}], "use_bias", %{}},
        {[{:conv3d, %{filters: 2}}], "unknown layer :conv3d", %{variant: "conv3d"}},
        {[:flatten, {:activation, :swish}], "invalid layer", %{index: 1}},
        {[{:dense, [units: 2, use_bias: true]}], "layer", %{}},
        {[{:max_pool, %{kernel_size: 2, strides: [2]}}], "kernel_size", %{}}
      ]

      for {layers, text, details} <- cases do
        assert {:error, {:compile, reason, got}} = native_new(layers, @documented)
        assert reason =~ text, inspect(layers)
        assert Map.take(got, Map.keys(details)) == details, inspect({layers, got})
      end

      for junk <- [
            :junk,
            "layers",
            %{},
            [[]],
            [{}],
            [{:dense}],
            [self()],
            [{:dense, %{units: -1, use_bias: true}}]
          ] do
        assert {:error, {:compile, reason, _}} = native_new(junk, @documented)
        assert is_binary(reason)
      end
    end

    test "the configuration itself may be any junk: an error tuple, never a crash" do
      for junk <- [:junk, "config", [], [loss: :mse], {1, 2}, %{1 => 2}, self(), make_ref()] do
        assert {:error, {:compile, reason, %{argument: "config"}}} = native_new(layers(), junk)
        assert is_binary(reason)
      end
    end

    test "schedules and clipping are typed too" do
      model = Model.compile(net())

      assert {:ok, :ok} = Native.model_set_schedule(model.ref, {:step, 0.1, 2, 0.5})
      assert {:ok, :ok} = Native.model_set_schedule(model.ref, nil)

      for junk <- [{:step, 0.1, 2}, {:linear, 0.1}, {:cosine, 0.1, 0.0}, {:step, 0.1, :x, 0.5}, :step, %{}] do
        assert {:error, {:fit, reason, %{argument: "lr_schedule"}}} =
                 Native.model_set_schedule(model.ref, junk)

        assert is_binary(reason)
      end

      assert {:ok, :ok} = Native.model_configure(model.ref, %{clip_norm: 1.0, clip_value: nil})

      assert {:error, {:fit, "unknown key :learning_rate in clipping", _}} =
               Native.model_configure(model.ref, %{clip_norm: nil, clip_value: nil, learning_rate: 0.1})

      assert {:error, {:fit, _, %{argument: "clipping"}}} =
               Native.model_configure(model.ref, %{clip_norm: 1.0})
    end
  end

  describe "layers as the NIF reads them" do
    test "sizes become lists, activations are tagged, option-less layers are bare names" do
      spec =
        Model.input({nil, 8, 8, 1})
        |> Model.conv2d(2, kernel_size: {3, 2}, strides: 1, activation: :relu)
        |> Model.max_pool(kernel_size: 2)
        |> Model.leaky_relu(alpha: 0.2)
        |> Model.flatten()
        |> Model.dense(3, use_bias: false)

      assert Spec.native_layers(spec) == [
               {:conv2d, %{filters: 2, kernel_size: [3, 2], strides: [1], padding: :valid}},
               {:activation, :relu},
               {:max_pool, %{kernel_size: [2], strides: [2]}},
               {:activation, {:leaky_relu, 0.2}},
               :flatten,
               {:dense, %{units: 3, use_bias: false}}
             ]

      assert %Model{} = Model.compile(spec)
    end

    test "a convolution size with more entries than spatial axes is an error, not truncated" do
      spec = Model.input({nil, 8, 1}) |> Model.conv1d(2, kernel_size: {3, 4})
      e = assert_raise ExBurn.Error, fn -> Model.compile(spec) end
      assert e.op == :compile and e.reason =~ "kernel and stride sizes"
    end
  end
end
