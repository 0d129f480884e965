defmodule ExBurn.Tensor do
  @moduledoc """
  A tensor held by the native (Burn) side.

  `%ExBurn.Tensor{ref: ref, shape: shape, type: type, device: device}`: `ref` is the NIF resource,
  `shape` a tuple, `type` an Nx type tuple and `device` a `{kind, index}` tuple. The resource is
  freed when the last Elixir reference to it is garbage collected, or right away by
  `deallocate/1`.

  Functions follow Nx's names and semantics (type promotion, broadcasting, axes), so an Nx backend
  can be a thin adapter over this module. Elixir numbers are accepted wherever an element-wise
  operand is: an integer keeps the other operand's type, a float turns an integer operand's result
  into `{:f, 32}`.

  Element-wise ops live in `ExBurn.Tensor.Elementwise`, reductions in `ExBurn.Tensor.Reduce`,
  shape ops in `ExBurn.Tensor.Shape` and `dot` in `ExBurn.Tensor.LinAlg`; they are all
  delegated from here.
  """

  import Bitwise
  import ExBurn.Tensor.Util
  alias ExBurn.{Native, Type}
  alias ExBurn.Tensor.Ops

  @enforce_keys [:ref, :shape, :type, :device]
  defstruct [:ref, :shape, :type, :device]

  @type t :: %__MODULE__{
          ref: reference,
          shape: tuple,
          type: ExBurn.Type.t(),
          device: {atom, non_neg_integer}
        }

  ## Delegation tables: {module, [{name, arity}]}

  @delegates [
    {ExBurn.Tensor.Elementwise,
     Enum.map(Ops.binary_ops(), &{&1, 2}) ++
       Enum.map(Ops.unary_ops(), &{&1, 1}) ++ [select: 3, clip: 3]},
    {ExBurn.Tensor.Reduce, Enum.flat_map(Ops.reductions() ++ [:argmax, :argmin], &[{&1, 1}, {&1, 2}])},
    {ExBurn.Tensor.Shape,
     [
       reshape: 2,
       transpose: 1,
       transpose: 2,
       broadcast: 2,
       broadcast: 3,
       slice: 3,
       slice: 4,
       concatenate: 1,
       concatenate: 2,
       stack: 1,
       stack: 2,
       squeeze: 1,
       squeeze: 2,
       new_axis: 2,
       new_axis: 3
     ]},
    {ExBurn.Tensor.LinAlg, [dot: 2, dot: 6, matmul: 2]}
  ]

  for {module, funs} <- @delegates, {name, arity} <- funs do
    args = Macro.generate_arguments(arity, __MODULE__)
    @doc "See `#{inspect(module)}.#{name}/#{arity}`."
    defdelegate unquote(name)(unquote_splicing(args)), to: module
  end

  ## Creation

  @doc """
  Builds a tensor from a binary in native endianness (the Nx binary layout).

  Options: `:shape` (tuple or list; default a vector of all elements), `:device`.
  """
  def from_binary(binary, type, opts \\ []) do
    op = :from_binary
    type = type!(op, type)
    opts = opts!(op, opts, [:shape, :device])
    unless is_binary(binary), do: fail!(op, "expected a binary", %{got: binary})
    elem_size = Type.byte_size(type)

    shape =
      case Keyword.get(opts, :shape) do
        nil when rem(byte_size(binary), elem_size) == 0 ->
          [div(byte_size(binary), elem_size)]

        nil ->
          fail!(op, "binary size is not a multiple of the element size", %{
            byte_size: byte_size(binary),
            type: type
          })

        shape ->
          shape_list!(op, shape)
      end

    wrap(Native.from_binary(binary, shape, type, device!(op, opts[:device])))
  end

  @doc """
  Builds a tensor from a number or nested lists of numbers (like `Nx.tensor/2`).

  Options: `:type` (default `{:f, 32}` if any element is a float, else `{:s, 32}`), `:device`.
  Floats may also be `:nan`, `:infinity` or `:neg_infinity`.
  """
  def tensor(data, opts \\ []) do
    op = :tensor
    opts = opts!(op, opts, [:type, :device])
    {shape, flat} = flatten!(data)
    type = if t = opts[:type], do: type!(op, t), else: infer_list(flat)
    binary = for x <- flat, into: <<>>, do: encode!(op, x, type)
    from_binary(binary, type, shape: shape, device: opts[:device])
  end

  defp flatten!(number) when is_number(number) or number in [:nan, :infinity, :neg_infinity],
    do: {[], [number]}

  defp flatten!(list) when is_list(list) and list != [] do
    parts = Enum.map(list, &flatten!/1)

    case Enum.uniq(Enum.map(parts, &elem(&1, 0))) do
      [inner] -> {[length(list) | inner], Enum.flat_map(parts, &elem(&1, 1))}
      _ -> fail!(:tensor, "nested lists must be rectangular", %{data: list})
    end
  end

  defp flatten!(other), do: fail!(:tensor, "expected a number or a non-empty nested list", %{got: other})

  defp infer_list(flat) do
    if Enum.any?(flat, &(is_float(&1) or is_atom(&1))), do: {:f, 32}, else: {:s, 32}
  end

  @doc false
  def encode!(_op, x, {:s, bits}) when is_integer(x), do: <<x::signed-native-size(bits)>>
  def encode!(_op, x, {:u, bits}) when is_integer(x), do: <<x::unsigned-native-size(bits)>>
  def encode!(_op, x, {:f, bits}) when is_number(x), do: <<x::float-native-size(bits)>>

  def encode!(_op, x, {:bf, 16}) when is_number(x) do
    <<bits::32>> = <<x::float-32>>
    rounded = (bits + 0x7FFF + (bits >>> 16 &&& 1)) >>> 16
    <<rounded::native-16>>
  end

  def encode!(_op, x, {kind, size}) when x in [:nan, :infinity, :neg_infinity] and kind in [:f, :bf],
    do: special_float(x, {kind, size})

  def encode!(op, x, type), do: fail!(op, "cannot encode value as #{Type.to_string(type)}", %{value: x})

  @specials %{
    {:f, 16} => {0x7E00, 0x7C00, 0xFC00},
    {:bf, 16} => {0x7FC0, 0x7F80, 0xFF80},
    {:f, 32} => {0x7FC00000, 0x7F800000, 0xFF800000},
    {:f, 64} => {0x7FF8000000000000, 0x7FF0000000000000, 0xFFF0000000000000}
  }

  defp special_float(x, {_, size} = type) do
    {nan, inf, neg_inf} = Map.fetch!(@specials, type)
    bits = %{nan: nan, infinity: inf, neg_infinity: neg_inf}[x]
    <<bits::native-size(size)>>
  end

  @doc "A tensor of zeros. Options: `:device`."
  def zeros(shape, type, opts \\ []), do: do_full(:zeros, 0, shape, type, opts)

  @doc "A tensor of ones. Options: `:device`."
  def ones(shape, type, opts \\ []), do: do_full(:ones, 1, shape, type, opts)

  @doc "A tensor filled with `value` (a number, `:nan`, `:infinity` or `:neg_infinity`)."
  def full(value, shape, type, opts \\ []), do: do_full(:full, value, shape, type, opts)

  defp do_full(op, value, shape, type, opts) do
    type = type!(op, type)
    opts = opts!(op, opts, [:device])
    shape = shape_list!(op, shape)

    value =
      cond do
        is_integer(value) and Type.float?(type) -> value * 1.0
        is_integer(value) -> value
        is_float(value) and Type.float?(type) -> value
        value in [:nan, :infinity, :neg_infinity] and elem(type, 0) in [:f, :bf] -> value
        true -> fail!(op, "cannot fill a #{Type.to_string(type)} tensor with this value", %{value: value})
      end

    wrap(Native.full(value, shape, type, device!(op, opts[:device])))
  end

  @doc """
  Counts up from 0 along `:axis` (or over the flattened tensor when no axis is given), like
  `Nx.iota/2`. Options: `:axis` (negative allowed), `:device`.
  """
  def iota(shape, type, opts \\ []) do
    op = :iota
    type = type!(op, type)
    opts = opts!(op, opts, [:axis, :device])
    shape = shape_list!(op, shape)
    axis = if (a = opts[:axis]) != nil, do: axis!(op, a, length(shape))
    wrap(Native.iota(shape, type, axis, device!(op, opts[:device])))
  end

  @doc """
  Identity matrices on the last two axes (`Nx.eye/2`); an integer `n` means `{n, n}`.
  Options: `:device`.
  """
  def eye(shape, type, opts \\ [])
  def eye(n, type, opts) when is_integer(n), do: eye({n, n}, type, opts)

  def eye(shape, type, opts) do
    op = :eye
    type = type!(op, type)
    opts = opts!(op, opts, [:device])
    shape = shape_list!(op, shape)
    if length(shape) < 2, do: fail!(op, "eye needs a shape of rank >= 2", %{shape: shape})
    wrap(Native.eye(shape, type, device!(op, opts[:device])))
  end

  ## Reading back

  @doc """
  The tensor's data as a binary (native endianness). `limit` (an integer or `limit: n`) returns
  only the first `n` elements.
  """
  def to_binary(tensor, limit \\ nil)
  def to_binary(tensor, limit: limit), do: to_binary(tensor, limit)

  def to_binary(tensor, limit) do
    op = :to_binary
    t = tensor!(op, tensor)

    unless limit == nil or (is_integer(limit) and limit >= 0),
      do: fail!(op, "limit must be nil or a non-negative integer", %{limit: limit})

    Native.to_binary(t.ref, limit) |> ExBurn.Error.unwrap!()
  end

  @doc """
  The tensor's elements as a flat list of numbers (`:nan`, `:infinity`, `:neg_infinity` for
  non-finite floats). Options: `:limit`.
  """
  def to_flat_list(tensor, opts \\ []) do
    opts = opts!(:to_flat_list, opts, [:limit])
    t = tensor!(:to_flat_list, tensor)
    decode(to_binary(t, opts[:limit]), t.type)
  end

  @doc false
  def decode(binary, {:s, size}), do: for(<<x::signed-native-size(size) <- binary>>, do: x)
  def decode(binary, {:u, size}), do: for(<<x::unsigned-native-size(size) <- binary>>, do: x)

  def decode(binary, {:bf, 16}),
    do: for(<<x::native-16 <- binary>>, do: decode_float(<<x <<< 16::32>>, {:f, 32}))

  def decode(binary, {:f, size}),
    do: for(<<x::binary-size(div(size, 8)) <- binary>>, do: decode_float(native_to_big(x), {:f, size}))

  defp native_to_big(bin) do
    size = bit_size(bin)
    <<x::native-size(size)>> = bin
    <<x::size(size)>>
  end

  defp decode_float(big, {:f, size}) do
    case big do
      <<x::float-size(size)>> -> x
      _ -> non_finite(big, size)
    end
  end

  defp non_finite(big, size) do
    mantissa_bits = %{16 => 10, 32 => 23, 64 => 52}[size]
    <<sign::1, _exp::size(size - 1 - mantissa_bits), mantissa::size(mantissa_bits)>> = big

    cond do
      mantissa != 0 -> :nan
      sign == 0 -> :infinity
      true -> :neg_infinity
    end
  end

  ## Metadata (no NIF call: the struct carries it)

  @doc "The shape tuple."
  def shape(tensor), do: tensor!(:shape, tensor).shape
  @doc "The type tuple."
  def type(tensor), do: tensor!(:type, tensor).type
  @doc "The `{kind, index}` device."
  def device(tensor), do: tensor!(:device, tensor).device
  @doc "Number of axes."
  def rank(tensor), do: tuple_size(shape(tensor))
  @doc "Number of elements."
  def size(tensor), do: ExBurn.Tensor.Util.size(shape(tensor))

  @doc """
  Frees the tensor's memory now. Returns `:ok`, or `:already_deallocated` the second time (the
  contract of Nx's `Nx.backend_deallocate/1`, which `ExBurn.Backend` answers the same way, and
  of `ExBurn.Model.free/1`); any other use of a deallocated tensor raises `ExBurn.Error`, while
  its shape, type and device stay readable (they live in the struct).
  """
  def deallocate(tensor) do
    Native.deallocate(tensor!(:deallocate, tensor).ref) |> ExBurn.Error.unwrap!()
  end

  ## Conversion

  @doc "Converts to another type (floats to integers truncate toward zero, like Nx)."
  def as_type(tensor, type) do
    t = tensor!(:as_type, tensor)
    wrap(Native.as_type(t.ref, type!(:as_type, type)))
  end

  @doc "Copies the tensor to another device (`:cpu` or `{kind, index}`)."
  def to_device(tensor, device) do
    t = tensor!(:to_device, tensor)
    wrap(Native.to_device(t.ref, device!(:to_device, device)))
  end

  defimpl Inspect do
    def inspect(%{shape: shape, type: type, device: {kind, index}}, _opts) do
      dims = shape |> Tuple.to_list() |> Enum.map_join(&"[#{&1}]")
      "#ExBurn.Tensor<#{ExBurn.Type.to_string(type)}#{dims} #{kind}:#{index}>"
    end
  end
end
