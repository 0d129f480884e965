defmodule ExBurn.MathModeTest do
  # Changes the VM-wide math mode.
  use ExUnit.Case, async: false

  alias ExBurn.Tensor

  # the mode is the CPU kernels' (guides/configuration.md), whatever the default device is
  @cpu {:cpu, 0}

  setup do
    previous = ExBurn.math()
    on_exit(fn -> ExBurn.Precision.set_math!(previous) end)
  end

  # {op, f64 reference, input, glibc's (libm's for erf) f32 result at that input: not the
  # correctly rounded one's neighbour the fast kernel gives there}
  @cases [
    {:exp, &:math.exp/1, 0x40504A5D, 0x41CF42E5},
    {:log, &:math.log/1, 0x409897C2, 0x3FC7F0D5},
    {:tanh, &:math.tanh/1, 0x3EDBBB3B, 0x3ECF2A8C},
    {:erf, &:math.erf/1, 0x3FC095CE, 0x3F77760E},
    {:sigmoid, &__MODULE__.sigmoid/1, 0xBFD7C372, 0x3E2019D1}
  ]

  def sigmoid(x), do: 1 / (1 + :math.exp(-x))

  defp f32(bits), do: <<bits::32-native>> |> then(fn <<x::float-32-native>> -> x end)
  defp bits(x), do: <<x::float-32-native>> |> then(fn <<b::32-native>> -> b end)
  defp round_f32(x), do: <<x::float-32-native>> |> then(fn <<y::float-32-native>> -> y end)
  defp floats(t), do: for(<<x::float-32-native <- Tensor.to_binary(t)>>, do: x)

  # the ordered integer of an f32, so neighbours differ by 1 (also across zero)
  defp key(x) do
    b = bits(x)
    if b >= 0x80000000, do: -(b - 0x80000000), else: b
  end

  defp ulps(a, b), do: abs(key(a) - key(b))

  # f32 inputs spread over [-9, 9] (positive for log)
  defp inputs(op) do
    xs = for i <- 0..4095, do: :math.sin(i * 0.37) * 9.0
    xs = if op == :log, do: Enum.map(xs, &(abs(&1) + 1.0e-3)), else: xs
    Tensor.tensor(xs, type: :f32, device: @cpu)
  end

  defp run(op, x), do: apply(Tensor, op, [x])

  test "the default is :exact: glibc's bits" do
    assert ExBurn.math() == :exact

    for {op, _ref, input, glibc} <- @cases do
      assert [y] = floats(run(op, Tensor.tensor([f32(input)], type: :f32, device: @cpu)))
      assert bits(y) == glibc, "#{op}"
    end
  end

  test "configure!(math: :fast) changes f32 results within 2 ulp; :exact restores glibc's bits" do
    exact = Map.new(@cases, fn {op, _, _, _} -> {op, Tensor.to_binary(run(op, inputs(op)))} end)
    device = ExBurn.default_device()
    assert ExBurn.configure!(math: :fast) == device
    assert ExBurn.math() == :fast
    assert ExBurn.default_device() == device

    for {op, ref, input, glibc} <- @cases do
      x = inputs(op)
      fast = run(op, x)
      assert Tensor.type(fast) == {:f, 32} and Tensor.shape(fast) == {4096}
      assert Tensor.to_binary(fast) != exact[op], "#{op}: fast mode gave the exact bits"

      for {x, y} <- Enum.zip(floats(x), floats(fast)) do
        want = x |> ref.() |> round_f32()
        assert ulps(y, want) <= 2, "#{op}(#{x}) = #{y}, correctly rounded #{want}"
      end

      assert [y] = floats(run(op, Tensor.tensor([f32(input)], type: :f32, device: @cpu)))
      assert bits(y) != glibc and ulps(y, f32(glibc)) <= 2, "#{op}"
    end

    # f64 keeps the exact kernels
    x64 = Tensor.tensor([1.5, 2.5], type: :f64, device: @cpu)
    assert Tensor.to_flat_list(Tensor.exp(x64)) == [:math.exp(1.5), :math.exp(2.5)]

    assert ExBurn.configure!(math: :exact) == device
    assert ExBurn.math() == :exact

    for {op, _ref, input, glibc} <- @cases do
      assert Tensor.to_binary(run(op, inputs(op))) == exact[op], "#{op}"
      assert [y] = floats(run(op, Tensor.tensor([f32(input)], type: :f32, device: @cpu)))
      assert bits(y) == glibc
    end
  end

  test "special values give the exact mode's bits in fast mode" do
    specials = Tensor.tensor([0.0, -0.0, :infinity, :neg_infinity, :nan], type: :f32, device: @cpu)
    exact = for {op, _, _, _} <- @cases, do: Tensor.to_binary(run(op, specials))
    ExBurn.configure!(math: :fast)
    assert for({op, _, _, _} <- @cases, do: Tensor.to_binary(run(op, specials))) == exact
    # exp overflows and underflows at the same inputs
    assert Tensor.to_flat_list(Tensor.exp(Tensor.tensor([88.8, -104.0, 88.7], type: :f32, device: @cpu)))
           |> Enum.take(2) ==
             [:infinity, 0.0]

    assert Tensor.to_flat_list(Tensor.log(Tensor.tensor([-1.0], type: :f32, device: @cpu))) == [:nan]
  end

  if Code.ensure_loaded?(Nx) do
    @tag :nx
    test "compiled softmax takes the fast exp in fast mode; compiled layer norm is the same in both" do
      x =
        Nx.iota({64, 100}, type: :f32, backend: {ExBurn.Backend, device: @cpu})
        |> Nx.multiply(0.37)
        |> Nx.sin()
        |> Nx.multiply(9)

      softmax = fn x ->
        e = Nx.exp(Nx.subtract(x, Nx.reduce_max(x, axes: [-1], keep_axes: true)))
        Nx.divide(e, Nx.sum(e, axes: [-1], keep_axes: true))
      end

      layer_norm = fn x ->
        c = Nx.subtract(x, Nx.mean(x, axes: [-1], keep_axes: true))
        Nx.multiply(c, Nx.rsqrt(Nx.add(Nx.mean(Nx.multiply(c, c), axes: [-1], keep_axes: true), 1.0e-5)))
      end

      run = fn f -> Nx.Defn.jit(f, compiler: ExBurn).(x) |> Nx.to_binary() end
      {exact_softmax, exact_norm} = {run.(softmax), run.(layer_norm)}
      ExBurn.configure!(math: :fast)
      {fast_softmax, fast_norm} = {run.(softmax), run.(layer_norm)}
      assert fast_softmax != exact_softmax
      assert fast_norm == exact_norm

      pairs =
        Enum.zip(
          for(<<a::float-32-native <- fast_softmax>>, do: a),
          for(<<b::float-32-native <- exact_softmax>>, do: b)
        )

      # the exp's 2 ulp, the reciprocal and the product against the exact form's division
      assert Enum.all?(pairs, fn {a, b} -> ulps(a, b) <= 4 end)
      ExBurn.configure!(math: :exact)
      assert run.(softmax) == exact_softmax
    end
  end

  test "a bad mode raises ExBurn.Error and changes nothing" do
    device = ExBurn.default_device()

    for bad <- [:quick, "fast", nil, 1, {:fast}] do
      error = assert_raise ExBurn.Error, fn -> ExBurn.configure!(math: bad) end
      assert error.op == :configure
      assert ExBurn.math() == :exact
    end

    # with a device too: neither changes
    assert_raise ExBurn.Error, fn -> ExBurn.configure!(device: :cpu, math: :quick) end
    assert ExBurn.default_device() == device
    assert_raise ExBurn.Error, fn -> ExBurn.configure!(math: :fast, matmul_precision: :medium) end
    assert ExBurn.math() == :exact
    assert {:error, {:configure, reason, _}} = ExBurn.Native.set_math_mode(:quick)
    assert reason =~ "math"
  end
end
