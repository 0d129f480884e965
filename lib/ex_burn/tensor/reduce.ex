defmodule ExBurn.Tensor.Reduce do
  @moduledoc """
  Reductions (delegated from `ExBurn.Tensor`).

  `sum`, `product`, `reduce_max`, `reduce_min`, `mean`, `all`, `any` take `axes:` (a list,
  negative axes allowed; default all axes) and `keep_axes:` (default false). Result types follow
  Nx: `sum`/`product` of signed integers give `{:s, 64}`, of unsigned `{:u, 64}`, floats keep
  their type; `mean` is floating; `all`/`any` give `{:u, 8}`; min/max keep the type.

  `argmax`/`argmin` take `axis:` (default: the flattened tensor), `keep_axis:`,
  `tie_break: :low | :high` (default `:low`) and `type:` (default `{:s, 64}`).
  """

  import ExBurn.Tensor.Util
  alias ExBurn.{Native, Type}
  alias ExBurn.Tensor.Ops

  @doc false
  def reductions, do: Ops.reductions()

  for {rule, ops} <- Ops.reduction_classes(), op <- ops do
    @doc "Reduces with `#{op}` over `axes:` (result type rule: `#{rule}`)."
    def unquote(op)(tensor, opts \\ []), do: reduce(unquote(op), unquote(rule), tensor, opts)
  end

  defp reduce(op, rule, tensor, opts) do
    t = tensor!(op, tensor)
    opts = opts!(op, opts, [:axes, :keep_axes])
    axes = if (axes = opts[:axes]) != nil, do: axes!(op, axes, tuple_size(t.shape))
    keep = boolean!(op, :keep_axes, Keyword.get(opts, :keep_axes, false))

    out_type =
      case rule do
        :aggregate -> Type.to_aggregate(t.type)
        :same -> t.type
        :floating -> Type.to_floating(t.type)
        :predicate -> {:u, 8}
      end

    wrap(Native.reduce(op, t.ref, axes, keep, out_type))
  end

  for op <- [:argmax, :argmin] do
    @doc "Index of the #{op |> Atom.to_string() |> String.trim_leading("arg")} element along `axis:`."
    def unquote(op)(tensor, opts \\ []), do: arg_reduce(unquote(op), tensor, opts)
  end

  defp arg_reduce(op, tensor, opts) do
    t = tensor!(op, tensor)
    opts = opts!(op, opts, [:axis, :keep_axis, :tie_break, :type])
    axis = if (axis = opts[:axis]) != nil, do: axis!(op, axis, tuple_size(t.shape))
    keep = boolean!(op, :keep_axis, Keyword.get(opts, :keep_axis, false))
    tie_break = Keyword.get(opts, :tie_break, :low)

    unless tie_break in [:low, :high],
      do: fail!(op, "tie_break must be :low or :high", %{tie_break: tie_break})

    type = type!(op, Keyword.get(opts, :type, {:s, 64}))
    unless Type.integer?(type), do: fail!(op, "type must be an integer type", %{type: type})
    wrap(Native.arg_reduce(op, t.ref, axis, keep, tie_break, type))
  end

  defp boolean!(_op, _name, value) when is_boolean(value), do: value
  defp boolean!(op, name, value), do: fail!(op, "#{name} must be a boolean", %{name => value})
end
