defmodule ExBurn.Tensor.Elementwise do
  @moduledoc """
  Element-wise operations (delegated from `ExBurn.Tensor`).

  Binary ops broadcast their operands (Nx broadcasting) and compute in the operands' merged type
  (`ExBurn.Type.merge/2`, with Elixir numbers as weak operands):

  * arithmetic (#{Enum.map_join(ExBurn.Tensor.Ops.binary_classes().merge, ", ", &"`#{&1}`")})
    return the merged type; `pow` of integers stays integer, `remainder` has the sign of the
    dividend;
  * `divide` and `atan2` return the merged type made floating (integers give `{:f, 32}`);
  * `quotient` (truncating) and the bitwise ops accept integer types only;
  * comparisons and logical ops return `{:u, 8}`.

  Unary math functions on integers return `{:f, 32}`; `abs`, `negate`, `sign`, `floor`, `ceil`,
  `round`, `square` keep the type; `bitwise_not`, `count_leading_zeros`, `population_count` need
  integers; `logical_not`, `is_nan`, `is_infinity` return `{:u, 8}`.
  """

  import ExBurn.Tensor.Util
  alias ExBurn.{Native, Tensor, Type}
  alias ExBurn.Tensor.Ops

  for {rule, ops} <- Ops.binary_classes(), op <- ops do
    @doc "Element-wise `#{op}` with broadcasting (result type rule: `#{rule}`)."
    def unquote(op)(left, right), do: binary(unquote(op), unquote(rule), left, right)
  end

  for {rule, ops} <- Ops.unary_classes(), op <- ops do
    @doc "Element-wise `#{op}` (result type rule: `#{rule}`)."
    def unquote(op)(tensor), do: unary(unquote(op), unquote(rule), tensor)
  end

  defp binary(op, rule, left, right) do
    {left, right, type} = operands!(op, left, right)

    compute_type =
      case rule do
        :floating -> Type.to_floating(type)
        :integer -> integer_type!(op, type)
        _ -> type
      end

    wrap(Native.binary(op, left.ref, right.ref, compute_type))
  end

  defp unary(op, rule, tensor) do
    t = operand!(op, tensor)

    out_type =
      case rule do
        :floating -> Type.to_floating(t.type)
        :integer -> integer_type!(op, t.type)
        :predicate -> {:u, 8}
        :same -> t.type
      end

    wrap(Native.unary(op, t.ref, out_type))
  end

  @doc """
  Picks `on_true` where `pred` is non-zero, else `on_false` (all three broadcast). The result
  type merges `on_true` and `on_false`.
  """
  def select(pred, on_true, on_false) do
    op = :select
    device = first_device([pred, on_true, on_false])
    {on_true, on_false, type} = operands!(op, on_true, on_false, device)
    pred = to_operand!(op, pred, {:u, 8}, device)
    wrap(Native.select(pred.ref, on_true.ref, on_false.ref, type))
  end

  @doc """
  Clamps every element into `[min, max]` (scalars: numbers or rank-0 tensors). The result type
  merges the three types (numbers are weak).
  """
  def clip(tensor, min, max) do
    op = :clip
    t = tensor!(op, tensor)

    for bound <- [min, max], match?(%Tensor{}, bound) and bound.shape != {} do
      fail!(op, "min and max must be scalars", %{shape: bound.shape})
    end

    {_, _, type} = operands!(op, t, min)
    type = merge_operand(type, max)
    [t, min, max] = Enum.map([t, min, max], &to_operand!(op, &1, type, t.device))
    wrap(Native.clip(t.ref, min.ref, max.ref, type))
  end

  ## Operand handling

  # Returns both operands as tensors plus the merged type.
  defp operands!(op, left, right, device \\ nil) do
    device = device || first_device([left, right])

    type =
      case {left, right} do
        {l, r} when is_number(l) and is_number(r) -> Type.merge(Type.infer(l), Type.infer(r))
        {l, r} when is_number(l) -> Type.merge_number(tensor!(op, r).type, l)
        {l, r} when is_number(r) -> Type.merge_number(tensor!(op, l).type, r)
        {l, r} -> Type.merge(tensor!(op, l).type, tensor!(op, r).type)
      end

    {to_operand!(op, left, type, device), to_operand!(op, right, type, device), type}
  end

  defp merge_operand(type, number) when is_number(number), do: Type.merge_number(type, number)
  defp merge_operand(type, %Tensor{type: other}), do: Type.merge(type, other)
  defp merge_operand(_type, other), do: fail!(:clip, "expected an ExBurn.Tensor or a number", %{got: other})

  defp operand!(_op, number) when is_number(number),
    do: scalar(number, Type.infer(number), ExBurn.default_device())

  defp operand!(op, tensor), do: tensor!(op, tensor)

  defp to_operand!(_op, number, type, device) when is_number(number), do: scalar(number, type, device)
  defp to_operand!(op, tensor, _type, _device), do: tensor!(op, tensor)

  defp first_device(operands) do
    Enum.find_value(operands, ExBurn.default_device(), fn
      %Tensor{device: device} -> device
      _ -> nil
    end)
  end

  defp integer_type!(op, type) do
    if Type.integer?(type),
      do: type,
      else: fail!(op, "#{op} expects integer types", %{type: type})
  end
end
