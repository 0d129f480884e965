defmodule ExBurn.Error do
  @moduledoc """
  The one exception ExBurn raises.

  * `:op` - the operation that failed (an atom such as `:add` or `:from_binary`)
  * `:reason` - a human readable binary
  * `:details` - a map (or keyword list) with the offending values, e.g. `%{lhs: [3, 4], rhs: [5, 6]}`

  Every NIF answers `{:ok, value}` or `{:error, {op, reason, details}}`; `unwrap!/1` turns the
  latter into this exception.
  """
  defexception [:op, :reason, details: %{}]

  @type t :: %__MODULE__{op: atom, reason: String.t(), details: map | keyword}

  @impl true
  def exception(opts) when is_list(opts) do
    %__MODULE__{
      op: Keyword.get(opts, :op, :unknown),
      reason: to_string(Keyword.get(opts, :reason, "unknown error")),
      details: Keyword.get(opts, :details, %{})
    }
  end

  @impl true
  def message(%__MODULE__{op: op, reason: reason, details: details}) do
    base = "ExBurn #{op} failed: #{reason}"
    if details in [nil, %{}, []], do: base, else: base <> " " <> inspect(details)
  end

  @doc """
  Unwraps a NIF answer: `{:ok, value}` gives `value`, `{:error, {op, reason, details}}` raises.
  """
  @spec unwrap!({:ok, term} | {:error, {atom, String.t(), map}}) :: term
  def unwrap!({:ok, value}), do: value

  # Errors Nx itself specifies as ArgumentError (out-of-bounds gather indices, negative shift
  # amounts) keep Nx's type and message, so code written against Nx behaves the same on ExBurn.
  def unwrap!({:error, {_op, reason, %{kind: :argument}}}), do: raise(ArgumentError, reason)

  def unwrap!({:error, {op, reason, details}}),
    do: raise(__MODULE__, op: op, reason: reason, details: details)

  def unwrap!(other),
    do: raise(__MODULE__, op: :nif, reason: "unexpected NIF answer", details: %{answer: other})
end
