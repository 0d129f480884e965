defmodule ExBurn.Type do
  @moduledoc """
  Numeric types, written as Nx writes them: `{:s, 8 | 16 | 32 | 64}`, `{:u, 8 | 16 | 32 | 64}`,
  `{:f, 16 | 32 | 64}` and `{:bf, 16}`. Atom shorthands (`:f32`, `:s64`, `:pred`, ...) are accepted
  wherever a type is.

  Type promotion (`merge/2`) follows `Nx.Type.merge/2`: precedence is `f > bf > s > u`; equal kinds
  keep the larger size; unsigned with signed gives a signed type wide enough for the unsigned
  one (`min(2 * unsigned_size, 64)`).
  """

  import Bitwise

  import Kernel, except: [byte_size: 1]

  @type t :: {:s | :u, 8 | 16 | 32 | 64} | {:f, 16 | 32 | 64} | {:bf, 16}

  @types [
    {:s, 8},
    {:s, 16},
    {:s, 32},
    {:s, 64},
    {:u, 8},
    {:u, 16},
    {:u, 32},
    {:u, 64},
    {:f, 16},
    {:f, 32},
    {:f, 64},
    {:bf, 16}
  ]

  @shorthands Map.new(@types, fn {kind, size} = type -> {:"#{kind}#{size}", type} end)
              |> Map.put(:pred, {:u, 8})

  @doc "All supported types."
  @spec all() :: [t]
  def all, do: @types

  @doc """
  Normalises a type or shorthand into a type tuple; raises `ExBurn.Error` for anything else.

      iex> ExBurn.Type.normalize(:bf16)
      {:bf, 16}
      iex> ExBurn.Type.normalize(:pred)
      {:u, 8}
  """
  @spec normalize(term) :: t
  def normalize(type) when type in @types, do: type

  def normalize(type) when is_map_key(@shorthands, type), do: Map.fetch!(@shorthands, type)

  def normalize(type),
    do: raise(ExBurn.Error, op: :type, reason: "unsupported type", details: %{type: type})

  @doc "Size of one element in bytes."
  @spec byte_size(term) :: pos_integer
  def byte_size(type), do: div(elem(normalize(type), 1), 8)

  @doc "True for floating point types (`f` and `bf`)."
  def float?(type), do: elem(normalize(type), 0) in [:f, :bf]

  @doc "True for signed and unsigned integer types."
  def integer?(type), do: elem(normalize(type), 0) in [:s, :u]

  @doc "The floating type used for math functions and division: integers become `{:f, 32}`."
  @spec to_floating(term) :: t
  def to_floating(type) do
    type = normalize(type)
    if float?(type), do: type, else: {:f, 32}
  end

  @doc """
  The type an aggregating reduction (`sum`, `product`) returns: 64-bit for integers, floats unchanged.
  """
  @spec to_aggregate(term) :: t
  def to_aggregate(type) do
    case normalize(type) do
      {:s, _} -> {:s, 64}
      {:u, _} -> {:u, 64}
      float -> float
    end
  end

  @doc """
  Merges two types following Nx's promotion rules.

      iex> ExBurn.Type.merge({:s, 8}, {:u, 8})
      {:s, 16}
      iex> ExBurn.Type.merge({:s, 64}, {:f, 32})
      {:f, 32}
      iex> ExBurn.Type.merge({:f, 32}, {:bf, 16})
      {:f, 32}
  """
  @spec merge(term, term) :: t
  def merge(left, right) do
    case {normalize(left), normalize(right)} do
      {{kind, a}, {kind, b}} ->
        {kind, max(a, b)}

      {l, r} ->
        case Enum.sort_by([l, r], &rank/1) do
          [{:u, unsigned}, {:s, signed}] -> {:s, max(min(unsigned * 2, 64), signed)}
          [_, higher] -> higher
        end
    end
  end

  defp rank({:u, _}), do: 0
  defp rank({:s, _}), do: 1
  defp rank({:bf, _}), do: 2
  defp rank({:f, _}), do: 3

  @doc """
  Merges a tensor type with an Elixir number used as the other operand, as `Nx.Type.merge_number/2`
  does: a float type stays; a float number turns an integer type into `{:f, 32}`; an integer widens
  an integer type only as far as needed to hold it (a negative one makes unsigned types signed).

      iex> ExBurn.Type.merge_number({:u, 8}, 1000)
      {:u, 16}
      iex> ExBurn.Type.merge_number({:u, 8}, -1)
      {:s, 16}
      iex> ExBurn.Type.merge_number({:s, 8}, 1.0)
      {:f, 32}
  """
  @spec merge_number(term, number) :: t
  def merge_number(type, number), do: merge_number_normalized(normalize(type), number)

  defp merge_number_normalized({kind, _} = type, _number) when kind in [:f, :bf], do: type
  defp merge_number_normalized(_int, number) when is_float(number), do: {:f, 32}

  defp merge_number_normalized({:u, size}, number) when number >= 0,
    do: {:u, max(fitting_size(number, :u), size)}

  defp merge_number_normalized({:u, size}, number),
    do: merge_number_normalized({:s, min(size * 2, 64)}, number)

  defp merge_number_normalized({:s, size}, number), do: {:s, max(fitting_size(number, :s), size)}

  # The smallest width of the kind that holds the integer (64 when none does).
  defp fitting_size(number, kind) do
    Enum.find([8, 16, 32], 64, fn bits ->
      case kind do
        :u -> number < 1 <<< bits
        :s -> number >= -(1 <<< (bits - 1)) and number < 1 <<< (bits - 1)
      end
    end)
  end

  @doc "The type Nx infers for a bare number: `{:s, 32}` for integers, `{:f, 32}` for floats."
  @spec infer(number) :: t
  def infer(number) when is_integer(number), do: {:s, 32}
  def infer(number) when is_float(number), do: {:f, 32}

  @doc ~S|Short name such as "f32" or "bf16".|
  def to_string(type) do
    {kind, size} = normalize(type)
    "#{kind}#{size}"
  end
end
