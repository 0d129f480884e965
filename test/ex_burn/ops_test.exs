defmodule ExBurn.OpsTest do
  use ExUnit.Case, async: true
  import ExBurn.TestHelpers
  alias ExBurn.Tensor, as: T

  describe "creation" do
    test "zeros, ones, full" do
      assert_tensor(T.zeros({2, 2}, :s16), {2, 2}, :s16, [0, 0, 0, 0])
      assert_tensor(T.ones([3], :u64), {3}, :u64, [1, 1, 1])
      assert_tensor(T.ones({}, :f64), {}, :f64, [1.0])
      assert_tensor(T.full(2.5, {1, 2}, :bf16), {1, 2}, :bf16, [2.5, 2.5])
      assert_tensor(T.full(-7, {2}, :s8), {2}, :s8, [-7, -7])
      assert_tensor(T.full(:infinity, {1}, :f32), {1}, :f32, [:infinity])
      assert_tensor(T.full(:nan, {1}, :f16), {1}, :f16, [:nan])
      assert_tensor(T.full(3, {2}, :f32), {2}, :f32, [3.0, 3.0])
    end

    test "iota" do
      assert_tensor(T.iota({2, 3}, :s32), {2, 3}, :s32, [0, 1, 2, 3, 4, 5])
      assert_tensor(T.iota({2, 3}, :s64, axis: 1), {2, 3}, :s64, [0, 1, 2, 0, 1, 2])
      assert_tensor(T.iota({2, 3}, :u8, axis: 0), {2, 3}, :u8, [0, 0, 0, 1, 1, 1])
      assert_tensor(T.iota({2, 3}, :f32, axis: -1), {2, 3}, :f32, [0.0, 1.0, 2.0, 0.0, 1.0, 2.0])
      assert_tensor(T.iota({}, :s32), {}, :s32, [0])
    end

    test "eye" do
      assert_tensor(T.eye(2, :s32), {2, 2}, :s32, [1, 0, 0, 1])
      assert_tensor(T.eye({2, 3}, :f32), {2, 3}, :f32, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
      assert_tensor(T.eye({2, 2, 2}, :u8), {2, 2, 2}, :u8, [1, 0, 0, 1, 1, 0, 0, 1])
    end

    test "to_device keeps the data" do
      t = t([1, 2, 3], :s32)
      assert_tensor(T.to_device(t, :cpu), {3}, :s32, [1, 2, 3])
      assert T.to_device(t, {:cpu, 0}).device == {:cpu, 0}
    end

    test "devices lists the cpu" do
      assert %{kind: :cpu, index: 0, name: name, dtypes: dtypes} =
               Enum.find(ExBurn.devices(), &(&1.kind == :cpu))

      assert is_binary(name)
      assert {:f, 32} in dtypes
      # the default is the CPU unless a GPU is compiled in or EXBURN_DEVICE names one (GPU runs)
      if Enum.all?(ExBurn.devices(), &(&1.kind == :cpu)) and ExBurn.Env.env(:device) == nil,
        do: assert(ExBurn.default_device() == {:cpu, 0})

      assert ExBurn.Native.supports_type({:cpu, 0}, {:f, 32}) == {:ok, true}
      assert Enum.all?(ExBurn.Type.all(), &ExBurn.supports_type?(:cpu, &1))
    end
  end

  describe "binary arithmetic" do
    test "add, subtract, multiply, max, min on integers" do
      a = t([1, -2, 3], :s32)
      b = t([10, 20, -30], :s32)
      assert_tensor(T.add(a, b), {3}, :s32, [11, 18, -27])
      assert_tensor(T.subtract(a, b), {3}, :s32, [-9, -22, 33])
      assert_tensor(T.multiply(a, b), {3}, :s32, [10, -40, -90])
      assert_tensor(T.max(a, b), {3}, :s32, [10, 20, 3])
      assert_tensor(T.min(a, b), {3}, :s32, [1, -2, -30])
    end

    test "float arithmetic" do
      a = t([1.5, -2.0], :f64)
      b = t([0.5, 4.0], :f64)
      assert_close(T.add(a, b), {2}, :f64, [2.0, 2.0])
      assert_close(T.multiply(a, b), {2}, :f64, [0.75, -8.0])
      assert_close(T.divide(a, b), {2}, :f64, [3.0, -0.5])
      assert_close(T.pow(t([4.0, 2.0], :f32), t([0.5, 3.0], :f32)), {2}, :f32, [2.0, 8.0])
    end

    test "divide makes integers floating, by-zero gives infinities" do
      assert_close(T.divide(t([1, 2, 3], :s32), t([2, 2, 2], :s32)), {3}, :f32, [0.5, 1.0, 1.5])

      assert_close(T.divide(t([1.0, -1.0, 0.0], :f32), t([0.0, 0.0, 0.0], :f32)), {3}, :f32, [
        :infinity,
        :neg_infinity,
        :nan
      ])
    end

    test "pow of integers stays integer" do
      assert_tensor(T.pow(t([2, 3, -2], :s32), t([3, 2, 3], :s32)), {3}, :s32, [8, 9, -8])
      assert_tensor(T.pow(t([2, 3], :u8), 2), {2}, :u8, [4, 9])
    end

    test "remainder has the sign of the dividend" do
      assert_tensor(T.remainder(t([-7, 7, -7, 7], :s32), t([3, 3, -3, -3], :s32)), {4}, :s32, [-1, 1, -1, 1])

      assert_close(T.remainder(t([-7.5, 7.5, -7.5], :f32), t([2.0, -2.0, -2.0], :f32)), {3}, :f32, [
        -1.5,
        1.5,
        -1.5
      ])

      assert_tensor(T.remainder(t([-7, 8], :s64), 3), {2}, :s64, [-1, 2])
    end

    test "quotient truncates toward zero" do
      assert_tensor(T.quotient(t([-7, 7, -7, 7], :s32), t([3, 3, -3, -3], :s32)), {4}, :s32, [-2, 2, 2, -2])
      assert_tensor(T.quotient(t([255, 7], :u8), t([2, 7], :u8)), {2}, :u8, [127, 1])
    end

    test "integer division by zero raises" do
      for op <- [:quotient, :remainder], type <- [:s32, :u8, :s64] do
        error = assert_raise ExBurn.Error, fn -> apply(T, op, [t([1, 2], type), t([1, 0], type)]) end
        assert error.op == op
      end
    end

    test "atan2" do
      assert_close(T.atan2(t([1.0, -1.0], :f32), t([1.0, -1.0], :f32)), {2}, :f32, [
        :math.atan2(1.0, 1.0),
        :math.atan2(-1.0, -1.0)
      ])

      assert_close(T.atan2(t([0, 1], :s32), t([1, 0], :s32)), {2}, :f32, [0.0, :math.pi() / 2])
    end

    test "comparisons return u8" do
      a = t([1, 2, 3], :s32)
      b = t([2, 2, 2], :s32)
      assert_tensor(T.equal(a, b), {3}, :u8, [0, 1, 0])
      assert_tensor(T.not_equal(a, b), {3}, :u8, [1, 0, 1])
      assert_tensor(T.greater(a, b), {3}, :u8, [0, 0, 1])
      assert_tensor(T.less(a, b), {3}, :u8, [1, 0, 0])
      assert_tensor(T.greater_equal(a, b), {3}, :u8, [0, 1, 1])
      assert_tensor(T.less_equal(a, b), {3}, :u8, [1, 1, 0])
      # compared in the merged type: 0.5 is not truncated
      assert_tensor(T.less(t([0, 1], :s32), 0.5), {2}, :u8, [1, 0])
      assert_tensor(T.equal(t([1.5, 2.0], :f32), t([1, 2], :s8)), {2}, :u8, [0, 1])
    end

    test "logical ops return u8" do
      a = t([0, 1, 2, 0], :s32)
      b = t([0, 0, 3, 5], :s32)
      assert_tensor(T.logical_and(a, b), {4}, :u8, [0, 0, 1, 0])
      assert_tensor(T.logical_or(a, b), {4}, :u8, [0, 1, 1, 1])
      assert_tensor(T.logical_xor(a, b), {4}, :u8, [0, 1, 0, 1])
      assert_tensor(T.logical_and(t([0.0, 0.5], :f32), t([1.0, 1.0], :f32)), {2}, :u8, [0, 1])
    end

    test "bitwise ops" do
      a = t([12, 10, -16], :s32)
      b = t([10, 6, 2], :s32)
      assert_tensor(T.bitwise_and(a, b), {3}, :s32, [8, 2, 0])
      assert_tensor(T.bitwise_or(a, b), {3}, :s32, [14, 14, -14])
      assert_tensor(T.bitwise_xor(a, b), {3}, :s32, [6, 12, -14])
      assert_tensor(T.left_shift(t([1, 3], :s32), t([2, 1], :s32)), {2}, :s32, [4, 6])
      assert_tensor(T.right_shift(t([16, -16], :s32), t([2, 2], :s32)), {2}, :s32, [4, -4])
      assert_tensor(T.bitwise_and(t([0xF0], :u8), t([0x3C], :u8)), {1}, :u8, [0x30])
    end

    test "broadcasting" do
      m = t([[1, 2, 3], [4, 5, 6]], :s32)
      assert_tensor(T.add(m, t([10, 20, 30], :s32)), {2, 3}, :s32, [11, 22, 33, 14, 25, 36])

      assert_tensor(T.add(t([[1], [2]], :s32), t([[10, 20, 30]], :s32)), {2, 3}, :s32, [
        11,
        21,
        31,
        12,
        22,
        32
      ])

      assert_tensor(T.multiply(m, t(2, :s32)), {2, 3}, :s32, [2, 4, 6, 8, 10, 12])

      assert_tensor(T.subtract(t([[[1]], [[2]]], :s32), m), {2, 2, 3}, :s32, [
        0,
        -1,
        -2,
        -3,
        -4,
        -5,
        1,
        0,
        -1,
        -2,
        -3,
        -4
      ])
    end

    test "type promotion" do
      assert T.add(t([1], :s8), t([1], :u8)).type == {:s, 16}
      assert T.add(t([1], :u8), t([1], :f32)).type == {:f, 32}
      assert T.add(t([1], :s64), t([1], :f32)).type == {:f, 32}
      assert T.add(t([1], :f16), t([1], :f32)).type == {:f, 32}
      assert T.add(t([1], :bf16), t([1], :f64)).type == {:f, 64}
      assert T.add(t([1], :u32), t([1], :s8)).type == {:s, 64}
      assert T.add(t([1], :s8), t([1], :bf16)).type == {:bf, 16}
      assert_tensor(T.add(t([-100], :s8), t([200], :u8)), {1}, :s16, [100])
      assert_close(T.add(t([1], :u8), t([0.5], :f16)), {1}, :f16, [1.5])
    end

    test "numbers are weak operands" do
      assert_tensor(T.add(t([1, 2], :u8), 1), {2}, :u8, [2, 3])
      assert_tensor(T.add(1, t([1, 2], :s16)), {2}, :s16, [2, 3])
      assert_tensor(T.subtract(10, t([1, 2], :s32)), {2}, :s32, [9, 8])
      assert_close(T.add(t([1, 2], :s32), 2.5), {2}, :f32, [3.5, 4.5])
      assert_close(T.multiply(t([1.0, 2.0], :f64), 3), {2}, :f64, [3.0, 6.0])
      assert_close(T.multiply(t([1.0, 2.0], :f16), 0.5), {2}, :f16, [0.5, 1.0])
      assert_tensor(T.add(2, 3), {}, :s32, [5])
      assert_close(T.divide(1, 4), {}, :f32, [0.25])
    end
  end

  describe "unary ops" do
    test "math functions, integers become f32" do
      x = [0.5, 0.25]

      for {op, fun} <- [
            exp: &:math.exp/1,
            expm1: &(:math.exp(&1) - 1),
            log: &:math.log/1,
            log1p: &:math.log(1 + &1),
            sqrt: &:math.sqrt/1,
            rsqrt: &(1 / :math.sqrt(&1)),
            cbrt: &:math.pow(&1, 1 / 3),
            sin: &:math.sin/1,
            cos: &:math.cos/1,
            tan: &:math.tan/1,
            asin: &:math.asin/1,
            acos: &:math.acos/1,
            atan: &:math.atan/1,
            sinh: &:math.sinh/1,
            cosh: &:math.cosh/1,
            tanh: &:math.tanh/1,
            asinh: &:math.asinh/1,
            atanh: &:math.atanh/1,
            sigmoid: &(1 / (1 + :math.exp(-&1))),
            erf: &:math.erf/1,
            erfc: &:math.erfc/1
          ] do
        assert_close(apply(T, op, [t(x, :f32)]), {2}, :f32, Enum.map(x, fun), 1.0e-5)
        assert_close(apply(T, op, [t(x, :f64)]), {2}, :f64, Enum.map(x, fun), 1.0e-9)
      end

      assert_close(T.acosh(t([1.5, 2.0], :f32)), {2}, :f32, [:math.acosh(1.5), :math.acosh(2.0)])

      assert_close(T.exp(t([0, 1], :s32)), {2}, :f32, [1.0, :math.exp(1)])
      assert_close(T.sqrt(t([4, 9], :u8)), {2}, :f32, [2.0, 3.0])
      assert_close(T.cbrt(t([27.0, -8.0], :f32)), {2}, :f32, [3.0, -2.0])
    end

    test "erf_inv" do
      assert_close(
        T.erf_inv(t([0.5, -0.25], :f32)),
        {2},
        :f32,
        [0.4769362762044699, -0.2253120550121781],
        1.0e-4
      )

      assert_close(T.erf_inv(t([0.0], :f64)), {1}, :f64, [0.0])
    end

    test "rounding" do
      x = t([-1.5, -0.5, 0.5, 1.5, 2.5], :f32)
      assert_close(T.floor(x), {5}, :f32, [-2.0, -1.0, 0.0, 1.0, 2.0])
      assert_close(T.ceil(x), {5}, :f32, [-1.0, 0.0, 1.0, 2.0, 3.0])
      # Nx rounds half away from zero
      assert_close(T.round(x), {5}, :f32, [-2.0, -1.0, 1.0, 2.0, 3.0])
      assert_tensor(T.round(t([3, -4], :s32)), {2}, :s32, [3, -4])
    end

    test "abs, negate, sign, square keep the type" do
      x = t([-3, 0, 4], :s32)
      assert_tensor(T.abs(x), {3}, :s32, [3, 0, 4])
      assert_tensor(T.negate(x), {3}, :s32, [3, 0, -4])
      assert_tensor(T.sign(x), {3}, :s32, [-1, 0, 1])
      assert_tensor(T.square(x), {3}, :s32, [9, 0, 16])
      assert_close(T.abs(t([-1.5, 2.0], :f16)), {2}, :f16, [1.5, 2.0])
      assert_close(T.sign(t([-1.5, 0.0, 2.0], :f64)), {3}, :f64, [-1.0, 0.0, 1.0])
    end

    test "predicates return u8" do
      x = t([:nan, 1.0, :infinity, :neg_infinity], :f32)
      assert_tensor(T.is_nan(x), {4}, :u8, [1, 0, 0, 0])
      assert_tensor(T.is_infinity(x), {4}, :u8, [0, 0, 1, 1])
      assert_tensor(T.logical_not(t([0, 2, -1], :s32)), {3}, :u8, [1, 0, 0])
      assert_tensor(T.is_nan(t([1, 2], :s32)), {2}, :u8, [0, 0])
    end

    test "integer bit ops" do
      assert_tensor(T.bitwise_not(t([0, 5], :s32)), {2}, :s32, [-1, -6])
      assert_tensor(T.bitwise_not(t([0, 15], :u8)), {2}, :u8, [255, 240])
      assert_raise ExBurn.Error, fn -> T.bitwise_not(t([1.0], :f32)) end
    end

    test "count_leading_zeros" do
      assert_tensor(T.count_leading_zeros(t([1, 0, -1], :s32)), {3}, :s32, [31, 32, 0])
      assert_tensor(T.count_leading_zeros(t([1, 128], :u8)), {2}, :u8, [7, 0])
    end

    test "population_count" do
      assert_tensor(T.population_count(t([7, -1], :s32)), {2}, :s32, [3, 32])
      assert_tensor(T.population_count(t([255, 16], :u8)), {2}, :u8, [8, 1])
    end
  end

  describe "reductions" do
    setup do
      {:ok, m: t([[1, 2, 3], [4, 5, 6]], :s32)}
    end

    test "sum", %{m: m} do
      assert_tensor(T.sum(m), {}, :s64, [21])
      assert_tensor(T.sum(m, axes: [0]), {3}, :s64, [5, 7, 9])
      assert_tensor(T.sum(m, axes: [1]), {2}, :s64, [6, 15])
      assert_tensor(T.sum(m, axes: [-1]), {2}, :s64, [6, 15])
      assert_tensor(T.sum(m, axes: [1], keep_axes: true), {2, 1}, :s64, [6, 15])
      assert_tensor(T.sum(m, keep_axes: true), {1, 1}, :s64, [21])
      assert_tensor(T.sum(m, axes: [0, 1]), {}, :s64, [21])
      assert_tensor(T.sum(t([200, 100], :u8)), {}, :u64, [300])
      assert_close(T.sum(t([0.5, 0.25], :f16)), {}, :f16, [0.75])
      assert_tensor(T.sum(T.iota({2, 3, 4}, :s32), axes: [0, 2]), {3}, :s64, [60, 92, 124])
    end

    test "product", %{m: m} do
      assert_tensor(T.product(m), {}, :s64, [720])
      assert_tensor(T.product(m, axes: [1]), {2}, :s64, [6, 120])
      assert_close(T.product(t([0.5, 4.0], :f32)), {}, :f32, [2.0])
    end

    test "reduce_max and reduce_min keep the type", %{m: m} do
      assert_tensor(T.reduce_max(m), {}, :s32, [6])
      assert_tensor(T.reduce_max(m, axes: [0]), {3}, :s32, [4, 5, 6])
      assert_tensor(T.reduce_min(m, axes: [1], keep_axes: true), {2, 1}, :s32, [1, 4])
      assert_close(T.reduce_min(t([-1.5, 2.0], :bf16)), {}, :bf16, [-1.5])
    end

    test "mean is floating", %{m: m} do
      assert_close(T.mean(m), {}, :f32, [3.5])
      assert_close(T.mean(m, axes: [0]), {3}, :f32, [2.5, 3.5, 4.5])
      assert_close(T.mean(t([1.0, 2.0], :f64)), {}, :f64, [1.5])
    end

    test "all and any" do
      assert_tensor(T.all(t([[1, 0], [1, 1]], :s32), axes: [1]), {2}, :u8, [0, 1])
      assert_tensor(T.any(t([[0, 0], [0, 1]], :s32), axes: [1]), {2}, :u8, [0, 1])
      assert_tensor(T.all(t([1.0, 2.0], :f32)), {}, :u8, [1])
      assert_tensor(T.any(t([0, 0], :u8)), {}, :u8, [0])
    end

    test "argmax/argmin with tie_break" do
      m = t([[1, 3, 3], [5, 5, 0]], :s32)
      assert_tensor(T.argmax(m, axis: 1), {2}, :s64, [1, 0])
      assert_tensor(T.argmax(m, axis: 1, tie_break: :high), {2}, :s64, [2, 1])
      assert_tensor(T.argmax(m), {}, :s64, [3])
      assert_tensor(T.argmax(m, tie_break: :high), {}, :s64, [4])
      assert_tensor(T.argmin(t([[2, 1, 1], [0, 4, 0]], :s32), axis: -1), {2}, :s64, [1, 0])
      assert_tensor(T.argmin(t([[2, 1, 1], [0, 4, 0]], :s32), axis: 1, tie_break: :high), {2}, :s64, [2, 2])
      assert_tensor(T.argmax(m, axis: 0, keep_axis: true, type: :s32), {1, 3}, :s32, [1, 1, 0])
      assert_tensor(T.argmin(t([0.5, -1.5, 2.0], :f32)), {}, :s64, [1])
    end
  end

  describe "shape ops" do
    test "reshape" do
      assert_tensor(T.reshape(T.iota({6}, :s32), {2, 3}), {2, 3}, :s32, [0, 1, 2, 3, 4, 5])
      assert_tensor(T.reshape(T.iota({6}, :s32), [3, 1, 2]), {3, 1, 2}, :s32, [0, 1, 2, 3, 4, 5])
      assert_tensor(T.reshape(t([5], :s32), {}), {}, :s32, [5])
    end

    test "transpose" do
      m = T.iota({2, 3}, :s32)
      assert_tensor(T.transpose(m), {3, 2}, :s32, [0, 3, 1, 4, 2, 5])
      assert_tensor(T.transpose(m, axes: [0, 1]), {2, 3}, :s32, [0, 1, 2, 3, 4, 5])
      x = T.iota({2, 3, 4}, :s32)
      y = T.transpose(x, axes: [1, 2, 0])
      assert T.shape(y) == {3, 4, 2}
      # y[i][j][k] = x[k][i][j] = k*12 + i*4 + j
      assert list(y) == for(i <- 0..2, j <- 0..3, k <- 0..1, do: k * 12 + i * 4 + j)
    end

    test "broadcast" do
      assert_tensor(T.broadcast(t([1, 2, 3], :s32), {2, 3}), {2, 3}, :s32, [1, 2, 3, 1, 2, 3])
      assert_tensor(T.broadcast(t([1, 2], :s32), {2, 3}, axes: [0]), {2, 3}, :s32, [1, 1, 1, 2, 2, 2])
      assert_tensor(T.broadcast(t(7, :u8), {2}), {2}, :u8, [7, 7])
      assert_tensor(T.broadcast(t([[1], [2]], :s32), {2, 2}), {2, 2}, :s32, [1, 1, 2, 2])
    end

    test "slice with strides and clamped starts" do
      assert_tensor(T.slice(T.iota({10}, :s32), [1], [5], strides: 2), {3}, :s32, [1, 3, 5])
      assert_tensor(T.slice(T.iota({3, 4}, :s32), [1, 1], [2, 2]), {2, 2}, :s32, [5, 6, 9, 10])
      assert_tensor(T.slice(T.iota({10}, :s32), [8], [4]), {4}, :s32, [6, 7, 8, 9])
      assert_tensor(T.slice(T.iota({10}, :s32), [-3], [2]), {2}, :s32, [0, 1])

      assert_tensor(T.slice(T.iota({4, 4}, :s32), [0, 1], [4, 3], strides: [3, 2]), {2, 2}, :s32, [
        1,
        3,
        13,
        15
      ])
    end

    test "concatenate" do
      a = t([[1, 2], [3, 4]], :s32)
      assert_tensor(T.concatenate([a, t([[5, 6]], :s32)]), {3, 2}, :s32, [1, 2, 3, 4, 5, 6])
      assert_tensor(T.concatenate([a, t([[5], [6]], :s32)], axis: 1), {2, 3}, :s32, [1, 2, 5, 3, 4, 6])
      assert_close(T.concatenate([t([1], :s32), t([2.5], :f32)]), {2}, :f32, [1.0, 2.5])
      assert_tensor(T.concatenate([a, a], axis: -1), {2, 4}, :s32, [1, 2, 1, 2, 3, 4, 3, 4])
    end

    test "stack" do
      a = t([1, 2], :s32)
      b = t([3, 4], :s32)
      assert_tensor(T.stack([a, b]), {2, 2}, :s32, [1, 2, 3, 4])
      assert_tensor(T.stack([a, b], axis: 1), {2, 2}, :s32, [1, 3, 2, 4])
      assert_tensor(T.stack([a, b, a], axis: -1), {2, 3}, :s32, [1, 3, 1, 2, 4, 2])
      assert_close(T.stack([a, t([0.5, 1.5], :f64)]), {2, 2}, :f64, [1.0, 2.0, 0.5, 1.5])
    end

    test "squeeze and new_axis" do
      x = T.iota({1, 3, 1}, :s32)
      assert_tensor(T.squeeze(x), {3}, :s32, [0, 1, 2])
      assert_tensor(T.squeeze(x, axes: [0]), {3, 1}, :s32, [0, 1, 2])
      assert_tensor(T.new_axis(T.iota({3}, :s32), 0), {1, 3}, :s32, [0, 1, 2])
      assert_tensor(T.new_axis(T.iota({3}, :s32), -1), {3, 1}, :s32, [0, 1, 2])
    end
  end

  describe "dot" do
    test "vector, matrix, matrix-vector, N-d" do
      assert_tensor(T.dot(t([1, 2, 3], :s32), t([4, 5, 6], :s32)), {}, :s32, [32])
      a = t([[1, 2, 3], [4, 5, 6]], :s32)
      b = t([[7, 8], [9, 10], [11, 12]], :s32)
      assert_tensor(T.dot(a, b), {2, 2}, :s32, [58, 64, 139, 154])
      assert_tensor(T.matmul(a, b), {2, 2}, :s32, [58, 64, 139, 154])
      assert_tensor(T.dot(a, t([1, 2, 3], :s32)), {2}, :s32, [14, 32])
      # {2, 2, 3} . {3, 2}: last axis of a with the second-to-last of b
      x = T.reshape(T.iota({12}, :s32), {2, 2, 3})
      assert_tensor(T.dot(x, b), {2, 2, 2}, :s32, [31, 34, 112, 124, 193, 214, 274, 304])
      assert_close(T.dot(t([1, 2], :s32), t([0.5, 0.25], :f32)), {}, :f32, [1.0])
      assert_tensor(T.dot(a, 2), {2, 3}, :s32, [2, 4, 6, 8, 10, 12])
    end

    test "dot/6 with batch axes" do
      a = T.reshape(T.iota({12}, :s32), {2, 2, 3})
      b = T.reshape(T.iota({12}, :s32), {2, 3, 2})
      # batch 0: [[0,1,2],[3,4,5]] . [[0,1],[2,3],[4,5]]; batch 1: [[6,7,8],[9,10,11]] . [[6,7],[8,9],[10,11]]
      assert_tensor(T.dot(a, [2], [0], b, [1], [0]), {2, 2, 2}, :s32, [10, 13, 28, 40, 172, 193, 244, 274])
      # contracting two axes at once: full inner product
      assert_tensor(T.dot(a, [1, 2], [], a, [1, 2], []), {2, 2}, :s32, [55, 145, 145, 451])

      assert_close(T.dot(T.as_type(a, :f32), [-1], [0], T.as_type(b, :f32), [-2], [0]), {2, 2, 2}, :f32, [
        10.0,
        13.0,
        28.0,
        40.0,
        172.0,
        193.0,
        244.0,
        274.0
      ])
    end

    # Above 2^18 multiply-adds a bf16 dot is computed in bf16 (on CPUs with AVX512-BF16 by the
    # crate's vdpbf16ps kernel). The operands are multiples of 1/4 and 1/8 below 3, so every f32
    # partial sum is exact and the result must be the exact sum rounded once to bf16 (nearest,
    # ties to even), whatever the summation order. A quarter of these sums round differently
    # when truncated, and a quarter are ties.
    test "bf16 products above the f64 accumulation limit round the exact sum once" do
      {bsz, m, k, n} = {2, 37, 131, 70}
      av = fn b, i, p -> (rem(i * 3 + p * 7 + b * 5, 23) - 11) / 4 end
      bv = fn b, p, j -> (rem(p * 5 + j * 3 + b, 29) - 14) / 8 end
      a = for b <- 0..(bsz - 1), do: for(i <- 0..(m - 1), do: for(p <- 0..(k - 1), do: av.(b, i, p)))
      bb = for b <- 0..(bsz - 1), do: for(p <- 0..(k - 1), do: for(j <- 0..(n - 1), do: bv.(b, p, j)))

      exact = fn b, i, j -> Enum.sum(for p <- 0..(k - 1), do: av.(b, i, p) * bv.(b, p, j)) end

      want = for b <- 0..(bsz - 1), i <- 0..(m - 1), j <- 0..(n - 1), do: bf16_round(exact.(b, i, j))

      assert_tensor(T.dot(t(a, :bf16), [2], [0], t(bb, :bf16), [1], [0]), {bsz, m, n}, :bf16, want)

      # batch 0 with both operands read transposed ([k, m] . [n, k], contracting axes 0 and 1)
      at = t(Enum.zip_with(hd(a), & &1), :bf16)
      bt = t(Enum.zip_with(hd(bb), & &1), :bf16)
      want0 = Enum.take(want, m * n)
      assert_tensor(T.dot(at, [0], [], bt, [1], []), {m, n}, :bf16, want0)

      # a NaN in a row of the left operand makes that row NaN; the other rows keep their values
      a_nan = List.update_at(hd(a), 4, &List.replace_at(&1, 9, :nan))
      got = T.dot(t(a_nan, :bf16), t(hd(bb), :bf16)) |> list() |> Enum.chunk_every(n)
      assert Enum.at(got, 4) == List.duplicate(:nan, n)
      assert List.delete_at(got, 4) == List.delete_at(Enum.chunk_every(want0, n), 4)
    end
  end

  # x, exact in f32, rounded to bf16 to nearest with ties to even
  defp bf16_round(x) do
    <<bits::32>> = <<x::float-32>>
    rounded = bits + 0x7FFF + Bitwise.band(Bitwise.bsr(bits, 16), 1)
    <<y::float-32>> = <<Bitwise.bsl(Bitwise.bsr(rounded, 16), 16)::32>>
    y
  end

  describe "conversion, select, clip" do
    test "as_type truncates floats toward zero" do
      x = t([1.7, -1.7, 2.5, -0.5, 100.9], :f32)
      assert_tensor(T.as_type(x, :s32), {5}, :s32, [1, -1, 2, 0, 100])
      assert_tensor(T.as_type(t([3.9, 200.2], :f64), :u8), {2}, :u8, [3, 200])
      assert_tensor(T.as_type(t([1, -2], :s32), :f64), {2}, :f64, [1.0, -2.0])
      assert_tensor(T.as_type(t([1.5, -2.0], :f32), :f16), {2}, :f16, [1.5, -2.0])
      assert_tensor(T.as_type(t([1.5, -2.0], :f32), :bf16), {2}, :bf16, [1.5, -2.0])
      assert_tensor(T.as_type(t([300], :s32), :s64), {1}, :s64, [300])
      assert_tensor(T.as_type(t([0, 3], :s32), :u8), {2}, :u8, [0, 3])
    end

    test "select" do
      pred = t([1, 0, 1], :u8)
      assert_tensor(T.select(pred, t([1, 2, 3], :s32), t([10, 20, 30], :s32)), {3}, :s32, [1, 20, 3])
      assert_close(T.select(pred, 1, 0.5), {3}, :f32, [1.0, 0.5, 1.0])
      assert_tensor(T.select(t([[1], [0]], :u8), t([1, 2], :s16), 0), {2, 2}, :s16, [1, 2, 0, 0])
    end

    test "clip" do
      assert_tensor(T.clip(t([-5, 0, 5], :s32), -1, 1), {3}, :s32, [-1, 0, 1])
      assert_close(T.clip(t([-5, 0, 5], :s32), -0.5, 2.5), {3}, :f32, [-0.5, 0.0, 2.5])
      assert_close(T.clip(t([0.1, 0.9], :f32), t(0.25, :f32), t(0.75, :f32)), {2}, :f32, [0.25, 0.75])
    end
  end
end
