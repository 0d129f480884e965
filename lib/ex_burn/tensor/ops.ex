defmodule ExBurn.Tensor.Ops do
  @moduledoc false
  # The op tables. Functions in ExBurn.Tensor and its op modules are generated from these lists;
  # each list also fixes the op's result type rule (Nx's rules).

  # Binary ops, by result type rule.
  @binary %{
    # merged type of the operands
    merge: [:add, :subtract, :multiply, :pow, :remainder, :max, :min],
    # merged type, made floating
    floating: [:divide, :atan2],
    # merged type, integers only
    integer: [:quotient, :bitwise_and, :bitwise_or, :bitwise_xor, :left_shift, :right_shift],
    # computed in the merged type, result {:u, 8}
    predicate: [
      :equal,
      :not_equal,
      :greater,
      :less,
      :greater_equal,
      :less_equal,
      :logical_and,
      :logical_or,
      :logical_xor
    ]
  }

  # Unary ops, by result type rule.
  @unary %{
    floating: [
      :exp,
      :expm1,
      :log,
      :log1p,
      :sqrt,
      :rsqrt,
      :cbrt,
      :sin,
      :cos,
      :tan,
      :asin,
      :acos,
      :atan,
      :sinh,
      :cosh,
      :tanh,
      :asinh,
      :acosh,
      :atanh,
      :sigmoid,
      :erf,
      :erfc,
      :erf_inv
    ],
    same: [:abs, :negate, :sign, :floor, :ceil, :round, :square],
    integer: [:bitwise_not, :count_leading_zeros, :population_count],
    predicate: [:logical_not, :is_nan, :is_infinity]
  }

  # Reductions, by result type rule.
  @reductions %{
    aggregate: [:sum, :product],
    same: [:reduce_max, :reduce_min],
    floating: [:mean],
    predicate: [:all, :any]
  }

  def binary_classes, do: @binary
  def unary_classes, do: @unary
  def reduction_classes, do: @reductions

  def binary_ops, do: @binary |> Map.values() |> List.flatten()
  def unary_ops, do: @unary |> Map.values() |> List.flatten()
  def reductions, do: @reductions |> Map.values() |> List.flatten()
end
