defmodule ExBurn.Tensor.Shape do
  @moduledoc """
  Shape operations (delegated from `ExBurn.Tensor`), with Nx semantics. Shapes may be given as
  tuples or lists and come back as tuples; negative axes count from the end.
  """

  import ExBurn.Tensor.Util
  alias ExBurn.{Native, Type}

  @doc "Same data, new shape (the number of elements must not change)."
  def reshape(tensor, shape) do
    op = :reshape
    t = tensor!(op, tensor)
    new = shape_list!(op, shape)

    if size(new) != size(t.shape),
      do: fail!(op, "cannot reshape: element counts differ", %{from: t.shape, to: List.to_tuple(new)})

    if List.to_tuple(new) == t.shape, do: t, else: wrap(Native.reshape(t.ref, new))
  end

  @doc """
  Permutes the axes: output axis `i` is input axis `axes[i]`. Options: `axes:` (default: reversed).
  A plain list of axes is accepted too.
  """
  def transpose(tensor, opts \\ []) do
    op = :transpose
    t = tensor!(op, tensor)
    rank = tuple_size(t.shape)

    axes =
      if is_list(opts) and opts != [] and Enum.all?(opts, &is_integer/1),
        do: opts,
        else: opts!(op, opts, [:axes])[:axes]

    axes = if axes == nil, do: Enum.to_list((rank - 1)..0//-1), else: axes!(op, axes, rank)

    if Enum.sort(axes) != Enum.to_list(0..(rank - 1)//1),
      do: fail!(op, "axes must be a permutation of all axes", %{axes: axes, rank: rank})

    wrap(Native.transpose(t.ref, axes))
  end

  @doc """
  Broadcasts to `shape`. Options: `axes:` - where input axis `i` lands in the output (default:
  aligned on the right, like Nx). A number broadcasts to a filled tensor.
  """
  def broadcast(tensor, shape, opts \\ [])

  def broadcast(number, shape, opts) when is_number(number) do
    opts = opts!(:broadcast, opts, [:axes])
    if opts[:axes] not in [nil, []], do: fail!(:broadcast, "a number has no axes", %{axes: opts[:axes]})
    ExBurn.Tensor.full(number, shape, Type.infer(number))
  end

  def broadcast(tensor, shape, opts) do
    op = :broadcast
    t = tensor!(op, tensor)
    out = shape_list!(op, shape)
    opts = opts!(op, opts, [:axes])
    in_shape = Tuple.to_list(t.shape)
    {in_rank, out_rank} = {length(in_shape), length(out)}
    if in_rank > out_rank, do: fail!(op, "cannot broadcast to a lower rank", %{from: t.shape, to: shape})

    axes =
      case opts[:axes] do
        nil -> Enum.to_list((out_rank - in_rank)..(out_rank - 1)//1)
        axes -> axes!(op, axes, out_rank)
      end

    if length(axes) != in_rank,
      do: fail!(op, "axes must name one output axis per input axis", %{axes: axes, shape: t.shape})

    for {dim, axis} <- Enum.zip(in_shape, axes), dim != 1 and dim != Enum.at(out, axis) do
      fail!(op, "cannot broadcast shapes", %{from: t.shape, to: List.to_tuple(out), axes: axes})
    end

    wrap(Native.broadcast(t.ref, out, axes, t.type))
  end

  @doc """
  Static slice (`Nx.slice/4`): `start_indices` and `lengths` per axis; starts are clamped so the
  slice fits. Options: `strides:` (an integer or one per axis, default 1).
  """
  def slice(tensor, start_indices, lengths, opts \\ []) do
    op = :slice
    t = tensor!(op, tensor)
    opts = opts!(op, opts, [:strides])
    dims = Tuple.to_list(t.shape)
    rank = length(dims)
    starts = int_list!(op, :start_indices, start_indices, rank)
    lengths = int_list!(op, :lengths, lengths, rank)

    strides =
      case Keyword.get(opts, :strides, 1) do
        s when is_integer(s) -> List.duplicate(s, rank)
        s -> int_list!(op, :strides, s, rank)
      end

    for {len, dim} <- Enum.zip(lengths, dims), len < 0 or len > dim do
      fail!(op, "length out of bounds", %{lengths: lengths, shape: t.shape})
    end

    if Enum.any?(strides, &(&1 < 1)), do: fail!(op, "strides must be positive", %{strides: strides})

    # the NIF clamps the starts (Nx's rule, shared with the backend and compiled programs)
    wrap(Native.slice(t.ref, starts, lengths, strides))
  end

  defp int_list!(op, name, list, rank) do
    if is_list(list) and length(list) == rank and Enum.all?(list, &is_integer/1),
      do: list,
      else: fail!(op, "#{name} must be a list of #{rank} integers", %{name => list})
  end

  @doc "Joins tensors along `axis:` (default 0); types are merged."
  def concatenate(tensors, opts \\ []) do
    op = :concatenate
    {ts, type} = tensor_list!(op, tensors)
    opts = opts!(op, opts, [:axis])
    [first | _] = ts
    rank = tuple_size(first.shape)
    if rank == 0, do: fail!(op, "cannot concatenate scalars", %{})
    axis = axis!(op, Keyword.get(opts, :axis, 0), rank)
    drop = fn t -> t.shape |> Tuple.delete_at(axis) end

    if Enum.any?(ts, &(tuple_size(&1.shape) != rank or drop.(&1) != drop.(first))),
      do: fail!(op, "shapes must match except on the axis", %{shapes: Enum.map(ts, & &1.shape), axis: axis})

    wrap(Native.concatenate(Enum.map(ts, & &1.ref), axis, type))
  end

  @doc "Stacks same-shaped tensors along a new `axis:` (default 0); types are merged."
  def stack(tensors, opts \\ []) do
    op = :stack
    {ts, type} = tensor_list!(op, tensors)
    opts = opts!(op, opts, [:axis])
    [first | _] = ts
    axis = axis!(op, Keyword.get(opts, :axis, 0), tuple_size(first.shape) + 1)

    if Enum.any?(ts, &(&1.shape != first.shape)),
      do: fail!(op, "all shapes must be equal", %{shapes: Enum.map(ts, & &1.shape)})

    wrap(Native.stack(Enum.map(ts, & &1.ref), axis, type))
  end

  defp tensor_list!(op, [_ | _] = list) do
    ts = Enum.map(list, &tensor!(op, &1))
    {ts, ts |> Enum.map(& &1.type) |> Enum.reduce(&Type.merge/2)}
  end

  defp tensor_list!(op, other), do: fail!(op, "expected a non-empty list of tensors", %{got: other})

  @doc "Removes size-1 axes: all of them, or those in `axes:`."
  def squeeze(tensor, opts \\ []) do
    op = :squeeze
    t = tensor!(op, tensor)
    opts = opts!(op, opts, [:axes])
    dims = Tuple.to_list(t.shape)

    axes =
      case opts[:axes] do
        nil -> for {1, i} <- Enum.with_index(dims), do: i
        axes -> axes!(op, axes, length(dims))
      end

    for axis <- axes, Enum.at(dims, axis) != 1 do
      fail!(op, "can only squeeze axes of size 1", %{axis: axis, shape: t.shape})
    end

    new = for {dim, i} <- Enum.with_index(dims), i not in axes, do: dim
    reshape(t, new)
  end

  @doc "Inserts a size-1 axis at `axis` (negative counts from the end of the result)."
  def new_axis(tensor, axis, _name \\ nil) do
    op = :new_axis
    t = tensor!(op, tensor)
    axis = axis!(op, axis, tuple_size(t.shape) + 1)
    reshape(t, t.shape |> Tuple.insert_at(axis, 1))
  end
end
