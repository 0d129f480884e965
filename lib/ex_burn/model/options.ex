defmodule ExBurn.Model.Options do
  @moduledoc false
  # Option and value validation for ExBurn.Model: every failure is an ExBurn.Error naming the
  # public operation and the offending option.

  alias ExBurn.Error

  def fail!(op, reason, details \\ %{}), do: raise(Error, op: op, reason: reason, details: details)

  @doc "Checks `opts` is a keyword list whose keys are all in `allowed`; returns it."
  def keyword!(op, opts, allowed) do
    unless is_list(opts) and Keyword.keyword?(opts),
      do: fail!(op, "expected a keyword list of options", %{got: opts})

    case Enum.find(Keyword.keys(opts), &(&1 not in allowed)) do
      nil -> opts
      key -> fail!(op, "unknown option #{inspect(key)}", %{option: key, allowed: allowed})
    end
  end

  def pos_int!(_op, _key, value) when is_integer(value) and value > 0, do: value
  def pos_int!(op, key, value), do: bad!(op, key, value, "a positive integer")

  def number!(op, key, value, opts \\ [])

  def number!(op, key, nil, opts),
    do: if(opts[:nullable], do: nil, else: bad!(op, key, nil, "a number"))

  def number!(op, key, value, opts) when is_number(value) do
    min = Keyword.get(opts, :min, :none)
    max = Keyword.get(opts, :max, :none)

    cond do
      min != :none and value < min -> bad!(op, key, value, "a number >= #{min}")
      max != :none and value >= max -> bad!(op, key, value, "a number < #{max}")
      true -> value * 1.0
    end
  end

  def number!(op, key, value, _opts), do: bad!(op, key, value, "a number")

  def one_of!(op, key, value, choices) do
    if value in choices,
      do: value,
      else: bad!(op, key, value, "one of #{Enum.map_join(choices, ", ", &inspect/1)}")
  end

  def boolean!(_op, _key, value) when is_boolean(value), do: value
  def boolean!(op, key, value), do: bad!(op, key, value, "a boolean")

  @doc "An integer or a tuple/list of positive integers, as the list the NIF takes."
  def sizes!(_op, _key, value) when is_integer(value) and value > 0, do: value

  def sizes!(op, key, value) when is_tuple(value), do: sizes!(op, key, Tuple.to_list(value))

  def sizes!(op, key, value) when is_list(value) and value != [] do
    if Enum.all?(value, &(is_integer(&1) and &1 > 0)),
      do: value,
      else: bad!(op, key, value, "a positive integer or a tuple of them")
  end

  def sizes!(op, key, value), do: bad!(op, key, value, "a positive integer or a tuple of them")

  def bad!(op, key, value, expected),
    do:
      fail!(op, "invalid value for option #{inspect(key)}: expected #{expected}", %{option: key, value: value})
end
