# Tests tagged :nx need the optional Nx dependency (from Hex, or EXBURN_NX_PATH).
exclude = if Code.ensure_loaded?(Nx), do: [], else: [:nx]
ExUnit.start(exclude: exclude)

defmodule ExBurn.TestHelpers do
  @moduledoc false
  import ExUnit.Assertions
  alias ExBurn.Tensor

  def t(data, type), do: Tensor.tensor(data, type: type)

  def list(tensor), do: Tensor.to_flat_list(tensor)

  @doc "Asserts shape, type and exact element values."
  def assert_tensor(tensor, shape, type, values) do
    assert {Tensor.shape(tensor), Tensor.type(tensor)} == {shape, ExBurn.Type.normalize(type)}
    assert list(tensor) == values
    tensor
  end

  @doc "Asserts shape, type and float values within `delta` (non-finite atoms must match exactly)."
  def assert_close(tensor, shape, type, values, delta \\ 1.0e-5) do
    assert {Tensor.shape(tensor), Tensor.type(tensor)} == {shape, ExBurn.Type.normalize(type)}
    got = list(tensor)
    assert length(got) == length(values), "expected #{inspect(values)}, got #{inspect(got)}"

    for {g, e} <- Enum.zip(got, values) do
      if is_atom(e) or is_atom(g),
        do: assert(g == e, "expected #{inspect(values)}, got #{inspect(got)}"),
        else: assert_in_delta(g, e, delta, "expected #{inspect(values)}, got #{inspect(got)}")
    end

    tensor
  end
end
