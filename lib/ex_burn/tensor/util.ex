defmodule ExBurn.Tensor.Util do
  @moduledoc false
  # Validation and conversion shared by the ExBurn.Tensor op modules. Everything invalid raises
  # ExBurn.Error naming the public operation.

  import Bitwise, only: [<<<: 2]
  alias ExBurn.{Error, Type}

  # ExBurn.Tensor imports this module, so the struct is written as a map here (no compile-time
  # dependency back on ExBurn.Tensor).
  @tensor ExBurn.Tensor

  @doc "Unwraps a NIF answer; a tensor 4-tuple becomes an %ExBurn.Tensor{}."
  def wrap(answer) do
    case Error.unwrap!(answer) do
      {ref, shape, type, device} when is_reference(ref) ->
        ExBurn.Tensor.Reclaim.note(shape, type)
        %{__struct__: @tensor, ref: ref, shape: shape, type: type, device: device}

      other ->
        raise Error, op: :nif, reason: "NIF did not return a tensor", details: %{answer: other}
    end
  end

  def fail!(op, reason, details \\ %{}), do: raise(Error, op: op, reason: reason, details: details)

  def tensor!(_op, %{__struct__: @tensor, ref: ref} = t) when is_reference(ref), do: t

  def tensor!(op, other),
    do: fail!(op, "expected an ExBurn.Tensor", %{got: other})

  def type!(op, type) do
    Type.normalize(type)
  rescue
    _ in Error -> fail!(op, "unsupported type", %{type: type})
  end

  @doc "Validates a shape (tuple or list of non-negative integers); returns it as a list."
  def shape_list!(op, shape) when is_tuple(shape), do: shape_list!(op, Tuple.to_list(shape))

  def shape_list!(op, shape) when is_list(shape) do
    if Enum.all?(shape, &(is_integer(&1) and &1 >= 0)),
      do: shape,
      else: fail!(op, "invalid shape: dimensions must be non-negative integers", %{shape: shape})
  end

  def shape_list!(op, shape),
    do: fail!(op, "invalid shape: expected a tuple or list of integers", %{shape: shape})

  def size(shape) when is_tuple(shape), do: size(Tuple.to_list(shape))
  def size(shape) when is_list(shape), do: Enum.reduce(shape, 1, &(&1 * &2))

  @doc "A device spec (see `ExBurn.Device`) as `{kind, index}`; nil is the default device."
  def device!(_op, nil), do: ExBurn.default_device()

  def device!(op, spec) do
    ExBurn.Device.resolve(spec)
  rescue
    e in ExBurn.Error -> reraise %{e | op: op}, __STACKTRACE__
  end

  def opts!(op, opts, allowed) do
    if is_list(opts) and Keyword.keyword?(opts) do
      case Keyword.keys(opts) -- allowed do
        [] -> opts
        unknown -> fail!(op, "unknown options", %{options: unknown, allowed: allowed})
      end
    else
      fail!(op, "expected a keyword list of options", %{got: opts})
    end
  end

  @doc """
  The integer option `key` of `opts` (`default` when absent or nil), checked to be positive
  (`min: 1`, the default) or non-negative (`min: 0`); else `ExBurn.Error` naming `op`.
  """
  def int_option!(op, opts, key, default, min \\ 1) do
    case Keyword.get(opts, key) || default do
      n when is_integer(n) and n >= min ->
        n

      other ->
        what = if min == 0, do: "a non-negative integer", else: "a positive integer"
        fail!(op, "#{inspect(key)} must be #{what}", %{option: key, got: other})
    end
  end

  @doc "Resolves a possibly negative axis against `rank`."
  def axis!(op, axis, rank) when is_integer(axis) do
    cond do
      axis >= 0 and axis < rank -> axis
      axis < 0 and axis >= -rank -> rank + axis
      true -> fail!(op, "axis out of range", %{axis: axis, rank: rank})
    end
  end

  def axis!(op, axis, rank), do: fail!(op, "axis must be an integer", %{axis: axis, rank: rank})

  def axes!(op, axes, rank) when is_list(axes) do
    resolved = Enum.map(axes, &axis!(op, &1, rank))

    if length(Enum.uniq(resolved)) == length(resolved),
      do: resolved,
      else: fail!(op, "repeated axes", %{axes: axes})
  end

  def axes!(op, axes, rank), do: fail!(op, "axes must be a list of integers", %{axes: axes, rank: rank})

  @doc "A rank-0 tensor holding `number` as `type` on `device`."
  def scalar(number, type, device) do
    wrap(ExBurn.Native.full(fit(number, type), [], type, device))
  end

  @doc """
  Nx's rule for a number stored in `type`, the one every constant and scalar goes through:
  integers (floats truncated first) wrap into an integer type's range like a cast (two's
  complement); numbers for a float type become floats; `:nan`/`:infinity`/`:neg_infinity` pass.
  """
  def fit(number, {:u, bits}) when is_number(number), do: Integer.mod(trunc(number), 1 <<< bits)

  def fit(number, {:s, bits}) when is_number(number) do
    half = 1 <<< (bits - 1)
    Integer.mod(trunc(number) + half, 1 <<< bits) - half
  end

  def fit(number, {kind, _}) when is_number(number) and kind in [:f, :bf], do: number * 1.0
  def fit(value, _type), do: value

  @doc "Casts `t` to `type` unless it already has it."
  def cast(%{__struct__: @tensor, type: type} = t, type), do: t
  def cast(%{__struct__: @tensor} = t, type), do: wrap(ExBurn.Native.as_type(t.ref, type))
end
