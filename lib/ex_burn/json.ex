defmodule ExBurn.JSON do
  @moduledoc """
  JSON for the core without a Hex package (serde_json inside the NIF): what the mix tasks print,
  the inference server speaks and the tests read.

      iex> ExBurn.JSON.decode!(~s({"a": [1, 2.5, null, true]}))
      %{"a" => [1, 2.5, nil, true]}
      iex> ExBurn.JSON.encode!(%{model: "m", dim: 3})
      ~s({"dim":3,"model":"m"})

  Decoding gives maps with string keys, `nil` for `null`, integers for integral numbers and
  floats for the others. Encoding takes maps (atom, string or integer keys), lists, strings
  (UTF-8), numbers, booleans, `nil` and other atoms (written as strings); tuples, pids and
  invalid UTF-8 are errors. Nesting deeper than 128 levels is refused both ways.
  """

  alias ExBurn.Error

  @doc "Decodes a JSON document."
  @spec decode(binary) :: {:ok, term} | {:error, Error.t()}
  def decode(text) when is_binary(text), do: wrap(ExBurn.Native.json_decode(text))

  def decode(other),
    do: {:error, %Error{op: :json_decode, reason: "JSON text must be a binary", details: %{got: other}}}

  @doc "Like `decode/1`, but raises `ExBurn.Error`."
  @spec decode!(binary) :: term
  def decode!(text), do: bang(decode(text))

  @doc "Encodes `value` as JSON; `pretty: true` indents it."
  @spec encode(term, keyword) :: {:ok, binary} | {:error, Error.t()}
  def encode(value, opts \\ []), do: wrap(ExBurn.Native.json_encode(value, Keyword.get(opts, :pretty, false)))

  @doc "Like `encode/2`, but raises `ExBurn.Error`."
  @spec encode!(term, keyword) :: binary
  def encode!(value, opts \\ []), do: bang(encode(value, opts))

  defp wrap({:ok, _} = ok), do: ok
  defp wrap({:error, {op, reason, details}}), do: {:error, %Error{op: op, reason: reason, details: details}}

  defp bang({:ok, value}), do: value
  defp bang({:error, e}), do: raise(e)
end
