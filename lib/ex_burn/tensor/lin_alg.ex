defmodule ExBurn.Tensor.LinAlg do
  @moduledoc """
  Tensor contraction (`Nx.dot` semantics; delegated from `ExBurn.Tensor`).
  """

  import ExBurn.Tensor.Util
  alias ExBurn.{Native, Type}

  @doc """
  `Nx.dot/2`: with a scalar operand this is `multiply`; otherwise the last axis of `a` is
  contracted with the only axis of a vector `b`, or with the second-to-last axis of `b`.
  """
  def dot(a, b) do
    op = :dot
    a = if is_number(a), do: a, else: tensor!(op, a)
    b = if is_number(b), do: b, else: tensor!(op, b)

    cond do
      is_number(a) or is_number(b) or tuple_size(a.shape) == 0 or tuple_size(b.shape) == 0 ->
        ExBurn.Tensor.multiply(a, b)

      true ->
        rank_a = tuple_size(a.shape)
        rank_b = tuple_size(b.shape)
        contract_b = if rank_b == 1, do: 0, else: rank_b - 2
        dot(a, [rank_a - 1], [], b, [contract_b], [])
    end
  end

  @doc "Matrix product; an alias of `dot/2`."
  def matmul(a, b), do: dot(a, b)

  @doc """
  `Nx.dot/6`: contracts `contract_a` of `a` with `contract_b` of `b`, batching over
  `batch_a`/`batch_b`. The result shape is batch dims ++ free dims of `a` ++ free dims of `b`; the
  type is the merged type.
  """
  def dot(a, contract_a, batch_a, b, contract_b, batch_b) do
    op = :dot
    a = tensor!(op, a)
    b = tensor!(op, b)
    {rank_a, rank_b} = {tuple_size(a.shape), tuple_size(b.shape)}
    contract_a = axes!(op, contract_a, rank_a)
    contract_b = axes!(op, contract_b, rank_b)
    batch_a = axes!(op, batch_a, rank_a)
    batch_b = axes!(op, batch_b, rank_b)

    if length(contract_a) != length(contract_b) or length(batch_a) != length(batch_b),
      do:
        fail!(op, "contraction/batch axes must pair up", %{a: {contract_a, batch_a}, b: {contract_b, batch_b}})

    if Enum.any?(contract_a, &(&1 in batch_a)) or Enum.any?(contract_b, &(&1 in batch_b)),
      do: fail!(op, "an axis cannot be both contracted and batched", %{})

    for {x, y} <- Enum.zip(contract_a ++ batch_a, contract_b ++ batch_b),
        elem(a.shape, x) != elem(b.shape, y) do
      fail!(op, "paired axes must have equal sizes", %{lhs: a.shape, rhs: b.shape, axes: {x, y}})
    end

    type = Type.merge(a.type, b.type)

    precision = ExBurn.Precision.current()
    wrap(Native.dot(a.ref, contract_a, batch_a, b.ref, contract_b, batch_b, type, precision))
  end
end
